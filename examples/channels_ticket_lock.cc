// Example: a ticket lock (channels, docs/channels.md) — FIFO mutual exclusion across nodes and
// threads. Inside the lock each node does a NON-atomic read, +1, write of a word at node 2; with
// the lock the final count is exact (without it, increments would be lost).
#include <cinttypes>
#include <cstdio>

#include "channels_nodes.h"

using namespace std::chrono_literals;
namespace ch = farmem::channels;

int main() {
  constexpr uint64_t kPerNode = 200;
  example::RunNodes(3, [&](ch::NodeId id, ch::ChannelThread& t) {
    const std::vector<ch::NodeId> members = {1, 2, 3};
    auto lock = ch::TicketLock::Open(t, "counter/lock", /*home=*/1, members);
    example::Check(lock.status(), "TicketLock::Open");
    auto word = ch::Channel::Open(t, "counter/word", members, 8);
    example::Check(word.status(), "Channel::Open");
    auto bar = ch::Barrier::Open(t, "done", members);
    example::Check(bar.status(), "Barrier::Open");
    for (auto st : {lock->wait_ready(10s), word->wait_ready(10s), bar->wait_ready(10s)})
      example::Check(st, "wait_ready");
    const uint64_t at2 = *word->slice_offset(2);

    for (uint64_t i = 0; i < kPerNode; i++) {
      uint64_t ticket = 0;
      example::Check(lock->lock(t, 10s, &ticket), "lock");
      uint64_t v = 0;
      example::Check(t.read_sync(2, at2, &v, 8), "read");
      v++;
      example::Check(t.write(2, at2, &v, 8).status(), "write");
      example::Check(lock->unlock(t, 10s), "unlock");  // fences the write, then serves the next
    }
    example::Check(bar->arrive_and_wait(t, 10s), "barrier");
    if (id == 1) {
      uint64_t v = 0;
      example::Check(t.read_sync(2, at2, &v, 8), "read");
      std::printf("3 nodes x %" PRIu64 " locked increments: counter = %" PRIu64 "%s\n", kPerNode, v,
                  v == 3 * kPerNode ? " (exact)" : " (WRONG)");
      if (v != 3 * kPerNode) std::exit(1);
    }
    example::Check(bar->arrive_and_wait(t, 10s), "barrier");
  });
  return 0;
}
