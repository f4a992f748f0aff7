// farmemd / `farmem serve` run loop: create and start the MemoryServer, optional metrics endpoint,
// join the cluster (--cluster), print the ready line, wait for SIGTERM/SIGINT, leave the cluster
// and shut down gracefully. Startup problems (bad flags, bad config, an address that cannot be
// bound, a control plane that cannot be reached) are one stderr line with exit code 2.
#include "server/serve.h"

#include <signal.h>
#include <time.h>

#include <cstdio>

#include <nlohmann/json.hpp>

#include "common/log.h"
#include "server/metrics_http.h"

namespace farmem {

Result<std::unique_ptr<ClusterWatch>> EndSessionsOfExpiredMembers(Cluster& cluster,
                                                                  MemoryServer& server) {
  // Callbacks come one at a time on a thread of the Cluster's; ending sessions frees memory
  // there (bounded by the services' own timeouts). A leave is not an expiry: a client that
  // leaves on purpose closes its sessions itself (or they follow their own lease).
  return cluster.watch_members([&server](const ClusterMemberEvent& e) {
    if (e.type != ClusterMemberEvent::Type::kExpire) return;
    const size_t n = server.end_member_sessions(e.member.name);
    if (n > 0) {
      FARMEM_LOG_INFO("cluster: member '{}' expired: ended its {} client session(s)", e.member.name,
                      n);
    }
  });
}

int RunServe(ServeFlags& flags, std::string_view prog) {
  InitLogging();
  auto fail = [&](const Status& st, int code) {
    std::fprintf(stderr, "%.*s: error: %s\n", static_cast<int>(prog.size()), prog.data(),
                 st.ToString().c_str());
    return code;
  };
  Result<ServerConfig> config = ResolveServeConfig(flags);
  if (!config.ok()) return fail(config.status(), kExitUsage);

  // Block the shutdown signals before any thread exists so that only sigtimedwait() below sees
  // them; the old mask is restored on return (`farmem serve` runs in a longer-lived process).
  sigset_t signals, old_mask;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, &old_mask);
  struct RestoreMask {
    sigset_t mask;
    ~RestoreMask() { pthread_sigmask(SIG_SETMASK, &mask, nullptr); }
  } restore{old_mask};

  // Declared before the server so that it is destroyed after it: the server's STAT section reads
  // it until the server is gone.
  std::unique_ptr<Cluster> cluster;
  auto server = MemoryServer::Create(*config);
  if (!server.ok()) return fail(server.status(), kExitUsage);
  if (Status st = (*server)->start(); !st.ok()) return fail(st, kExitUsage);
  MemoryServer& srv = **server;

  // Shared: the STAT section below holds a weak reference, so a STAT racing an early return
  // (which destroys this before the server) never reads a destroyed endpoint.
  std::shared_ptr<MetricsHttpServer> metrics;
  if (flags.options.metrics_port >= 0) {
    auto m = MetricsHttpServer::Start(
        config->node.bootstrap_host, static_cast<uint16_t>(flags.options.metrics_port),
        [&srv] { return srv.metrics_text(); }, flags.options.metrics_limits);
    if (!m.ok()) return fail(m.status(), kExitUsage);
    metrics = std::move(*m);
    FARMEM_LOG_INFO("metrics: http://{}:{}/metrics", config->node.bootstrap_host, metrics->port());
    srv.set_stats_section("metrics_http", [weak = std::weak_ptr(metrics)] {
      const auto m = weak.lock();
      if (!m) return std::string("{}");
      const MetricsHttpStats s = m->stats();
      return nlohmann::json{{"port", m->port()},        {"served", s.served},
                            {"timed_out", s.timed_out}, {"evicted", s.evicted},
                            {"malformed", s.malformed}, {"accept_backoffs", s.accept_backoffs}}
          .dump();
    });
  }

  if (!flags.options.cluster_url.empty()) {
    // After the server listens: a member's address must answer by the time others see it.
    // Open and join are each bounded by the call timeout, so an unreachable store is an error
    // within seconds, never a hang.
    const ClusterOptions copts = ServeClusterOptions(flags.options);
    auto opened = Cluster::Open(copts);
    if (!opened.ok()) {
      return fail(opened.status().WithContext("cluster " + copts.url), kExitUsage);
    }
    cluster = std::move(*opened);
    ClusterMember self;
    self.name = config->node.name;
    self.address = ClusterAdvertiseAddress(flags.options, srv.node().bootstrap_address());
    self.roles = ClusterMemberRoles(srv.services());
    self.capacity_bytes = config->memory_bytes;
    if (Status st = cluster->join(self); !st.ok()) {
      return fail(st.WithContext("joining cluster '" + copts.cluster_name + "' at " + copts.url),
                  kExitUsage);
    }
    FARMEM_LOG_INFO("cluster: joined '{}' at {} as '{}' ({}, lease {} s)", copts.cluster_name,
                    copts.url, self.name, self.address, flags.options.cluster_ttl_seconds);
    Cluster* c = cluster.get();
    srv.set_stats_section("cluster", [c] {
      nlohmann::json stats = nlohmann::json::parse(c->stats_json(), nullptr, false);
      return nlohmann::json{{"url", c->options().url},
                            {"name", c->options().cluster_name},
                            {"joined", c->joined()},
                            {"lease_ttl_ms", c->options().lease_ttl.count()},
                            {"stats", stats.is_discarded() ? nlohmann::json::object() : stats}}
          .dump();
    });
  }

  // After the server: destroyed (cancelled) before it on every return path.
  std::unique_ptr<ClusterWatch> member_watch;
  if (cluster) {
    auto w = EndSessionsOfExpiredMembers(*cluster, srv);
    if (!w.ok()) return fail(w.status().WithContext("watching cluster members"), kExitUsage);
    member_watch = std::move(*w);
  }

  std::printf("farmemd ready: bootstrap=%s transport=%s address=%s\n",
              srv.node().bootstrap_address().c_str(), srv.node().transport().name().c_str(),
              srv.node().transport().local_address().c_str());
  std::fflush(stdout);

  int sig = 0;
  while (sig <= 0) {
    timespec wait{1, 0};
    sig = sigtimedwait(&signals, nullptr, &wait);
  }
  FARMEM_LOG_INFO("{}: received {}, shutting down", prog, sig == SIGTERM ? "SIGTERM" : "SIGINT");
  if (cluster) {
    // Leave first, while still serving: watchers see a leave (not an expiry a TTL later) and
    // stop sending new work before the address goes away.
    Status st = cluster->leave();
    if (st.ok()) {
      FARMEM_LOG_INFO("cluster: left");
    } else {
      FARMEM_LOG_WARN("cluster: leave failed ({}); the membership expires with its lease",
                      st.ToString());
    }
  }
  if (member_watch) member_watch->cancel();
  if (metrics) metrics->stop();
  srv.stop();
  server->reset();  // unmaps the pools
  cluster.reset();
  FARMEM_LOG_INFO("{}: stopped", prog);
  return kExitOk;
}

}  // namespace farmem
