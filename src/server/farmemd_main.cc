// farmemd: the farmem memory server daemon. Thin wrapper over RunServe (shared with
// `farmem serve`): parse flags, run until SIGTERM/SIGINT, exit 0; usage errors exit 2.
#include <cstdio>

#include <CLI/CLI.hpp>

#include "server/serve.h"

int main(int argc, char** argv) {
  CLI::App app{
      "farmemd: farmem memory server (exports memfd pools, serves ALLOC_RAW/FREE_RAW/STAT)"};
  farmem::ServeFlags flags;
  farmem::AddServeFlags(app, flags);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "farmemd: error: %s (see --help)\n", e.what());
    return farmem::kExitUsage;
  }
  return farmem::RunServe(flags, "farmemd");
}
