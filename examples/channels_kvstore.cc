// Example: the key-value store (channels, docs/channels.md) — values live on the node that
// inserted them, every node indexes every key, gets are one one-sided read. Here values are
// 32-byte strings: node 1 inserts, node 2 updates, node 3 reads and erases.
#include <array>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>

#include "channels_nodes.h"

using namespace std::chrono_literals;
namespace ch = farmem::channels;

namespace {
using Value = std::array<char, 32>;
Value Text(const char* s) {
  Value v{};
  std::strncpy(v.data(), s, v.size() - 1);
  return v;
}
std::span<const std::byte> Bytes(const Value& v) {
  return std::as_bytes(std::span(v));
}
}  // namespace

int main() {
  example::RunNodes(3, [&](ch::NodeId id, ch::ChannelThread& t) {
    const std::vector<ch::NodeId> members = {1, 2, 3};
    ch::KvConfig config;
    config.value_bytes = sizeof(Value);
    auto kv = ch::KvStore::Open(t, "users", members, config);
    example::Check(kv.status(), "KvStore::Open");
    auto bar = ch::Barrier::Open(t, "users/step", members);
    example::Check(bar.status(), "Barrier::Open");
    example::Check((*kv)->wait_ready(10s), "wait_ready");
    example::Check(bar->wait_ready(10s), "wait_ready");
    auto step = [&] { example::Check(bar->arrive_and_wait(t, 10s), "barrier"); };

    if (id == 1) example::Check((*kv)->insert(t, 42, Bytes(Text("alice"))), "insert");
    step();  // insert returned on node 1: every node's index has key 42
    if (id == 2) example::Check((*kv)->update(t, 42, Bytes(Text("alice (updated)"))), "update");
    step();
    Value got{};
    example::Check((*kv)->get(t, 42, std::as_writable_bytes(std::span(got))), "get");
    std::printf("node %u reads key 42 = '%s'\n", id, got.data());
    if (std::string(got.data()) != "alice (updated)") std::exit(1);
    step();
    if (id == 3) example::Check((*kv)->erase(t, 42), "erase");
    step();
    farmem::Status st = (*kv)->get(t, 42, std::as_writable_bytes(std::span(got)));
    if (st.code() != farmem::Code::kNotFound) {
      std::fprintf(stderr, "node %u: key 42 should be gone: %s\n", id, st.ToString().c_str());
      std::exit(1);
    }
    step();  // nobody closes the store while another node still uses it
  });
  std::printf("insert on node 1, update on node 2, erase on node 3: every node saw each step\n");
  return 0;
}
