// `farmem`: the command-line tool. Subcommands: serve (run a memory server, same as farmemd),
// demo (guided, checked tour of the raw and object APIs), stat (server statistics), compact
// (one object-store compaction round), bench (benchmarks). Exit codes: 0 ok, 1 a check or remote
// call failed, 2 usage error.
#include <cstdio>
#include <cstdlib>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "objects_memory_cli.h"
#include "objects_throughput_cli.h"
#include "raw_bench.h"
#include "server/serve.h"

namespace {

void AddClientFlags(CLI::App& cmd, farmem::cli::ClientOptions& c) {
  cmd.add_option("--token", c.token, "cluster token (env FARMEM_TOKEN)");
  cmd.add_option("--backend", c.backend, "transport: tcp | fabric (must match the server)")
      ->capture_default_str();
  cmd.add_option("--provider", c.provider, "libfabric provider: shm | \"tcp;ofi_rxm\" | ...")
      ->capture_default_str();
  cmd.add_option("--data-host", c.data_host, "IP this client's transport listens on")
      ->capture_default_str();
}

// --token flag > FARMEM_TOKEN > default.
void ApplyTokenEnv(CLI::App& cmd, farmem::cli::ClientOptions& c) {
  if (cmd.get_option("--token")->count() == 0) {
    if (const char* env = std::getenv("FARMEM_TOKEN")) c.token = env;
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"farmem: disaggregated memory tools"};
  app.require_subcommand(1);

  farmem::ServeFlags serve_flags;
  CLI::App* serve = app.add_subcommand("serve", "run a memory server (same as farmemd)");
  farmem::AddServeFlags(*serve, serve_flags);

  farmem::cli::DemoOptions demo_opts;
  CLI::App* demo = app.add_subcommand(
      "demo",
      "alloc, write/read, CAS, FAA x16, STAT, free and double free, each checked and timed");
  AddClientFlags(*demo, demo_opts.client);
  demo->add_option("--connect", demo_opts.connect,
                   "run against running farmemd HOST:PORT (repeatable) instead of an embedded one");

  farmem::cli::StatOptions stat_opts;
  CLI::App* stat =
      app.add_subcommand("stat", "print a farmemd's pools, allocations and RPC counts");
  AddClientFlags(*stat, stat_opts.client);
  stat->add_option("address", stat_opts.address, "farmemd bootstrap HOST:PORT")->required();
  stat->add_flag("--json", stat_opts.json, "print the raw STAT JSON");

  farmem::cli::CompactOptions compact_opts;
  uint16_t compact_class = 0;
  CLI::App* compact =
      app.add_subcommand("compact", "run one compaction round of a farmemd's object store");
  AddClientFlags(*compact, compact_opts.client);
  compact->add_option("address", compact_opts.address, "farmemd bootstrap HOST:PORT")->required();
  CLI::Option* compact_class_opt =
      compact->add_option("--class", compact_class, "only this size class (default: all)")
          ->check(CLI::Range(0, 65534));

  farmem::RawBenchOptions bench_opts;
  CLI::App* bench = app.add_subcommand("bench", "benchmarks");
  bench->require_subcommand(1);
  CLI::App* raw =
      bench->add_subcommand("raw", "one-sided ops and RPC latency/throughput per backend");
  std::vector<std::string> backends;
  std::vector<int> inflight;
  raw->add_option("--backend", backends, "tcp | fabric:<provider> (repeatable; default: all)");
  raw->add_option("--seconds", bench_opts.seconds, "measurement time per case (--quick: 0.5)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  raw->add_option("--rounds", bench_opts.rounds,
                  "interleaved rounds per case (each round runs every case once)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  raw->add_flag("--quick", bench_opts.quick, "shorter run: 0.5 s per case");
  raw->add_option("--inflight", inflight, "operations in flight (repeatable; default 1 and 16)")
      ->check(CLI::Range(1, 4096));
  raw->add_option("--json", bench_opts.json_path, "JSON result file (\"\" = none)")
      ->capture_default_str();
  farmem::ObjectsThroughputOptions objects_tp_opts;
  CLI::App* objects_tp = farmem::AddObjectsThroughputBenchCommand(*bench, objects_tp_opts);
  farmem::ObjectsCompactionOptions objects_cp_opts;
  CLI::App* objects_cp = farmem::AddObjectsCompactionBenchCommand(*bench, objects_cp_opts);
  farmem::ObjectsMemoryBenchOptions objects_memory_opts;
  CLI::App* objects_memory = farmem::AddObjectsMemoryBenchCommand(*bench, objects_memory_opts);

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "farmem: error: %s (see --help)\n", e.what());
    return farmem::kExitUsage;
  }

  if (serve->parsed()) return farmem::RunServe(serve_flags, "farmem serve");
  if (demo->parsed()) {
    ApplyTokenEnv(*demo, demo_opts.client);
    return farmem::cli::RunDemo(demo_opts);
  }
  if (stat->parsed()) {
    ApplyTokenEnv(*stat, stat_opts.client);
    return farmem::cli::RunStat(stat_opts);
  }
  if (compact->parsed()) {
    ApplyTokenEnv(*compact, compact_opts.client);
    if (compact_class_opt->count() > 0) compact_opts.size_class = compact_class;
    return farmem::cli::RunCompact(compact_opts);
  }
  if (raw->parsed()) {
    if (!backends.empty()) bench_opts.backends = backends;
    if (!inflight.empty()) bench_opts.inflight = inflight;
    if (bench_opts.quick && raw->count("--seconds") == 0) bench_opts.seconds = 0.5;
    return farmem::RunRawBench(bench_opts);
  }
  if (objects_tp->parsed()) return farmem::RunObjectsThroughputBench(objects_tp_opts);
  if (objects_cp->parsed()) return farmem::RunObjectsCompactionBench(objects_cp_opts);
  if (objects_memory->parsed()) return farmem::RunObjectsMemoryBench(objects_memory_opts);
  std::fprintf(stderr, "farmem: error: no command given (see --help)\n");
  return farmem::kExitUsage;
}
