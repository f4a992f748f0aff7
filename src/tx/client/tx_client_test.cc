// End-to-end tests of the tx client against in-process farmemd tx services (tx_test_env.h) on
// native TCP and fabric shm: table discovery, CRUD transactions, aborts by reason, aborts leaving
// no trace, one-sided reads and the RPC fallback for stale cached addresses. Main thread only.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "farmem/tx.h"
#include "tx/client/tx_test_env.h"

namespace farmem::tx_test {
namespace {

constexpr uint32_t kValue = 16;

class TxClientE2E : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    env_ = TxEnv::Start(GetParam(), 2, {"kv:8:16:64:2", "other:16:8:16"});
    ASSERT_TRUE(env_->node);
    auto c = env_->Connect();
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    client_ = std::move(*c);
    auto t = client_->table("kv");
    ASSERT_TRUE(t.ok());
    kv_ = *t;
    a_ = NewTx();
    b_ = NewTx();
  }
  void TearDown() override {
    a_.reset();
    b_.reset();
    client_.reset();
    env_.reset();
  }
  std::unique_ptr<BlockingTx> NewTx() {
    auto t = BlockingTx::Create(*client_, *env_->node);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return t.ok() ? std::move(*t) : nullptr;
  }
  // Inserts keys [0, n) with value = key + base in one transaction per key.
  void Populate(uint64_t n, uint64_t base = 1000) {
    for (uint64_t k = 0; k < n; ++k) {
      a_->start();
      ASSERT_TRUE(a_->insert(kv_, Key(k), Value(k + base, kValue)).ok());
      Status st = a_->commit();
      ASSERT_TRUE(st.ok()) << st.ToString();
    }
  }
  uint64_t ReadOne(uint64_t k) {
    b_->start();
    auto r = b_->read(kv_, Key(k));
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(b_->commit().ok());
    return r.ok() ? U64(*r) : ~0ull;
  }

  std::unique_ptr<TxEnv> env_;
  std::unique_ptr<TxClient> client_;
  uint16_t kv_ = 0;
  std::unique_ptr<BlockingTx> a_, b_;
};

TEST_P(TxClientE2E, ConnectLearnsTablesAcrossPartitions) {
  EXPECT_EQ(client_->key_size(kv_), 8u);
  EXPECT_EQ(client_->value_size(kv_), kValue);
  auto other = client_->table("other");
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(client_->key_size(*other), 16u);
  EXPECT_EQ(client_->table("nope").status().code(), Code::kNotFound);
  // Only one of the two servers: partition 1 is missing.
  auto one = TxClient::Connect(*env_->node, {env_->addresses[0]});
  EXPECT_EQ(one.status().code(), Code::kFailedPrecondition) << one.status().ToString();
}

TEST_P(TxClientE2E, CrudTransactions) {
  Populate(40);
  for (uint64_t k = 0; k < 40; ++k) EXPECT_EQ(ReadOne(k), k + 1000);
  // Multi-key update (both partitions), read-your-writes, then commit.
  a_->start();
  for (uint64_t k = 0; k < 10; ++k) {
    auto w = a_->write(kv_, Key(k));
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    const uint64_t v = U64(*w) + 1;
    std::memcpy(w->data(), &v, 8);
    auto r = a_->read(kv_, Key(k));
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(U64(*r), v);
  }
  ASSERT_TRUE(a_->remove(kv_, Key(39)).ok());
  Status st = a_->commit();
  ASSERT_TRUE(st.ok()) << st.ToString();
  for (uint64_t k = 0; k < 10; ++k) EXPECT_EQ(ReadOne(k), k + 1001);
  b_->start();
  EXPECT_EQ(b_->read(kv_, Key(39)).status().code(), Code::kNotFound);
  EXPECT_EQ(b_->tx().abort_reason(), TxAbortReason::kNotFound);
  EXPECT_TRUE(b_->abort().ok());
  const TxClientStats s = client_->stats();
  EXPECT_GT(s.one_sided_hits, 0u);
  EXPECT_GE(s.commits, 40u + 40u + 11u);
  EXPECT_EQ(s.aborts[static_cast<size_t>(TxAbortReason::kNotFound)], 1u);
}

TEST_P(TxClientE2E, AbortsByReason) {
  Populate(8);
  // locked: a holds k0; b's write and b's read both abort.
  a_->start();
  ASSERT_TRUE(a_->write(kv_, Key(0)).ok());
  b_->start();
  Status st = b_->write(kv_, Key(0)).status();
  EXPECT_EQ(TxAbortReasonOf(st), TxAbortReason::kLocked) << st.ToString();
  EXPECT_EQ(b_->tx().abort_reason(), TxAbortReason::kLocked);
  b_->start();
  st = b_->read(kv_, Key(0)).status();
  EXPECT_EQ(TxAbortReasonOf(st), TxAbortReason::kLocked) << st.ToString();
  ASSERT_TRUE(a_->abort().ok());
  // validation: a reads k1 and k2, b changes k1, a's commit fails.
  a_->start();
  ASSERT_TRUE(a_->read(kv_, Key(1)).ok());
  ASSERT_TRUE(a_->read(kv_, Key(2)).ok());
  b_->start();
  ASSERT_TRUE(b_->write(kv_, Key(1)).ok());
  ASSERT_TRUE(b_->commit().ok());
  st = a_->commit();
  EXPECT_EQ(TxAbortReasonOf(st), TxAbortReason::kValidation) << st.ToString();
  // exists.
  a_->start();
  st = a_->insert(kv_, Key(3), Value(1, kValue));
  EXPECT_EQ(TxAbortReasonOf(st), TxAbortReason::kExists) << st.ToString();
  // not found (write of a missing key), then the caller aborts.
  a_->start();
  st = a_->write(kv_, Key(100)).status();
  EXPECT_EQ(st.code(), Code::kNotFound) << st.ToString();
  EXPECT_TRUE(a_->abort().ok());
  const TxClientStats s = client_->stats();
  EXPECT_EQ(s.aborts[static_cast<size_t>(TxAbortReason::kLocked)], 2u);
  EXPECT_EQ(s.aborts[static_cast<size_t>(TxAbortReason::kValidation)], 1u);
  EXPECT_EQ(s.aborts[static_cast<size_t>(TxAbortReason::kExists)], 1u);
  EXPECT_EQ(s.aborts[static_cast<size_t>(TxAbortReason::kNotFound)], 1u);
  EXPECT_EQ(s.aborts[static_cast<size_t>(TxAbortReason::kUser)], 1u);
  // The service counted them too (STAT "tx").
  size_t locked = 0;
  for (auto& srv : env_->servers) {
    const std::string stat = srv->stats_json();
    EXPECT_NE(stat.find("\"tx\""), std::string::npos);
    if (stat.find("\"locked\":1") != std::string::npos) ++locked;
  }
  EXPECT_EQ(locked, 1u);  // the TX_LOCK refusal (the read's was client-side)
}

// An audit reads account 0, a transfer 0 -> 1 commits (both partitions or one), the audit reads
// account 1: its snapshot is inconsistent. With validation the audit aborts ("validation"); with
// TxClientFaults::skip_validation it commits the wrong total.
TEST_P(TxClientE2E, WithoutValidationAnInterleavedAuditCommitsAWrongTotal) {
  for (bool skip : {false, true}) {
    Populate(2, skip ? 2000 : 1000);  // keys 0, 1 (reinserted on the second round)
    TxClientOptions o;
    o.faults.skip_validation = skip;
    auto audit_client = env_->Connect(o);
    ASSERT_TRUE(audit_client.ok());
    auto audit = BlockingTx::Create(**audit_client, *env_->node);
    ASSERT_TRUE(audit.ok());
    (*audit)->start();
    auto r0 = (*audit)->read(kv_, Key(0));
    ASSERT_TRUE(r0.ok());
    a_->start();
    auto w0 = a_->write(kv_, Key(0));
    auto w1 = a_->write(kv_, Key(1));
    ASSERT_TRUE(w0.ok() && w1.ok());
    const uint64_t n0 = U64(*w0) - 10, n1 = U64(*w1) + 10;
    std::memcpy(w0->data(), &n0, 8);
    std::memcpy(w1->data(), &n1, 8);
    ASSERT_TRUE(a_->commit().ok());
    auto r1 = (*audit)->read(kv_, Key(1));
    ASSERT_TRUE(r1.ok());
    const uint64_t seen = U64(*r0) + U64(*r1);
    const uint64_t total = n0 + n1;
    EXPECT_NE(seen, total);  // the snapshot is inconsistent either way
    const Status st = (*audit)->commit();
    if (skip) {
      EXPECT_TRUE(st.ok()) << "without validation the wrong total commits: " << st.ToString();
    } else {
      EXPECT_EQ(TxAbortReasonOf(st), TxAbortReason::kValidation) << st.ToString();
    }
    // Remove both for the next round.
    a_->start();
    ASSERT_TRUE(a_->remove(kv_, Key(0)).ok());
    ASSERT_TRUE(a_->remove(kv_, Key(1)).ok());
    ASSERT_TRUE(a_->commit().ok());
  }
}

TEST_P(TxClientE2E, AbortLeavesNoTrace) {
  Populate(4);
  a_->start();
  auto w = a_->write(kv_, Key(1));
  ASSERT_TRUE(w.ok());
  const uint64_t junk = 77;
  std::memcpy(w->data(), &junk, 8);
  ASSERT_TRUE(a_->insert(kv_, Key(50), Value(5, kValue)).ok());
  ASSERT_TRUE(a_->remove(kv_, Key(2)).ok());
  ASSERT_TRUE(a_->abort().ok());
  EXPECT_EQ(ReadOne(1), 1001u);
  EXPECT_EQ(ReadOne(2), 1002u);
  b_->start();
  EXPECT_EQ(b_->read(kv_, Key(50)).status().code(), Code::kNotFound);
  ASSERT_TRUE(b_->abort().ok());
  // Nothing stays locked: another transaction takes all three at once.
  b_->start();
  ASSERT_TRUE(b_->write(kv_, Key(1)).ok());
  ASSERT_TRUE(b_->write(kv_, Key(2)).ok());
  ASSERT_TRUE(b_->insert(kv_, Key(50), Value(5, kValue)).ok());
  EXPECT_TRUE(b_->commit().ok());
}

TEST_P(TxClientE2E, StaleCachedAddressFallsBackToRpc) {
  Populate(30);
  EXPECT_EQ(ReadOne(7), 1007u);  // caches k7's address
  const TxClientStats s0 = client_->stats();
  EXPECT_EQ(ReadOne(7), 1007u);  // served one-sided from the cache
  const TxClientStats s1 = client_->stats();
  EXPECT_EQ(s1.one_sided_hits, s0.one_sided_hits + 1);
  EXPECT_EQ(s1.rpc_lookups, s0.rpc_lookups);
  // Remove k7 through a second client (its own cache), so this client's cache stays stale;
  // then reuse the slot with other keys and reinsert k7 elsewhere.
  auto other = env_->Connect();
  ASSERT_TRUE(other.ok());
  auto o = BlockingTx::Create(**other, *env_->node);
  ASSERT_TRUE(o.ok());
  (*o)->start();
  ASSERT_TRUE((*o)->remove(kv_, Key(7)).ok());
  ASSERT_TRUE((*o)->commit().ok());
  for (uint64_t k = 100; k < 140; ++k) {
    (*o)->start();
    ASSERT_TRUE((*o)->insert(kv_, Key(k), Value(k, kValue)).ok());
    ASSERT_TRUE((*o)->commit().ok());
  }
  (*o)->start();
  ASSERT_TRUE((*o)->insert(kv_, Key(7), Value(4242, kValue)).ok());
  ASSERT_TRUE((*o)->commit().ok());
  // The stale address holds another key or an empty slot: the check refuses it, TX_LOOKUP
  // answers with the new value and address.
  const TxClientStats s2 = client_->stats();
  EXPECT_EQ(ReadOne(7), 4242u);
  const TxClientStats s3 = client_->stats();
  EXPECT_EQ(s3.one_sided_misses, s2.one_sided_misses + 1);
  EXPECT_EQ(s3.rpc_lookups, s2.rpc_lookups + 1);
  EXPECT_EQ(ReadOne(7), 4242u);  // and the fresh address is one-sided again
  EXPECT_EQ(client_->stats().one_sided_hits, s3.one_sided_hits + 1);
}

TEST_P(TxClientE2E, RpcOnlyClientAndBadInput) {
  Populate(5);
  TxClientOptions o;
  o.one_sided_reads = false;
  auto rpc = env_->Connect(o);
  ASSERT_TRUE(rpc.ok());
  auto t = BlockingTx::Create(**rpc, *env_->node);
  ASSERT_TRUE(t.ok());
  (*t)->start();
  auto r = (*t)->read(kv_, Key(3));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(U64(*r), 1003u);
  EXPECT_TRUE((*t)->commit().ok());
  EXPECT_EQ((*rpc)->stats().one_sided_hits, 0u);
  EXPECT_EQ((*rpc)->stats().rpc_lookups, 1u);
  // Bad input: wrong key size, unknown table, oversized value, no transaction.
  (*t)->start();
  EXPECT_EQ((*t)->read(kv_, Key(1, 16)).status().code(), Code::kInvalidArgument);
  EXPECT_EQ((*t)->read(99, Key(1)).status().code(), Code::kNotFound);
  EXPECT_EQ((*t)->insert(kv_, Key(9), Value(1, kValue + 8)).code(), Code::kInvalidArgument);
  EXPECT_TRUE((*t)->abort().ok());
  EXPECT_EQ((*t)->commit().code(), Code::kFailedPrecondition);
}

INSTANTIATE_TEST_SUITE_P(Backends, TxClientE2E, kTxBackends, TxBackendName);

// Overflow chains read one-sidedly (docs/tx.md "Client"): 2 main buckets of one slot and 10
// overflow buckets, 8 keys, so at least 6 sit in chains; a client without the address cache
// guesses the main bucket on every read and follows the chain ("continue at"). A client that
// stops at the main bucket (TxClientFaults::no_chain_follow) shows the chains exist: it needs
// TX_LOOKUP for them. FARMEM_TX_FAULT=no_chain gives the first client that fault too (then the
// test fails).
class TxChains : public ::testing::TestWithParam<std::string> {};

TEST_P(TxChains, KeysInOverflowChainsAreReadOneSided) {
  auto env = TxEnv::Start(GetParam(), 1, {"chain:8:8:2:1"}, 5000, 500);
  ASSERT_TRUE(env->node);
  const char* fault = std::getenv("FARMEM_TX_FAULT");
  const bool no_chain = fault != nullptr && std::string(fault) == "no_chain";
  if (no_chain) std::printf("[ fault    ] FARMEM_TX_FAULT=no_chain\n");
  auto writer = env->Connect();
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();
  auto w = BlockingTx::Create(**writer, *env->node);
  ASSERT_TRUE(w.ok());
  constexpr uint64_t kKeys = 8;
  for (uint64_t k = 0; k < kKeys; ++k) {
    (*w)->start();
    ASSERT_TRUE((*w)->insert(0, Key(k), Value(k + 500, 8)).ok());
    ASSERT_TRUE((*w)->commit().ok());
  }
  const auto read_all = [&](bool stop_at_main_bucket) {
    TxClientOptions o;
    o.address_cache = false;
    o.faults.no_chain_follow = stop_at_main_bucket;
    auto c = env->Connect(o);
    EXPECT_TRUE(c.ok());
    if (!c.ok()) return TxClientStats{};
    auto r = BlockingTx::Create(**c, *env->node);
    EXPECT_TRUE(r.ok());
    if (!r.ok()) return TxClientStats{};
    for (uint64_t k = 0; k < kKeys; ++k) {
      (*r)->start();
      auto v = (*r)->read(0, Key(k));
      EXPECT_TRUE(v.ok()) << k << ": " << v.status().ToString();
      if (v.ok()) {
        EXPECT_EQ(U64(*v), k + 500);
      }
      EXPECT_TRUE((*r)->commit().ok());
    }
    // A missing key: the chain ends without it, the owner says "not found".
    (*r)->start();
    EXPECT_EQ((*r)->read(0, Key(999)).status().code(), Code::kNotFound);
    (void)(*r)->abort();
    return (*c)->stats();
  };
  const TxClientStats main_only = read_all(true);
  EXPECT_GE(main_only.rpc_lookups, kKeys - 2 + 1) << "fewer keys in chains than expected";
  const TxClientStats chained = read_all(no_chain);
  EXPECT_EQ(chained.one_sided_hits, kKeys);
  EXPECT_EQ(chained.one_sided_chain_hits, kKeys - (main_only.one_sided_hits));
  EXPECT_EQ(main_only.one_sided_chain_hits, 0u);
  EXPECT_EQ(chained.rpc_lookups, 1u);  // the missing key only
  std::printf(
      "[ info     ] main bucket only: %llu one-sided, %llu TX_LOOKUP; chains followed: "
      "%llu one-sided, %llu TX_LOOKUP\n",
      static_cast<unsigned long long>(main_only.one_sided_hits),
      static_cast<unsigned long long>(main_only.rpc_lookups),
      static_cast<unsigned long long>(chained.one_sided_hits),
      static_cast<unsigned long long>(chained.rpc_lookups));
}

INSTANTIATE_TEST_SUITE_P(Backends, TxChains, kTxBackends, TxBackendName);

}  // namespace
}  // namespace farmem::tx_test
