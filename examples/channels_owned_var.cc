// Example: an owned_var (channels, docs/channels.md) — a single-writer register. Node 1 owns a
// 32-byte struct: it stores a new value and pushes it into the other nodes' caches; readers load
// their cache or pull the owner's copy. A value larger than a word is never seen torn.
#include <cinttypes>
#include <cstdio>

#include "channels_nodes.h"

using namespace std::chrono_literals;
namespace ch = farmem::channels;

struct Position {
  uint64_t seq;
  double x, y, z;
};

int main() {
  example::RunNodes(3, [](ch::NodeId id, ch::ChannelThread& t) {
    auto pos = ch::OwnedVar<Position>::Open(t, "robot/pos", /*owner=*/1, {1, 2, 3});
    example::Check(pos.status(), "OwnedVar::Open");
    example::Check(pos->wait_ready(10s), "wait_ready");
    auto bar = ch::Barrier::Open(t, "step", {1, 2, 3});
    example::Check(bar.status(), "Barrier::Open");
    example::Check(bar->wait_ready(10s), "wait_ready");

    for (uint64_t step = 1; step <= 3; step++) {
      if (id == 1) {
        const Position p{step, 1.0 * step, 2.0 * step, 3.0 * step};
        example::Check(pos->store(p), "store");
        auto pushed = pos->push(t);  // one write per reader; the key completes when all landed
        example::Check(pushed.status(), "push");
        example::Check(t.wait(*pushed, 10s), "wait for push");
      }
      // The barrier's thread fence orders the push before everyone's arrival.
      example::Check(bar->arrive_and_wait(t, 10s), "barrier");
      if (id != 1) {
        auto cached = pos->load(t);  // this node's cache, as last pushed
        example::Check(cached.status(), "load");
        auto pulled = pos->pull(t);  // a one-sided read of the owner's copy
        example::Check(pulled.status(), "pull");
        if (cached->seq != step || pulled->seq != step || cached->z != 3.0 * step) {
          std::fprintf(stderr, "node %u: step %" PRIu64 " saw seq %" PRIu64 "/%" PRIu64 "\n", id,
                       step, cached->seq, pulled->seq);
          std::exit(1);
        }
        std::printf("node %u step %" PRIu64 ": cache (%.0f, %.0f, %.0f), pull seq %" PRIu64 "\n",
                    id, step, cached->x, cached->y, cached->z, pulled->seq);
      }
      example::Check(bar->arrive_and_wait(t, 10s), "barrier");
    }
  });
  return 0;
}
