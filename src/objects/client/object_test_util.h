// Test fixture pieces shared by the objects tests: an in-process MemoryServer with the object
// store on loopback plus a started client node, for the "tcp" and "fabric:shm" backends, and a
// value format (index, sequence number, checksum) the tests write into objects and verify.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "farmem/objects.h"
#include "farmem/server.h"
#include "node/node_test_util.h"

namespace farmem::objects_test {

// A server + client node pair. Members are declared in teardown order (reverse).
struct ObjectEnv {
  std::unique_ptr<MemoryServer> server;
  std::unique_ptr<Node> node;  // client side
  std::string address;         // server bootstrap address

  ~ObjectEnv() {
    if (node) node->stop();
    if (server) server->stop();
  }

  // Compaction is driven by the tests (interval 0: no leader thread) unless they say otherwise.
  static ObjectsConfig DefaultObjects() {
    ObjectsConfig o;
    o.block_size = 4096;
    o.id_bits = 16;
    o.reserve_bytes = 64ull << 20;
    o.max_physical_bytes = 32ull << 20;
    o.compaction.interval_ms = 0;
    return o;
  }

  // Starts both ends; a failure is reported with ADD_FAILURE and leaves `server` null.
  static std::unique_ptr<ObjectEnv> Start(const std::string& backend,
                                          const ObjectsConfig& objects = DefaultObjects()) {
    auto env = std::make_unique<ObjectEnv>();
    ServerConfig sc;
    sc.node = ::farmem::node::testing::MakeConfig(backend, "objects-farmemd");
    sc.memory_bytes = 16ull << 20;
    sc.pool_bytes = 4ull << 20;
    sc.objects = objects;
    auto s = MemoryServer::Create(sc);
    if (!s.ok()) {
      ADD_FAILURE() << "server create: " << s.status().ToString();
      return env;
    }
    Status st = (*s)->start();
    if (!st.ok()) {
      ADD_FAILURE() << "server start: " << st.ToString();
      return env;
    }
    env->server = std::move(*s);
    env->address = env->server->node().bootstrap_address();
    auto n = Node::Create(::farmem::node::testing::MakeConfig(backend, "objects-client"));
    st = n.ok() ? (*n)->start() : n.status();
    if (!st.ok()) {
      ADD_FAILURE() << "client node: " << st.ToString();
      env->server.reset();
      return env;
    }
    env->node = std::move(*n);
    return env;
  }

  Result<std::unique_ptr<ObjectClient>> Connect(ObjectClientOptions options = {}) {
    std::vector<std::string> servers{address};
    return ObjectClient::Connect(*node, servers, options);
  }
};

// FNV-1a, 64 bit.
inline uint64_t Checksum(std::span<const std::byte> bytes) {
  uint64_t h = 1469598103934665603ull;
  for (std::byte b : bytes) {
    h ^= static_cast<uint8_t>(b);
    h *= 1099511628211ull;
  }
  return h;
}

// A self-checking object value of `size` (>= 24) bytes: index, sequence number, filler derived
// from both, and a checksum of everything before it in the last 8 bytes.
inline std::vector<std::byte> MakeValue(size_t size, uint64_t index, uint64_t seq) {
  std::vector<std::byte> v(size);
  std::memcpy(v.data(), &index, 8);
  std::memcpy(v.data() + 8, &seq, 8);
  for (size_t i = 16; i + 8 < size; ++i) {
    v[i] = static_cast<std::byte>((index * 131 + seq * 31 + i * 7) & 0xff);
  }
  const uint64_t sum = Checksum(std::span(v).first(size - 8));
  std::memcpy(v.data() + size - 8, &sum, 8);
  return v;
}

struct DecodedValue {
  bool checksum_ok = false;
  uint64_t index = 0;
  uint64_t seq = 0;
};

inline DecodedValue CheckValue(std::span<const std::byte> v) {
  DecodedValue d;
  if (v.size() < 24) return d;
  std::memcpy(&d.index, v.data(), 8);
  std::memcpy(&d.seq, v.data() + 8, 8);
  uint64_t sum;
  std::memcpy(&sum, v.data() + v.size() - 8, 8);
  d.checksum_ok = sum == Checksum(v.first(v.size() - 8));
  return d;
}

}  // namespace farmem::objects_test
