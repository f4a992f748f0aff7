// Logging for farmem: spdlog with one default logger; level from FARMEM_LOG (info by default).
#pragma once

#include <spdlog/spdlog.h>

namespace farmem {

// Idempotent; reads FARMEM_LOG=trace|debug|info|warn|error|off.
void InitLogging();

}  // namespace farmem

#define FARMEM_LOG_INFO(...) SPDLOG_INFO(__VA_ARGS__)
#define FARMEM_LOG_WARN(...) SPDLOG_WARN(__VA_ARGS__)
#define FARMEM_LOG_ERROR(...) SPDLOG_ERROR(__VA_ARGS__)
#define FARMEM_LOG_DEBUG(...) SPDLOG_DEBUG(__VA_ARGS__)
