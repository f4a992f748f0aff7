// Example: a shared_region (channels, docs/channels.md) — the same 96 bytes on every node, which
// any node reads and writes in any node's copy. Three nodes in one process (see channels_nodes.h),
// each on its own thread: each writes its greeting into its slot of every copy, a barrier (whose
// entry fences the writes) orders them before the reads, then each checks its local copy.
#include <cstdio>
#include <cstring>
#include <string>

#include "channels_nodes.h"

using namespace std::chrono_literals;
namespace ch = farmem::channels;

int main() {
  constexpr int kNodes = 3;
  constexpr size_t kSlot = 32;
  auto greeting = [](ch::NodeId id) { return "hello from node " + std::to_string(id); };
  example::RunNodes(kNodes, [&](ch::NodeId id, ch::ChannelThread& t) {
    // Every member opens the same name with the same size: one copy per node.
    auto region = ch::SharedRegion::Open(t, "greetings", {1, 2, 3}, kNodes * kSlot);
    example::Check(region.status(), "SharedRegion::Open");
    example::Check(region->wait_ready(10s), "wait_ready");
    auto bar = ch::Barrier::Open(t, "greetings/bar", {1, 2, 3});
    example::Check(bar.status(), "Barrier::Open");
    example::Check(bar->wait_ready(10s), "wait_ready");

    // The region has no consistency of its own: each node writes only its own slot.
    char slot[kSlot] = {};
    std::snprintf(slot, sizeof(slot), "%s", greeting(id).c_str());
    ch::AckKey all;
    for (ch::NodeId node = 1; node <= kNodes; node++) {
      auto key = region->write(t, node, (id - 1) * kSlot, std::as_bytes(std::span(slot)));
      example::Check(key.status(), "write");
      all |= *key;  // asynchronous: the union completes when every copy has the bytes
    }
    example::Check(t.wait(all, 10s), "write");  // a write's error (a node gone) comes through it
    // Entering the barrier fences this thread's writes; leaving it means every node's are placed.
    example::Check(bar->arrive_and_wait(t, 10s), "barrier");

    // Read the local copy directly, and node 3's copy one-sided (the same on every node).
    auto local = region->local();
    char remote[kNodes * kSlot];
    auto key = region->read(t, 3, 0, std::as_writable_bytes(std::span(remote)));
    example::Check(key.status(), "read");
    example::Check(t.wait(*key, 10s), "read");
    for (ch::NodeId n = 1; n <= kNodes; n++) {
      const char* mine = reinterpret_cast<const char*>(local.data()) + (n - 1) * kSlot;
      if (greeting(n) != mine || greeting(n) != remote + (n - 1) * kSlot) {
        std::fprintf(stderr, "node %u: slot %u reads '%s' here and '%s' at node 3\n", id, n, mine,
                     remote + (n - 1) * kSlot);
        std::exit(1);
      }
      if (id == 1) std::printf("node 1's copy, slot %u: %s\n", n, mine);
    }
    example::Check(bar->arrive_and_wait(t, 10s), "barrier");  // nobody leaves while in use
  });
  std::printf("every node's copy holds the three greetings\n");
  return 0;
}
