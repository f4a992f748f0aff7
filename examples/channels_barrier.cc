// Example: a barrier (channels, docs/channels.md) across three nodes. Nobody leaves episode k
// before everyone entered it, and the channel writes a node made before entering are visible to
// every node after it: each node writes its "result" into node 1's slot table, then all check it.
#include <cinttypes>
#include <cstdio>

#include "channels_nodes.h"

using namespace std::chrono_literals;
namespace ch = farmem::channels;

int main() {
  example::RunNodes(3, [](ch::NodeId id, ch::ChannelThread& t) {
    const std::vector<ch::NodeId> members = {1, 2, 3};
    auto bar = ch::Barrier::Open(t, "phase", members);
    example::Check(bar.status(), "Barrier::Open");
    // A plain channel: 3 words of state on every member; we use node 1's copy as a table.
    auto table = ch::Channel::Open(t, "results", members, 3 * 8);
    example::Check(table.status(), "Channel::Open");
    example::Check(bar->wait_ready(10s), "wait_ready");
    example::Check(table->wait_ready(10s), "wait_ready");
    const uint64_t at1 = *table->slice_offset(1);

    for (uint64_t phase = 1; phase <= 5; phase++) {
      const uint64_t mine = phase * 100 + id;
      // No wait needed: arrive_and_wait fences this thread's writes before announcing arrival.
      example::Check(t.write(1, at1 + 8 * (id - 1), &mine, 8).status(), "write");
      example::Check(bar->arrive_and_wait(t, 10s), "arrive_and_wait");
      uint64_t row[3];
      example::Check(t.read_sync(1, at1, row, sizeof(row)), "read");
      for (uint64_t n = 1; n <= 3; n++) {
        if (row[n - 1] != phase * 100 + n) {
          std::fprintf(stderr, "node %u phase %" PRIu64 ": slot %" PRIu64 " = %" PRIu64 "\n", id,
                       phase, n, row[n - 1]);
          std::exit(1);
        }
      }
      if (id == 1)
        std::printf("phase %" PRIu64 ": all 3 results visible after the barrier\n", phase);
      example::Check(bar->arrive_and_wait(t, 10s), "arrive_and_wait");  // reads done
    }
  });
  return 0;
}
