// Example: a shared queue (channels, docs/channels.md) — a multi-producer multi-consumer FIFO of
// 64-bit values homed at node 1. Every node pushes 100 values and pops until all 300 are taken;
// each value comes out exactly once (checked with a shared atomic counter of pops).
#include <atomic>
#include <cinttypes>
#include <cstdio>

#include "channels_nodes.h"

using namespace std::chrono_literals;
namespace ch = farmem::channels;

int main() {
  constexpr uint64_t kPerNode = 100;
  std::atomic<uint64_t> popped{0}, sum{0};  // in this process only: the example's own check
  example::RunNodes(3, [&](ch::NodeId id, ch::ChannelThread& t) {
    const std::vector<ch::NodeId> members = {1, 2, 3};
    auto q = ch::SharedQueue::Open(t, "jobs", /*home=*/1, members, /*capacity=*/32);
    example::Check(q.status(), "SharedQueue::Open");
    auto bar = ch::Barrier::Open(t, "jobs/done", members);
    example::Check(bar.status(), "Barrier::Open");
    example::Check(q->wait_ready(10s), "wait_ready");
    example::Check(bar->wait_ready(10s), "wait_ready");
    uint64_t pushed = 0;
    while (popped.load() < 3 * kPerNode) {
      if (pushed < kPerNode) {
        // kResourceExhausted: full right now; pop below makes room.
        farmem::Status st = q->push(t, id * 1000 + pushed, 10s);
        if (st.ok())
          pushed++;
        else if (st.code() != farmem::Code::kResourceExhausted)
          example::Check(st, "push");
      }
      auto v = q->pop(t, 10s);
      if (v.ok()) {
        popped++;
        sum += *v;
      } else if (v.status().code() != farmem::Code::kNotFound) {  // kNotFound: empty
        example::Check(v.status(), "pop");
      }
    }
    example::Check(bar->arrive_and_wait(t, 10s), "barrier");
    if (id == 1) {
      // Values n * 1000 + i for n = 1..3, i = 0..99.
      const uint64_t want = 1000 * (1 + 2 + 3) * kPerNode + 3 * (kPerNode * (kPerNode - 1) / 2);
      std::printf("300 values pushed by 3 nodes, %" PRIu64 " popped, sum %s\n", popped.load(),
                  sum.load() == want ? "exact" : "WRONG");
      if (sum.load() != want || popped.load() != 3 * kPerNode) std::exit(1);
    }
  });
  return 0;
}
