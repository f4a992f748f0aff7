// Logging set-up: level from the FARMEM_LOG environment variable, stderr sink.
#include "common/log.h"

#include <cstdlib>
#include <mutex>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace farmem {

void InitLogging() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto logger = spdlog::stderr_color_mt("farmem");
    spdlog::set_default_logger(logger);
    spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
    const char* lvl = std::getenv("FARMEM_LOG");
    spdlog::set_level(lvl ? spdlog::level::from_str(lvl) : spdlog::level::info);
  });
}

}  // namespace farmem
