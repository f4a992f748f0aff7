// `farmem hold ADDR`: allocate objects and raw ranges on a farmemd, print one "holding" line, then
// keep them (and the client's session) until killed or --seconds pass. Shows what sessions do: a
// killed holder's session allocations are freed when its lease runs out (docs/sessions.md);
// tests/dead_clients_test.sh kills eight of them.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "common/log.h"
#include "farmem/client.h"
#include "farmem/objects.h"
#include "server/serve.h"

namespace farmem::cli {
namespace {

volatile std::sig_atomic_t g_stop = 0;
void OnSignal(int) {
  g_stop = 1;
}

}  // namespace

int RunHold(const HoldOptions& o) {
  InitLogging();
  const Lifetime lifetime = o.persistent ? Lifetime::kPersistent : Lifetime::kSession;
  auto node = MakeClientNode(o.client, "farmem-hold");
  if (!node.ok()) {
    std::fprintf(stderr, "farmem hold: error: %s\n", node.status().ToString().c_str());
    return 1;
  }
  const std::chrono::milliseconds ttl(o.session_ttl_ms);
  std::unique_ptr<ObjectClient> objects;
  if (o.objects > 0) {
    ObjectClientOptions oo;
    oo.session_ttl = ttl;
    std::vector<std::string> servers{o.address};
    auto c = ObjectClient::Connect(**node, servers, oo);
    if (!c.ok()) {
      std::fprintf(stderr, "farmem hold: error: %s\n", c.status().ToString().c_str());
      return 1;
    }
    objects = std::move(*c);
    for (uint64_t i = 0; i < o.objects; ++i) {
      auto p = objects->alloc(o.object_size, 0, lifetime);
      if (!p.ok()) {
        std::fprintf(stderr, "farmem hold: error: object %llu: %s\n",
                     static_cast<unsigned long long>(i), p.status().ToString().c_str());
        return 1;
      }
    }
  }
  std::unique_ptr<RawClient> raw;
  if (o.raw_count > 0) {
    RawClientOptions ro;
    ro.session_ttl = ttl;
    auto c = RawClient::Connect(**node, o.address, ro);
    if (!c.ok()) {
      std::fprintf(stderr, "farmem hold: error: %s\n", c.status().ToString().c_str());
      return 1;
    }
    raw = std::move(*c);
    auto sched = (*node)->make_scheduler();
    if (!sched.ok()) {
      std::fprintf(stderr, "farmem hold: error: %s\n", sched.status().ToString().c_str());
      return 1;
    }
    // Written once, so the server's pages are really in use (resident), as a client's would be.
    const std::vector<std::byte> fill(o.raw_bytes, std::byte{0x5a});
    for (uint64_t i = 0; i < o.raw_count; ++i) {
      auto a = raw->alloc_raw(o.raw_bytes, lifetime);
      Status st = a.ok() ? (*sched)->block_on((*sched)->write(a->ref, fill.data(), fill.size(),
                                                              /*delivery_complete=*/true))
                         : a.status();
      if (!st.ok()) {
        std::fprintf(stderr, "farmem hold: error: raw range %llu: %s\n",
                     static_cast<unsigned long long>(i), st.ToString().c_str());
        return 1;
      }
    }
  }
  std::printf(
      "farmem hold: holding %llu object(s) of %llu B and %llu raw range(s) of %llu B (%s)\n",
      static_cast<unsigned long long>(o.objects), static_cast<unsigned long long>(o.object_size),
      static_cast<unsigned long long>(o.raw_count), static_cast<unsigned long long>(o.raw_bytes),
      o.persistent ? "persistent" : "session");
  std::fflush(stdout);
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(o.seconds);
  while (g_stop == 0 && (o.seconds == 0 || std::chrono::steady_clock::now() < until)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // A graceful end closes the sessions (session allocations are freed at once).
  objects.reset();
  raw.reset();
  return 0;
}

}  // namespace farmem::cli
