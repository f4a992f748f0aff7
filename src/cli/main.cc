// `farmem`: the command-line tool. Subcommands: serve (run a memory server, same as farmemd),
// demo (guided, checked tour of the raw and object APIs), stat (server statistics), mount (remote
// regions over FUSE), regions stat (a mount's .regions/ reports), hold
// (allocate and keep until killed: sessions demo and test), compact
// (one object-store compaction round), cluster (the control plane: members, watch, metadata, a
// local cluster up/down), bench (benchmarks). Exit codes: 0 ok, 1 a check or remote call failed,
// 2 usage error.
#include <cstdio>
#include <cstdlib>

#include <CLI/CLI.hpp>

#include "channels_cli.h"
#include "cli/commands.h"
#include "cli/tx_bank_cmd.h"
#include "cluster_cli.h"
#include "objects_memory_cli.h"
#include "objects_throughput_cli.h"
#include "raw_bench.h"
#include "regions_cli.h"
#include "server/serve.h"
#include "soak_cli.h"
#include "tiered_cli.h"
#include "tx_cli.h"

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

// The control-plane flags of a client command (the farmemd ones are in server/serve_config.cc).
CLI::Option* AddClusterFlags(CLI::App& cmd, farmem::cli::ClusterClientOptions& c,
                             const std::string& url_help) {
  CLI::Option* url = cmd.add_option("--cluster", c.url, url_help);
  cmd.add_option("--cluster-name", c.name, "cluster within the control plane")
      ->capture_default_str();
  cmd.add_option("--cluster-user", c.user, "etcd user");
  cmd.add_option("--cluster-password", c.password, "etcd password (env FARMEM_CLUSTER_PASSWORD)");
  cmd.add_option("--cluster-ca", c.ca, "etcd TLS: CA certificate file");
  cmd.add_option("--cluster-cert", c.cert, "etcd TLS: client certificate file");
  cmd.add_option("--cluster-key", c.key, "etcd TLS: client key file");
  return url;
}

// --cluster-password flag > FARMEM_CLUSTER_PASSWORD; with `env_url`, --cluster > FARMEM_CLUSTER.
void ApplyClusterEnv(CLI::App& cmd, farmem::cli::ClusterClientOptions& c, bool env_url) {
  if (cmd.get_option("--cluster-password")->count() == 0) {
    if (const char* env = std::getenv("FARMEM_CLUSTER_PASSWORD")) c.password = env;
  }
  if (env_url && c.url.empty()) {
    if (const char* env = std::getenv("FARMEM_CLUSTER")) c.url = env;
  }
}

int Usage(const std::string& message) {
  std::fprintf(stderr, "farmem: error: %s (see --help)\n", message.c_str());
  return farmem::kExitUsage;
}

// True when the given cluster-only flags (other than --cluster) came without --cluster.
bool ClusterFlagsWithoutUrl(CLI::App& cmd, const farmem::cli::ClusterClientOptions& c) {
  if (!c.url.empty()) return false;
  for (const char* f : {"--cluster-name", "--cluster-user", "--cluster-password", "--cluster-ca",
                        "--cluster-cert", "--cluster-key"}) {
    if (cmd.get_option(f)->count() > 0) return true;
  }
  return false;
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
  AddClusterFlags(*demo, demo_opts.cluster,
                  "run against the memory members of this cluster (etcd://HOST:PORT) instead");

  farmem::cli::StatOptions stat_opts;
  CLI::App* stat =
      app.add_subcommand("stat", "print a farmemd's pools, allocations and RPC counts");
  AddClientFlags(*stat, stat_opts.client);
  stat->add_option("address", stat_opts.address,
                   "farmemd bootstrap HOST:PORT (with --cluster: a member name; none = all)");
  stat->add_flag("--json", stat_opts.json, "print the raw STAT JSON");
  AddClusterFlags(*stat, stat_opts.cluster,
                  "find the server(s) in this cluster (env FARMEM_CLUSTER when no address)");

  farmem::cli::HoldOptions hold_opts;
  CLI::App* hold = app.add_subcommand(
      "hold", "allocate objects and raw ranges on a farmemd and keep them until killed");
  AddClientFlags(*hold, hold_opts.client);
  hold->add_option("address", hold_opts.address, "farmemd bootstrap HOST:PORT")->required();
  hold->add_option("--objects", hold_opts.objects, "objects to allocate")->capture_default_str();
  hold->add_option("--object-size", hold_opts.object_size, "bytes per object")
      ->capture_default_str();
  hold->add_option("--raw", hold_opts.raw_count, "raw ranges to allocate")->capture_default_str();
  hold->add_option("--raw-bytes", hold_opts.raw_bytes, "bytes per raw range")
      ->capture_default_str();
  hold->add_flag("--persistent", hold_opts.persistent,
                 "allocate persistent (survive this process) instead of in the session");
  hold->add_option("--session-ttl-ms", hold_opts.session_ttl_ms,
                   "session lease to ask for (the server grants 1 s .. --session-ttl-max)")
      ->capture_default_str();
  hold->add_option("--seconds", hold_opts.seconds, "hold this long, then exit (0 = until killed)")
      ->capture_default_str();

  farmem::RegionFsOptions mount_opts;
  uint64_t mount_memory_mib = 1024;
  CLI::App* mount = app.add_subcommand(
      "mount", "mount remote regions (files whose bytes live in farmemd memory) with FUSE");
  mount->add_option("dir", mount_opts.mountpoint, "mount point (an existing directory)")
      ->required();
  mount->add_option("--cluster", mount_opts.cluster_url,
                    "metadata store URL (default: memory://regions in this process)");
  mount->add_option("--cluster-name", mount_opts.cluster_name, "cluster within the store")
      ->capture_default_str();
  mount->add_option("--server", mount_opts.servers,
                    "farmemd bootstrap HOST:PORT, repeatable (none: an embedded memory server)");
  mount->add_option("--token", mount_opts.token, "cluster token of --server (env FARMEM_TOKEN)");
  mount->add_option("--memory-mib", mount_memory_mib, "budget of the embedded memory server")
      ->capture_default_str();
  mount->add_option("--threads", mount_opts.threads, "FUSE worker threads at most (1..64)")
      ->capture_default_str();
  mount->add_flag("--debug", mount_opts.debug, "log every FUSE request on stderr");
  mount
      ->add_option("--op-timeout", mount_opts.op_timeout_ms,
                   "ms a transfer or RPC to a farmemd may take before the call fails with EIO "
                   "(100..30000)")
      ->check(CLI::Range(100u, 30000u))
      ->capture_default_str();
  mount
      ->add_option("--meta-timeout", mount_opts.meta_timeout_ms,
                   "ms a metadata (etcd) call may take before the change fails with EIO "
                   "(100..30000)")
      ->check(CLI::Range(100u, 30000u))
      ->capture_default_str();

  std::string regions_stat_mount;
  CLI::App* regions = app.add_subcommand("regions", "remote regions tools");
  regions->require_subcommand(1);
  CLI::App* regions_stat = regions->add_subcommand(
      "stat",
      "print a regions mount's .regions/ reports (hosts, memory, pools, open, files; root)");
  regions_stat->add_option("--mount", regions_stat_mount,
                           "the mount point (default: every fuse.regions mount)");

  farmem::cli::CompactOptions compact_opts;
  uint16_t compact_class = 0;
  CLI::App* compact =
      app.add_subcommand("compact", "run one compaction round of a farmemd's object store");
  AddClientFlags(*compact, compact_opts.client);
  compact->add_option("address", compact_opts.address,
                      "farmemd bootstrap HOST:PORT (with --cluster: a member name; none = all)");
  AddClusterFlags(*compact, compact_opts.cluster,
                  "find the server(s) in this cluster (env FARMEM_CLUSTER when no address)");
  CLI::Option* compact_class_opt =
      compact->add_option("--class", compact_class, "only this size class (default: all)")
          ->check(CLI::Range(0, 65534));

  // farmem cluster ...: the control plane. Every subcommand takes the cluster flags and --json.
  CLI::App* cluster = app.add_subcommand("cluster",
                                         "the control plane: members, events, "
                                         "metadata, a local cluster");
  cluster->require_subcommand(1);
  farmem::cli::ClusterCmdOptions cl;
  auto cluster_cmd = [&](const char* name, const char* help) {
    CLI::App* c = cluster->add_subcommand(name, help);
    AddClusterFlags(*c, cl.cluster, "control plane: etcd://HOST:PORT[,...] (env FARMEM_CLUSTER)");
    c->add_flag("--json", cl.json, "machine-readable output");
    return c;
  };
  CLI::App* cl_members = cluster_cmd("members", "the live members, with memory used from STAT");
  AddClientFlags(*cl_members, cl.client);
  CLI::App* cl_watch =
      cluster_cmd("watch", "print member joins, leaves and expiries as they happen");
  cl_watch->add_option("--count", cl.count, "exit after N changes")->check(CLI::PositiveNumber);
  cl_watch
      ->add_option("--timeout", cl.timeout_seconds, "exit after S seconds (with --count: exit 1)")
      ->check(CLI::PositiveNumber);
  CLI::App* cl_get = cluster_cmd("get", "print a metadata key's value");
  cl_get->add_option("key", cl.key, "key")->required();
  CLI::App* cl_put = cluster_cmd("put", "write a metadata key");
  cl_put->add_option("key", cl.key, "key")->required();
  CLI::Option* cl_put_value = cl_put->add_option("value", cl.value, "value");
  CLI::Option* cl_put_file = cl_put->add_option("--file", cl.value_file, "read the value from F");
  cl_put_value->excludes(cl_put_file);
  CLI::App* cl_list = cluster_cmd("list", "list metadata keys (and values) under a prefix");
  cl_list->add_option("prefix", cl.key, "key prefix (default: all)");
  CLI::App* cl_remove = cluster_cmd("remove", "delete a metadata key");
  cl_remove->add_option("key", cl.key, "key")->required();

  farmem::cli::ClusterUpOptions up_opts;
  CLI::App* cl_up = cluster->add_subcommand(
      "up", "start a local cluster: etcd and N farmemds on loopback, detached, under DIR");
  cl_up->add_option("--nodes", up_opts.nodes, "farmemd processes")->capture_default_str();
  cl_up->add_option("--dir", up_opts.dir, "directory for cluster.json, logs and etcd data")
      ->required();
  cl_up->add_option("--base-port", up_opts.base_port,
                    "etcd client P, peer P+1, node K bootstrap P+2K, data P+2K+1 (default: free "
                    "ports)");
  cl_up->add_option("--etcd", up_opts.etcd, "etcd binary (default: $FARMEM_ETCD, PATH, /usr/bin)");
  cl_up->add_option("--farmemd", up_opts.farmemd, "farmemd binary (default: next to farmem)");
  cl_up->add_option("--cluster-name", up_opts.cluster_name, "cluster name")->capture_default_str();
  cl_up->add_option("--cluster-ttl", up_opts.ttl_seconds, "membership lease of each farmemd (s)")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600));
  cl_up->add_option("--memory-mib", up_opts.memory_mib, "memory budget of each farmemd")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cl_up
      ->add_option("--farmemd-arg", up_opts.farmemd_args,
                   "extra flag for every farmemd (repeatable, e.g. --farmemd-arg=--workers=2)")
      ->allow_extra_args(false);
  cl_up->add_option("--wait", up_opts.wait_seconds, "bound on the whole start (s)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  std::string down_dir;
  double down_wait = 10;
  CLI::App* cl_down = cluster->add_subcommand(
      "down", "stop the cluster `farmem cluster up --dir DIR` started (farmemds, then etcd)");
  cl_down->add_option("--dir", down_dir, "the directory given to up")->required();
  cl_down->add_option("--wait", down_wait, "seconds to wait after SIGTERM before SIGKILL")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);

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
  farmem::ClusterBenchOptions cluster_bench_opts;
  CLI::App* cluster_bench = farmem::AddClusterBenchCommand(*bench, cluster_bench_opts);
  farmem::SoakBenchOptions soak_opts;
  CLI::App* soak = farmem::AddSoakBenchCommand(*bench, soak_opts);
  farmem::SoakChildOptions soak_child_opts;
  CLI::App* soak_child = farmem::AddSoakChildCommand(*bench, soak_child_opts);
  farmem::TxBenchOptions tx_bench_opts;
  CLI::App* tx_bench = farmem::AddTxBenchCommand(*bench, tx_bench_opts);
  farmem::cli::TxBankOptions tx_bank_opts;
  CLI::App* tx_bank = farmem::cli::AddTxBankCommand(*bench, tx_bank_opts);
  AddClientFlags(*tx_bank, tx_bank_opts.client);
  AddClusterFlags(*tx_bank, tx_bank_opts.cluster,
                  "control plane: find the tx servers among its members (instead of --connect)");
  farmem::ChannelsBenchOptions channels_opts;
  CLI::App* channels_bench = farmem::AddChannelsBenchCommand(*bench, channels_opts);
  farmem::ChannelsNodeOptions channels_node_opts;
  CLI::App* channels_node = farmem::AddChannelsNodeCommand(*bench, channels_node_opts);
  farmem::TieredBenchOptions tiered_opts;
  CLI::App* tiered = farmem::AddTieredBenchCommand(*bench, tiered_opts);
  farmem::RegionsBenchOptions regions_bench_opts;
  CLI::App* regions_bench = farmem::AddRegionsBenchCommand(*bench, regions_bench_opts);

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
    ApplyClusterEnv(*demo, demo_opts.cluster, /*env_url=*/false);
    if (!demo_opts.cluster.url.empty() && !demo_opts.connect.empty()) {
      return Usage("demo takes --connect or --cluster, not both");
    }
    if (ClusterFlagsWithoutUrl(*demo, demo_opts.cluster))
      return Usage("--cluster-* need --cluster");
    return farmem::cli::RunDemo(demo_opts);
  }
  // stat/compact: an address, or --cluster (else FARMEM_CLUSTER) with an optional member name.
  auto check_target = [](CLI::App& cmd, std::string& address,
                         farmem::cli::ClusterClientOptions& c) -> int {
    const bool explicit_url = !c.url.empty();
    // FARMEM_CLUSTER stands in for --cluster unless an address (HOST:PORT) was given.
    ApplyClusterEnv(cmd, c, /*env_url=*/address.find(':') == std::string::npos);
    if (c.url.empty()) {
      if (ClusterFlagsWithoutUrl(cmd, c)) return Usage("--cluster-* need --cluster");
      if (address.empty()) return Usage("give a server HOST:PORT or --cluster URL");
      return 0;
    }
    if (explicit_url && address.find(':') != std::string::npos) {
      return Usage("--cluster takes a member name, not an address ('" + address +
                   "'): give one or the other");
    }
    return 0;
  };
  if (stat->parsed()) {
    ApplyTokenEnv(*stat, stat_opts.client);
    if (int rc = check_target(*stat, stat_opts.address, stat_opts.cluster)) return rc;
    return farmem::cli::RunStat(stat_opts);
  }
  if (mount->parsed()) {
    if (mount->get_option("--token")->count() == 0) {
      if (const char* env = std::getenv("FARMEM_TOKEN")) mount_opts.token = env;
    }
    if (mount_memory_mib == 0 || mount_memory_mib > (1u << 20))
      return Usage("--memory-mib must be 1..1048576");
    mount_opts.memory_bytes = mount_memory_mib << 20;
    return farmem::cli::RunMount(mount_opts);
  }
  if (regions_stat->parsed()) return farmem::cli::RunRegionsStat(regions_stat_mount);
  if (hold->parsed()) {
    ApplyTokenEnv(*hold, hold_opts.client);
    return farmem::cli::RunHold(hold_opts);
  }
  if (compact->parsed()) {
    ApplyTokenEnv(*compact, compact_opts.client);
    if (int rc = check_target(*compact, compact_opts.address, compact_opts.cluster)) return rc;
    if (compact_class_opt->count() > 0) compact_opts.size_class = compact_class;
    return farmem::cli::RunCompact(compact_opts);
  }
  if (cluster->parsed()) {
    if (cl_up->parsed()) return farmem::cli::RunClusterUp(up_opts);
    if (cl_down->parsed()) return farmem::cli::RunClusterDown(down_dir, down_wait);
    for (CLI::App* c : {cl_members, cl_watch, cl_get, cl_put, cl_list, cl_remove}) {
      if (!c->parsed()) continue;
      ApplyClusterEnv(*c, cl.cluster, /*env_url=*/true);
      if (cl.cluster.url.empty()) {
        return Usage("farmem cluster " + c->get_name() +
                     " needs --cluster URL (or FARMEM_CLUSTER in the environment)");
      }
    }
    if (cl_members->parsed()) {
      ApplyTokenEnv(*cl_members, cl.client);
      return farmem::cli::RunClusterMembers(cl);
    }
    if (cl_watch->parsed()) return farmem::cli::RunClusterWatch(cl);
    if (cl_get->parsed()) return farmem::cli::RunClusterGet(cl);
    if (cl_put->parsed()) {
      if (cl_put_value->count() == 0 && cl_put_file->count() == 0) {
        return Usage("farmem cluster put needs a VALUE or --file F");
      }
      return farmem::cli::RunClusterPut(cl);
    }
    if (cl_list->parsed()) return farmem::cli::RunClusterList(cl);
    if (cl_remove->parsed()) return farmem::cli::RunClusterRemove(cl);
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
  if (cluster_bench->parsed()) return farmem::RunClusterBench(cluster_bench_opts);
  if (soak->parsed()) return farmem::RunSoakBench(soak_opts);
  if (soak_child->parsed()) return farmem::RunSoakChild(soak_child_opts);
  if (tx_bench->parsed()) return farmem::RunTxBench(tx_bench_opts);
  if (tx_bank->parsed()) {
    ApplyTokenEnv(*tx_bank, tx_bank_opts.client);
    ApplyClusterEnv(*tx_bank, tx_bank_opts.cluster, /*env_url=*/false);
    if (tx_bank_opts.connect.empty() == tx_bank_opts.cluster.url.empty()) {
      return Usage("bench tx-bank: give either --connect or --cluster");
    }
    if (ClusterFlagsWithoutUrl(*tx_bank, tx_bank_opts.cluster)) {
      return Usage("bench tx-bank: --cluster-* flags need --cluster");
    }
    return farmem::cli::RunTxBank(tx_bank_opts);
  }
  if (channels_bench->parsed()) return farmem::RunChannelsBench(channels_opts);
  if (channels_node->parsed()) return farmem::RunChannelsNode(channels_node_opts);
  if (tiered->parsed()) return farmem::RunTieredBench(tiered_opts);
  if (regions_bench->parsed()) return farmem::RunRegionsBench(regions_bench_opts);
  std::fprintf(stderr, "farmem: error: no command given (see --help)\n");
  return farmem::kExitUsage;
}
