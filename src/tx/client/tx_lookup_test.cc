// Tests of the data-structure callback interface with a data structure that is not the hash
// table: a small array of records (ArrayDs) with forward records ("continue at") and a
// spill-over map reachable only by RPC, served by its own owner (TxDsOwner::rpc_handler on a
// Node) and read through OneTwoSidedLookup. Main thread plus the owner node's threads.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "farmem/node.h"
#include "node/node_test_util.h"
#include "node/rpc_call.h"
#include "tx/client/tx_lookup.h"
#include "tx/client/tx_test_env.h"
#include "tx/format/tx_data_structure.h"

namespace farmem::tx_test {
namespace {

// Record i of the array, 32 bytes at offset 32 * i: {seq, key, value, tail}. The owner changes a
// record by seq := odd, stores, seq := tail := even (tests only change it before reading). key
// kForward: the record moved; `value` is the index to continue at.
constexpr uint64_t kForward = ~uint64_t{0};
constexpr uint64_t kRecords = 8;
constexpr uint16_t kArrayLookup = 9000;  // request: u64 key; reply: u64 address, version, value
constexpr uint64_t kSpillAddress = ~uint64_t{0};

struct Record {
  uint64_t seq, key, value, tail;
};
static_assert(sizeof(Record) == 32);

// Owner side: the array in a page of its own plus keys that did not fit (RPC only).
class ArrayOwner final : public tx::TxDsOwner {
 public:
  ArrayOwner() {
    void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    records_ = static_cast<Record*>(p == MAP_FAILED ? nullptr : p);
  }
  ~ArrayOwner() override {
    if (records_ != nullptr) munmap(records_, kBytes);
  }
  static constexpr size_t kBytes = 4096;
  Record* records() { return records_; }
  std::map<uint64_t, uint64_t>& spill() { return spill_; }

  Status rpc_handler(uint16_t opcode, std::span<const std::byte> request,
                     std::vector<std::byte>& reply) override {
    rpcs.fetch_add(1);
    if (opcode != kArrayLookup) return Status::Protocol("array: unknown opcode");
    if (request.size() != 8) return Status::Protocol("array lookup: request is a u64 key");
    uint64_t key = 0;
    std::memcpy(&key, request.data(), 8);
    uint64_t out[3] = {kSpillAddress, 0, 0};
    bool found = false;
    for (uint64_t i = 0; i < kRecords && !found; ++i) {
      if (records_[i].key == key) {
        out[0] = i * sizeof(Record);
        out[1] = records_[i].seq / 2;
        out[2] = records_[i].value;
        found = true;
      }
    }
    if (auto it = spill_.find(key); !found && it != spill_.end()) {
      out[2] = it->second;
      found = true;
    }
    if (!found) return Status::NotFound("array: no key " + std::to_string(key));
    reply.resize(sizeof(out));
    std::memcpy(reply.data(), out, sizeof(out));
    return Status::OK();
  }
  std::atomic<uint64_t> rpcs{0};

 private:
  Record* records_ = nullptr;
  std::map<uint64_t, uint64_t> spill_;
};

// Client side: key k is guessed at record k (no cache needed: the guess is the address).
class ArrayDs final : public tx::TxDsClient {
 public:
  tx::DsStep lookup_start(std::span<const std::byte> key) override {
    const uint64_t k = U64(key);
    if (k >= kRecords) return {};  // kRpc: only the owner knows the spill-over keys
    return ReadAt(k);
  }
  tx::DsStep lookup_end(std::span<const std::byte> copy, const tx::DsRead& read,
                        const tx::SeqlockRecheck* recheck,
                        std::span<const std::byte> key) override {
    (void)recheck;
    Record r;
    std::memcpy(&r, copy.data(), sizeof(r));
    tx::DsStep next;
    if (r.seq % 2 != 0 || r.seq != r.tail) {
      next.kind = tx::DsStep::kRetry;
      return next;
    }
    if (r.key == U64(key)) {
      next.kind = tx::DsStep::kFound;
      next.address = read.offset;
      next.view.version = r.seq / 2;
      next.view.value = copy.subspan(offsetof(Record, value), 8);
      return next;
    }
    if (r.key == kForward && r.value < kRecords) return ReadAt(r.value);
    return next;  // another key or free: ask the owner
  }
  uint16_t rpc_opcode() const override { return kArrayLookup; }
  std::vector<std::byte> rpc_request(std::span<const std::byte> key) override {
    return std::vector<std::byte>(key.begin(), key.end());
  }
  Result<tx::DsStep> rpc_lookup_end(std::span<const std::byte> reply,
                                    std::span<const std::byte> key) override {
    (void)key;
    if (reply.size() != 24) return Status::Protocol("array lookup reply: length");
    tx::DsStep found;
    found.kind = tx::DsStep::kFound;
    std::memcpy(&found.address, reply.data(), 8);
    std::memcpy(&found.view.version, reply.data() + 8, 8);
    found.view.value = reply.subspan(16, 8);
    return found;
  }

 private:
  static tx::DsStep ReadAt(uint64_t index) {
    tx::DsStep s;
    s.kind = tx::DsStep::kRead;
    s.read = {index * sizeof(Record), sizeof(Record), false};
    return s;
  }
};

class TxDataStructure : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ASSERT_NE(owner_.records(), nullptr);
    Record* r = owner_.records();
    for (uint64_t i = 0; i < kRecords; ++i) r[i] = {2, i, 100 + i, 2};
    r[3] = {4, kForward, 6, 4};  // key 3 moved to record 6
    r[6] = {6, 3, 103, 6};       //   (whose own key 6 went to the spill-over map)
    r[5] = {7, 5, 105, 6};       // key 5's record is being changed (odd seq)
    r[2] = {8, kForward, 4, 8};  // records 2 and 4 forward to each other (a cycle)
    r[4] = {8, kForward, 2, 8};
    owner_.spill()[6] = 106;
    owner_.spill()[40] = 140;
    owner_.spill()[2] = 102;
    // All records are written before the owner's node starts: its transport threads read them.
    auto server = Node::Create(node::testing::MakeConfig(GetParam(), "array-owner"));
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
    auto region =
        server_->export_region("array", owner_.records(), ArrayOwner::kBytes, Access::kReadOnly);
    ASSERT_TRUE(region.ok()) << region.status().ToString();
    ASSERT_TRUE(server_
                    ->register_rpc(kArrayLookup,
                                   [this](const RpcCall& call, std::vector<std::byte>& reply) {
                                     return owner_.rpc_handler(call.opcode, call.request, reply);
                                   })
                    .ok());
    ASSERT_TRUE(server_->start().ok());
    auto client = Node::Create(node::testing::MakeConfig(GetParam(), "array-client"));
    ASSERT_TRUE(client.ok());
    client_ = std::move(*client);
    ASSERT_TRUE(client_->start().ok());
    auto peer = client_->connect(server_->bootstrap_address());
    ASSERT_TRUE(peer.ok()) << peer.status().ToString();
    region_ = RemoteRef{peer->id, region->key, 0};
    runner_ = std::make_unique<BlockingRunner>(*client_, "array test");
  }
  void TearDown() override {
    runner_.reset();
    if (client_) client_->stop();
    if (server_) server_->stop();
  }
  // One lookup of `key`; *value set when found.
  Result<tx::DsLookup> Lookup(uint64_t key, uint64_t* value, bool one_sided = true) {
    std::vector<std::byte> copy, reply(64);
    const auto k = Key(key);
    tx::DsLookupOptions o;
    o.one_sided = one_sided;
    Result<tx::DsLookup> r = runner_->run(
        [&](Scheduler& s) { return tx::OneTwoSidedLookup(s, ds_, region_, k, o, &copy, &reply); });
    if (r.ok()) *value = U64(r->found.view.value);
    return r;
  }

  ArrayOwner owner_;
  ArrayDs ds_;
  std::unique_ptr<Node> server_, client_;
  std::unique_ptr<BlockingRunner> runner_;
  RemoteRef region_;
};

TEST_P(TxDataStructure, AnArrayIsReadOneTwoSidedThroughTheCallbacks) {
  uint64_t v = 0;
  // The guess hits: one copy.
  auto r = Lookup(1, &v);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->one_sided);
  EXPECT_EQ(r->reads, 1u);
  EXPECT_EQ(v, 101u);
  EXPECT_EQ(r->found.address, 1 * sizeof(Record));
  // lookup_end says "continue at record 6": two copies, no RPC.
  r = Lookup(3, &v);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->one_sided);
  EXPECT_EQ(r->reads, 2u);
  EXPECT_EQ(v, 103u);
  EXPECT_EQ(owner_.rpcs.load(), 0u);
  // Record 6 holds key 3 now: lookup_end gives up, the owner answers from its spill-over map.
  r = Lookup(6, &v);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->one_sided);
  EXPECT_TRUE(r->tried_rpc);
  EXPECT_EQ(v, 106u);
  // Busy record: retried (max_retries), then the RPC.
  r = Lookup(5, &v);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->one_sided);
  EXPECT_EQ(r->reads, 1u + tx::DsLookupOptions{}.max_retries);
  EXPECT_EQ(v, 105u);
  // lookup_start says "none": straight to the RPC.
  r = Lookup(40, &v);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->reads, 0u);
  EXPECT_EQ(v, 140u);
  // Absent everywhere: the owner's kNotFound.
  EXPECT_EQ(Lookup(41, &v).status().code(), Code::kNotFound);
  // RPC-only: no copy even where the guess would hit.
  r = Lookup(1, &v, false);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->reads, 0u);
  EXPECT_EQ(v, 101u);
  EXPECT_EQ(owner_.rpcs.load(), 5u);  // keys 6, 5, 40, 41 and the RPC-only 1
}

// A forward cycle (a corrupted or racing structure) ends at the read bound and falls back.
TEST_P(TxDataStructure, AForwardCycleIsBoundedAndFallsBackToTheRpc) {
  uint64_t v = 0;
  auto r = Lookup(2, &v);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->one_sided);
  EXPECT_EQ(r->reads, tx::DsLookupOptions{}.max_reads);
  EXPECT_EQ(v, 102u);
}

INSTANTIATE_TEST_SUITE_P(Backends, TxDataStructure, kTxBackends, TxBackendName);

}  // namespace
}  // namespace farmem::tx_test
