// Test fixture shared by the channels tests (channels_test.cc, structures_test.cc): three
// in-process nodes on one backend (tcp or fabric:shm), each with a Manager and the test thread's
// ChannelThread; FARMEM_CHANNELS_FAULT names the protection a test removes (docs/channels.md).
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "farmem/channels.h"
#include "node/node_test_util.h"

namespace farmem::channels::testing_util {

using namespace std::chrono_literals;

inline bool Fault(const char* name) {
  const char* f = std::getenv("FARMEM_CHANNELS_FAULT");
  return f != nullptr && std::string(f) == name;
}

struct Member {
  std::unique_ptr<Node> node;
  std::unique_ptr<Manager> mgr;
  std::unique_ptr<ChannelThread> thr;  // the test thread's
};

class ChannelsTest : public ::testing::TestWithParam<std::string> {
 protected:
  static constexpr int kNodes = 3;

  void SetUp() override {
    for (int i = 0; i < kNodes; i++) ports_.push_back(node::testing::UnusedPort());
    for (int i = 0; i < kNodes; i++) {
      participants_.push_back(
          Participant{static_cast<NodeId>(i + 1), "127.0.0.1:" + std::to_string(ports_[i])});
    }
    members_.resize(kNodes);
  }
  void TearDown() override {
    for (auto& m : members_) m.thr.reset();
    for (auto& m : members_) {
      if (m.node) m.node->stop();
    }
  }

  // Builds and starts node `id` (1-based) with its manager; does not connect.
  bool StartMember(NodeId id, std::chrono::milliseconds op_timeout = 5000ms) {
    auto config = node::testing::MakeConfig(GetParam(), "n" + std::to_string(id));
    config.bootstrap_port = ports_[id - 1];
    config.transport.op_timeout = op_timeout;
    auto node = Node::Create(config);
    if (!node.ok()) {
      skip_ = node.status().ToString();
      return false;
    }
    ManagerConfig mc;
    mc.self = id;
    mc.participants = participants_;
    mc.region_bytes = 1 << 20;
    auto mgr = Manager::Create(**node, mc);
    EXPECT_TRUE(mgr.ok()) << mgr.status().ToString();
    if (!mgr.ok()) return false;
    Status st = (*node)->start();
    EXPECT_TRUE(st.ok()) << st.ToString();
    if (!st.ok()) return false;
    auto& m = members_[id - 1];
    m.node = std::move(*node);
    m.mgr = std::move(*mgr);
    auto thr = m.mgr->make_thread();
    EXPECT_TRUE(thr.ok());
    m.thr = std::move(*thr);
    return true;
  }
  bool StartAll(std::chrono::milliseconds op_timeout = 5000ms) {
    for (NodeId id = 1; id <= kNodes; id++) {
      if (!StartMember(id, op_timeout)) return false;
    }
    for (auto& m : members_) {
      Status st = m.mgr->connect(5s);
      EXPECT_TRUE(st.ok()) << st.ToString();
      if (!st.ok()) return false;
    }
    return true;
  }
  Member& M(NodeId id) { return members_[id - 1]; }

  std::vector<uint16_t> ports_;
  std::vector<Participant> participants_;
  std::vector<Member> members_;
  std::string skip_;
};

// START_ALL_OR_SKIP() or START_ALL_OR_SKIP(op_timeout).
#define START_ALL_OR_SKIP(...)                   \
  do {                                           \
    if (!StartAll(__VA_ARGS__)) {                \
      if (!skip_.empty()) GTEST_SKIP() << skip_; \
      FAIL() << "could not start the nodes";     \
    }                                            \
  } while (0)

// Sanitizer builds run the same code several times slower (TSan most): the longer histories are
// cut there, so a test stays within its few seconds; what they check is unchanged.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitizerBuild = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
inline constexpr bool kSanitizerBuild = true;
#else
inline constexpr bool kSanitizerBuild = false;
#endif
#else
inline constexpr bool kSanitizerBuild = false;
#endif

// Runs `fn` (returning a Status), expects an error within `limit`, and prints it with how long it
// took (the failure tests' measurements).
template <class Fn>
void ExpectErrorWithin(const std::string& what, std::chrono::milliseconds limit, Fn fn) {
  const auto t0 = std::chrono::steady_clock::now();
  Status st = fn();
  const auto took =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  EXPECT_FALSE(st.ok()) << what;
  EXPECT_LT(took, limit) << what << ": " << st.ToString();
  std::printf("%s: %s (%lld ms)\n", what.c_str(), st.ToString().c_str(),
              static_cast<long long>(took.count()));
}

// gtest parameter names: "fabric:shm" -> "fabric_shm".
inline std::string BackendName(const ::testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  for (auto& ch : s) {
    if (ch == ':') ch = '_';
  }
  return s;
}

}  // namespace farmem::channels::testing_util
