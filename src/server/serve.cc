// farmemd / `farmem serve` run loop: create and start the MemoryServer, optional metrics endpoint,
// print the ready line, wait for SIGTERM/SIGINT and shut down gracefully. Startup problems (bad
// flags, bad config, an address that cannot be bound) are one stderr line with exit code 2.
#include "server/serve.h"

#include <signal.h>
#include <time.h>

#include <cstdio>

#include "common/log.h"
#include "server/metrics_http.h"

namespace farmem {

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

  auto server = MemoryServer::Create(*config);
  if (!server.ok()) return fail(server.status(), kExitUsage);
  if (Status st = (*server)->start(); !st.ok()) return fail(st, kExitUsage);
  MemoryServer& srv = **server;

  std::unique_ptr<MetricsHttpServer> metrics;
  if (flags.options.metrics_port >= 0) {
    auto m = MetricsHttpServer::Start(config->node.bootstrap_host,
                                      static_cast<uint16_t>(flags.options.metrics_port),
                                      [&srv] { return srv.metrics_text(); });
    if (!m.ok()) return fail(m.status(), kExitUsage);
    metrics = std::move(*m);
    FARMEM_LOG_INFO("metrics: http://{}:{}/metrics", config->node.bootstrap_host, metrics->port());
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
  if (metrics) metrics->stop();
  srv.stop();
  server->reset();  // unmaps the pools
  FARMEM_LOG_INFO("{}: stopped", prog);
  return kExitOk;
}

}  // namespace farmem
