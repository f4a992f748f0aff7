// Example: a ringbuffer (channels, docs/channels.md) — node 1 broadcasts numbered text records to
// nodes 2 and 3, which read every one exactly once and in order. The ring holds 4 records, so the
// producer waits (back-pressure) whenever a consumer is 4 records behind.
#include <cstdio>
#include <cstring>
#include <string>

#include "channels_nodes.h"

using namespace std::chrono_literals;
namespace ch = farmem::channels;

int main() {
  constexpr int kRecords = 100;
  example::RunNodes(3, [&](ch::NodeId id, ch::ChannelThread& t) {
    auto ring = ch::RingBuffer::Open(t, "news", /*producer=*/1, {1, 2, 3}, /*capacity=*/4,
                                     /*max_record_bytes=*/64);
    example::Check(ring.status(), "RingBuffer::Open");
    example::Check(ring->wait_ready(10s), "wait_ready");
    if (id == 1) {
      for (int i = 1; i <= kRecords; i++) {
        const std::string msg = "record " + std::to_string(i);
        example::Check(ring->push(t, msg.data(), msg.size(), 10s).status(), "push");
      }
      // Every consumer has released every record: nothing is lost when we return.
      example::Check(ring->wait_released(t, kRecords, 10s), "wait_released");
      std::printf("node 1 pushed %d records\n", kRecords);
      return;
    }
    for (int i = 1; i <= kRecords; i++) {
      char buf[64];
      auto len = ring->pop(t, buf, sizeof(buf), 10s);  // releases the slot at once
      example::Check(len.status(), "pop");
      const std::string want = "record " + std::to_string(i);
      if (std::string(buf, *len) != want) {
        std::fprintf(stderr, "node %u: got '%.*s', expected '%s'\n", id, static_cast<int>(*len),
                     buf, want.c_str());
        std::exit(1);
      }
    }
    std::printf("node %u read records 1..%d in order\n", id, kRecords);
  });
  return 0;
}
