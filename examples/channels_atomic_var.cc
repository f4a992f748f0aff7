// Example: an atomic_var (channels, docs/channels.md) — one 64-bit word homed at node 1 that every
// node changes with remote fetch-and-add and compare-and-swap. Three nodes in one process (see
// channels_nodes.h), each on its own thread; the final value is exact.
#include <cinttypes>
#include <cstdio>

#include "channels_nodes.h"

using namespace std::chrono_literals;
namespace ch = farmem::channels;

int main() {
  constexpr int kNodes = 3;
  constexpr uint64_t kAddsPerNode = 1000;
  example::RunNodes(kNodes, [&](ch::NodeId id, ch::ChannelThread& t) {
    // Every member opens the same name; the word lives at `home` (node 1).
    auto counter = ch::AtomicVar::Open(t, "counter", /*home=*/1, {1, 2, 3});
    example::Check(counter.status(), "AtomicVar::Open");
    example::Check(counter->wait_ready(10s), "wait_ready");
    auto start = ch::Barrier::Open(t, "start", {1, 2, 3});
    example::Check(start.status(), "Barrier::Open");
    example::Check(start->wait_ready(10s), "wait_ready");

    for (uint64_t i = 0; i < kAddsPerNode; i++)
      example::Check(counter->fetch_add(t, 1).status(), "fetch_add");
    example::Check(start->arrive_and_wait(t, 10s), "barrier");  // everyone's adds are done

    auto total = counter->load(t);
    example::Check(total.status(), "load");
    if (*total != kNodes * kAddsPerNode) {
      std::fprintf(stderr, "node %u: counter %" PRIu64 ", expected %" PRIu64 "\n", id, *total,
                   kNodes * kAddsPerNode);
      std::exit(1);
    }
    example::Check(start->arrive_and_wait(t, 10s), "barrier");  // every node has checked it
    if (id == 1) {
      std::printf("3 nodes x %" PRIu64 " fetch_add: counter = %" PRIu64 " (exact)\n", kAddsPerNode,
                  *total);
      // compare_swap returns the old value; it swaps only when that equals `expected`.
      auto old = counter->compare_swap(t, *total, 0);
      example::Check(old.status(), "compare_swap");
      auto again = counter->compare_swap(t, *total, 7);
      example::Check(again.status(), "compare_swap");
      std::printf("compare_swap(%" PRIu64 " -> 0): old %" PRIu64 ", swapped; again: old %" PRIu64
                  ", not swapped\n",
                  *total, *old, *again);
    }
    example::Check(start->arrive_and_wait(t, 10s), "barrier");  // nobody leaves while in use
  });
  return 0;
}
