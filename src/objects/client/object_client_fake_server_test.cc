// ObjectClient against a fake farmemd: a plain Node that exports memory the test controls as the
// "objects" region and answers OBJ_INFO (and canned replies for other opcodes). The test crafts
// slot images with the real layout code — locked, torn, moved, freed, homed elsewhere — so every
// branch of the one-sided read path and every malformed-reply check runs deterministically,
// which a real server under load almost never produces. The header-recheck (seqlock) tests change
// the fake's memory between the steps of a read through the client's test seam.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "farmem/objects.h"
#include "node/node_test_util.h"
#include "objects/client/object_client_internal.h"
#include "objects/format/object_layout.h"
#include "objects/format/object_wire.h"
#include "service/session_registry.h"

namespace farmem {
namespace {

namespace wire = object_wire;

constexpr uint32_t kBlock = 4096;
constexpr size_t kRegionLen = 8 * kBlock;
// Classes of the fake: 64-byte and 72-byte slots with 16-bit IDs (72-byte slots sit at every
// alignment mod 64), a 256-byte offset-only class.
constexpr uint16_t kC64 = 0, kC72 = 1, kCOff = 2;
const uint32_t kSlots[] = {64, 72, 256};
const uint32_t kMasks[] = {0xffff, 0xffff, 0};

class FakeServer {
 public:
  // Starts a node exporting `objects` and serving OBJ_INFO; `info_key` overrides the region key
  // OBJ_INFO reports (to test the handshake cross-check).
  explicit FakeServer(std::optional<uint64_t> info_key = std::nullopt) {
    mem_ = static_cast<uint8_t*>(std::aligned_alloc(kBlock, kRegionLen));
    std::memset(mem_, 0, kRegionLen);
    auto n = Node::Create(node::testing::MakeConfig("tcp", "fake-farmemd"));
    if (!n.ok()) {
      ADD_FAILURE() << n.status().ToString();
      return;
    }
    node_ = std::move(*n);
    auto region = node_->export_region("objects", mem_, kRegionLen, Access::kReadOnly);
    if (!region.ok()) {
      ADD_FAILURE() << region.status().ToString();
      return;
    }
    key_ = info_key.value_or(region->key);
    for (uint16_t op = wire::kOpInfo; op <= wire::kOpCompact; ++op) {
      Status st =
          node_->register_rpc(op, [this](const RpcCall& call, std::vector<std::byte>& reply) {
            return Serve(call, reply);
          });
      if (!st.ok()) ADD_FAILURE() << st.ToString();
    }
    // Sessions as farmemd answers them (a real registry; this fake owns no objects).
    for (uint16_t op : {kOpSessionOpen, kOpSessionKeepalive, kOpSessionClose}) {
      Status st =
          node_->register_rpc(op, [this, op](const RpcCall& call, std::vector<std::byte>& reply) {
            if (op == kOpSessionOpen) return sessions_.ServeOpen(call, reply);
            if (op == kOpSessionKeepalive) return sessions_.ServeKeepalive(call, reply);
            return sessions_.ServeClose(call, reply);
          });
      if (!st.ok()) ADD_FAILURE() << st.ToString();
    }
    Status st = node_->start();
    if (!st.ok()) ADD_FAILURE() << st.ToString();
  }
  ~FakeServer() {
    if (node_) node_->stop();
    std::free(mem_);
  }

  std::string address() const { return node_->bootstrap_address(); }

  // Publishes a slot image for an object with `id` (and header fields) at region offset `off`.
  void Put(uint64_t off, uint16_t size_class, uint16_t id, std::span<const uint8_t> payload,
           uint8_t version = 7, bool locked = false, std::optional<uint32_t> home = std::nullopt) {
    std::vector<uint8_t> image(kSlots[size_class]);
    corm::Header h;
    h.tag = id;  // generation 0
    h.size_class = static_cast<uint8_t>(size_class);
    h.allocated = true;
    h.locked = locked;
    h.version = version;
    h.home_block = home.value_or(static_cast<uint32_t>(off / kBlock));
    corm::EncodeSlot(image, off, h, payload);
    corm::PublishSlot(mem_ + off, image);
  }
  void Clear(uint64_t off, uint16_t size_class) {
    std::vector<uint8_t> zero(kSlots[size_class], 0);
    corm::PublishSlot(mem_ + off, zero);
  }
  uint8_t* at(uint64_t off) { return mem_ + off; }
  void SetHeaderLocked(uint64_t off, bool locked) {
    uint64_t w = corm::LoadHeader(mem_ + off);
    w = locked ? (w | corm::hdr::kLockBit) : (w & ~corm::hdr::kLockBit);
    corm::StoreHeader(mem_ + off, w);
  }
  // Overwrites byte `i` of the slot at `off` (through its aligned word, atomically).
  void PokeByte(uint64_t off, size_t i, uint8_t value) {
    auto* word = reinterpret_cast<uint64_t*>(mem_ + ((off + i) & ~uint64_t{7}));
    uint64_t w = std::atomic_ref<uint64_t>(*word).load();
    const int shift = static_cast<int>(((off + i) & 7) * 8);
    w = (w & ~(uint64_t{0xff} << shift)) | (uint64_t{value} << shift);
    std::atomic_ref<uint64_t>(*word).store(w, std::memory_order_release);
  }

  // The next replies to `opcode`: raw bytes (nullopt = answer with an error).
  void Canned(uint16_t opcode, std::vector<std::byte> bytes) {
    std::lock_guard lock(mu_);
    canned_[opcode] = std::move(bytes);
  }
  template <typename T>
  void CannedStruct(uint16_t opcode, const T& msg) {
    std::vector<std::byte> b(sizeof(T));
    std::memcpy(b.data(), &msg, sizeof(T));
    Canned(opcode, std::move(b));
  }
  int calls(uint16_t opcode) {
    std::lock_guard lock(mu_);
    return calls_[opcode];
  }

 private:
  Status Serve(const RpcCall& call, std::vector<std::byte>& reply) {
    std::lock_guard lock(mu_);
    ++calls_[call.opcode];
    if (call.opcode == wire::kOpInfo) {
      wire::InfoReply head{key_, kRegionLen, kBlock, 16, 1, 3};
      reply.resize(sizeof(head) + 3 * sizeof(wire::WireClass));
      std::memcpy(reply.data(), &head, sizeof(head));
      for (int c = 0; c < 3; ++c) {
        wire::WireClass wc{kSlots[c], static_cast<uint32_t>(corm::PayloadCapacity(kSlots[c])),
                           kMasks[c], kBlock};
        std::memcpy(reply.data() + sizeof(head) + c * sizeof(wc), &wc, sizeof(wc));
      }
      return Status::OK();
    }
    auto it = canned_.find(call.opcode);
    if (it == canned_.end()) return Status::NotFound("fake: no canned reply");
    reply = it->second;
    return Status::OK();
  }

  uint8_t* mem_ = nullptr;
  SessionRegistry sessions_;  // before node_: handlers use it until the node stops
  std::unique_ptr<Node> node_;
  uint64_t key_ = 0;
  std::mutex mu_;
  std::map<uint16_t, std::vector<std::byte>> canned_;
  std::map<uint16_t, int> calls_;
};

class FakeServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fake_ = std::make_unique<FakeServer>();
    auto n = Node::Create(node::testing::MakeConfig("tcp", "client"));
    ASSERT_TRUE(n.ok());
    node_ = std::move(*n);
    ASSERT_TRUE(node_->start().ok());
  }
  void TearDown() override {
    clients_.clear();
    if (node_) node_->stop();
    fake_.reset();
  }

  ObjectClient& Client(ObjectClientOptions o = {}) {
    std::vector<std::string> servers{fake_->address()};
    auto c = ObjectClient::Connect(*node_, servers, o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    clients_.push_back(std::move(*c));
    return *clients_.back();
  }

  static Ptr P(uint64_t off, uint16_t size_class, uint16_t id) {
    Ptr p;
    p.offset = off;
    p.size_class = size_class;
    p.id = id;
    p.flags = Ptr::kPtrValid;
    return p;
  }
  static std::vector<uint8_t> Payload(size_t n, uint8_t seed) {
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 3);
    return v;
  }
  static bool Same(const std::vector<std::byte>& out, const std::vector<uint8_t>& want) {
    return out.size() >= want.size() && std::memcmp(out.data(), want.data(), want.size()) == 0;
  }

  std::unique_ptr<FakeServer> fake_;
  std::unique_ptr<Node> node_;
  std::vector<std::unique_ptr<ObjectClient>> clients_;
};

TEST_F(FakeServerTest, DirectReadDecodesSlotsAtEveryAlignment) {
  ObjectClient& c = Client();
  EXPECT_EQ(c.server_info(0).name, "fake-farmemd");
  // Slots 0..7 of a 72-byte class start at every offset ≡ 0, 8, .., 56 (mod 64), so the line
  // version byte falls at every possible place in the payload.
  for (uint64_t slot = 0; slot < 8; ++slot) {
    const uint64_t off = kBlock + slot * 72;
    auto pay = Payload(corm::PayloadCapacity(72), static_cast<uint8_t>(off));
    fake_->Put(off, kC72, 0x1234, pay, 9);
    Ptr p = P(off, kC72, 0x1234);
    std::vector<std::byte> out(pay.size());
    Result<size_t> r = c.direct_read(p, out);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(*r, pay.size());
    EXPECT_TRUE(Same(out, pay));
  }
  EXPECT_EQ(c.stats().direct_ok, 8u);
}

TEST_F(FakeServerTest, LockedSlotIsRetriedUntilReleasedOrTheBudgetEnds) {
  ObjectClientOptions o;
  o.retry_budget = std::chrono::milliseconds(30);
  ObjectClient& c = Client(o);
  const uint64_t off = kBlock + 64;
  auto pay = Payload(40, 1);
  fake_->Put(off, kC64, 42, pay, 3, /*locked=*/true);
  Ptr p = P(off, kC64, 42);
  std::vector<std::byte> out(40);
  Result<size_t> r = c.direct_read(p, out);
  EXPECT_EQ(r.status().code(), Code::kTimedOut) << r.status().ToString();
  EXPECT_NE(r.status().message().find("locked"), std::string_view::npos);
  EXPECT_GT(c.stats().locked_retries, 0u);

  // Released while the reader is backing off: the read succeeds.
  ObjectClientOptions patient;
  patient.retry_budget = std::chrono::milliseconds(5000);
  ObjectClient& c2 = Client(patient);
  // Unlock once the reader has seen the lock and is backing off (its locked_retries counter
  // moved), not after a guessed delay; the deadline only bounds a broken client.
  std::thread unlock([&] {
    const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (c2.stats().locked_retries == 0 && std::chrono::steady_clock::now() < limit) {
      std::this_thread::yield();
    }
    fake_->SetHeaderLocked(off, false);
  });
  r = c2.direct_read(p, out);
  unlock.join();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(Same(out, pay));
  EXPECT_GT(c2.stats().locked_retries, 0u);
}

TEST_F(FakeServerTest, TornCopiesAreRejected) {
  ObjectClientOptions o;
  o.retry_budget = std::chrono::milliseconds(20);
  ObjectClient& c = Client(o);
  // A 72-byte slot at an offset ≡ 8 (mod 64): a line version byte at slot byte 56, tail at 71.
  const uint64_t off = 2 * kBlock + 72;
  auto pay = Payload(60, 5);
  std::vector<std::byte> out(60);
  for (size_t byte : {size_t{71}, size_t{56}}) {
    SCOPED_TRACE("version byte " + std::to_string(byte));
    fake_->Put(off, kC72, 7, pay, 20);
    ASSERT_TRUE(corm::IsVersionByte(off, 72, byte));
    fake_->PokeByte(off, byte, 21);  // a newer write's version: mixed copy
    Ptr p = P(off, kC72, 7);
    Result<size_t> r = c.direct_read(p, out);
    EXPECT_EQ(r.status().code(), Code::kTimedOut) << r.status().ToString();
    EXPECT_NE(r.status().message().find("torn"), std::string_view::npos);
    Result<size_t> s = c.scan_read(p, out);
    EXPECT_EQ(s.status().code(), Code::kTimedOut) << "scan_read checks the found slot too";
  }
  EXPECT_GT(c.stats().torn_retries, 0u);
  fake_->Put(off, kC72, 7, pay, 20);
  Ptr p = P(off, kC72, 7);
  ASSERT_TRUE(c.direct_read(p, out).ok());
}

TEST_F(FakeServerTest, MovedObjectsAreFoundByScanAndCorrectedInPlace) {
  ObjectClientOptions o;
  o.correction = Correction::kScan;
  ObjectClient& c = Client(o);
  const uint64_t old_off = 3 * kBlock + 5 * 64, new_off = 3 * kBlock + 60 * 64;
  auto pay = Payload(50, 9);
  fake_->Put(old_off, kC64, 0x0bad, Payload(50, 0), 1);  // another object took the old slot
  fake_->Put(new_off, kC64, 0x1111, pay, 4);
  Ptr p = P(old_off, kC64, 0x1111);
  std::vector<std::byte> out(50);
  Result<size_t> d = c.direct_read(p, out);
  EXPECT_EQ(d.status().code(), Code::kMoved) << d.status().ToString();
  EXPECT_EQ(p.offset, old_off);
  Result<size_t> s = c.scan_read(p, out);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(p.offset, new_off);
  EXPECT_TRUE(Same(out, pay));
  EXPECT_EQ(c.stats().corrections, 1u);

  // read_any does both steps; a freed old slot looks the same.
  fake_->Clear(old_off, kC64);
  Ptr q = P(old_off, kC64, 0x1111);
  Result<size_t> any = c.read_any(q, out);
  ASSERT_TRUE(any.ok()) << any.status().ToString();
  EXPECT_EQ(q.offset, new_off);
  EXPECT_EQ(c.stats().corrections, 2u);
  EXPECT_EQ(fake_->calls(wire::kOpLocate), 0) << "scan mode never asks the server";

  // The object is gone from the block: NotFound.
  fake_->Clear(new_off, kC64);
  Ptr gone = P(old_off, kC64, 0x1111);
  Result<size_t> nf = c.read_any(gone, out);
  EXPECT_EQ(nf.status().code(), Code::kNotFound) << nf.status().ToString();
}

TEST_F(FakeServerTest, AskOwnerUsesLocateAndChecksItsReply) {
  ObjectClientOptions o;
  o.correction = Correction::kAskOwner;
  ObjectClient& c = Client(o);
  const uint64_t old_off = kBlock, new_off = kBlock + 10 * 64;
  auto pay = Payload(30, 2);
  fake_->Put(new_off, kC64, 0x2222, pay, 6);
  fake_->CannedStruct(wire::kOpLocate, wire::PtrReply{{new_off, 0x2222, kC64, 0, 0}});
  Ptr p = P(old_off, kC64, 0x2222);
  std::vector<std::byte> out(30);
  Result<size_t> r = c.read_any(p, out);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(p.offset, new_off);
  EXPECT_TRUE(Same(out, pay));
  EXPECT_EQ(fake_->calls(wire::kOpLocate), 1);
  EXPECT_EQ(c.stats().scans, 0u);
  EXPECT_EQ(c.stats().corrections, 1u);

  // A reply with another ID and the same generation: a merge re-drew the object's ID (the
  // server found it through the rename its home and generation name). Accepted, p.id corrected.
  fake_->CannedStruct(wire::kOpLocate, wire::PtrReply{{new_off, 0x3333, kC64, 0, 0}});
  Ptr renamed = P(old_off, kC64, 0x2222);
  ASSERT_TRUE(c.locate(renamed).ok());
  EXPECT_EQ(renamed.id, 0x3333);
  EXPECT_EQ(renamed.offset, new_off);
  EXPECT_EQ(c.stats().corrections, 2u);

  struct Bad {
    const char* what;
    std::vector<std::byte> reply;
  };
  auto bytes = [](wire::PtrReply m) {
    std::vector<std::byte> b(sizeof(m));
    std::memcpy(b.data(), &m, sizeof(m));
    return b;
  };
  std::vector<Bad> bad = {
      {"another generation", bytes({{new_off, 0x2222, kC64, 1, 0}})},
      {"another class", bytes({{new_off, 0x2222, kC72, 0, 0}})},
      {"another block", bytes({{2 * kBlock, 0x2222, kC64, 0, 0}})},
      {"off the slot grid", bytes({{kBlock + 8, 0x2222, kC64, 0, 0}})},
      {"short", std::vector<std::byte>(8)},
  };
  for (const Bad& b : bad) {
    fake_->Canned(wire::kOpLocate, b.reply);
    Ptr q = P(old_off, kC64, 0x2222);
    Status st = c.locate(q);
    EXPECT_EQ(st.code(), Code::kProtocol) << b.what << ": " << st.ToString();
    EXPECT_EQ(q.offset, old_off) << b.what << ": a bad reply must not change the pointer";
  }
}

TEST_F(FakeServerTest, SlotHomedElsewhereIsNotOurObject) {
  ObjectClient& c = Client();
  const uint64_t off = 4 * kBlock + 2 * 64;
  fake_->Put(off, kC64, 0x4444, Payload(20, 1), 2, false, /*home=*/6);
  Ptr p = P(off, kC64, 0x4444);
  std::vector<std::byte> out(20);
  EXPECT_EQ(c.direct_read(p, out).status().code(), Code::kMoved);
  // The scan skips a slot of another home, misses, and asks the server, which (no canned
  // reply: NotFound) says the object is gone.
  Result<size_t> s = c.scan_read(p, out);
  EXPECT_EQ(s.status().code(), Code::kNotFound) << s.status().ToString();
  EXPECT_EQ(fake_->calls(wire::kOpLocate), 1);
}

TEST_F(FakeServerTest, OffsetOnlyClassNeverMoves) {
  ObjectClient& c = Client();
  const uint64_t off = 5 * kBlock + 3 * 256;
  auto pay = Payload(200, 4);
  fake_->Put(off, kCOff, 0, pay, 1);
  Ptr p = P(off, kCOff, 0);
  std::vector<std::byte> out(200);
  ASSERT_TRUE(c.direct_read(p, out).ok());
  ASSERT_TRUE(c.scan_read(p, out).ok());
  EXPECT_TRUE(Same(out, pay));
  fake_->Clear(off, kCOff);
  EXPECT_EQ(c.direct_read(p, out).status().code(), Code::kNotFound);
  EXPECT_EQ(c.read_any(p, out).status().code(), Code::kNotFound);
  EXPECT_EQ(c.stats().moved, 0u);
}

TEST_F(FakeServerTest, MalformedRepliesAreProtocolErrors) {
  ObjectClient& c = Client();
  auto ptr_reply = [](uint64_t off, uint16_t id, uint16_t cls) {
    return wire::PtrReply{{off, id, cls, 0, 0}};
  };
  fake_->Canned(wire::kOpAlloc, std::vector<std::byte>(3));
  EXPECT_EQ(c.alloc(10).status().code(), Code::kProtocol);
  fake_->CannedStruct(wire::kOpAlloc, ptr_reply(kBlock, 1, 9));  // no class 9
  EXPECT_EQ(c.alloc(10).status().code(), Code::kProtocol);
  fake_->CannedStruct(wire::kOpAlloc, ptr_reply(kBlock, 1, kC64));  // too small for 100 B
  EXPECT_EQ(c.alloc(100).status().code(), Code::kProtocol);
  fake_->CannedStruct(wire::kOpAlloc, ptr_reply(kRegionLen, 1, kC64));  // outside the region
  EXPECT_EQ(c.alloc(10).status().code(), Code::kProtocol);
  fake_->CannedStruct(wire::kOpAlloc, ptr_reply(kBlock + 64, 0x55, kC64));
  Result<Ptr> ok = c.alloc(10);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->offset, kBlock + 64);
  EXPECT_TRUE(ok->valid());

  Ptr p = *ok;
  fake_->Canned(wire::kOpFree, std::vector<std::byte>(4));  // FREE replies are empty
  EXPECT_EQ(c.free(p).code(), Code::kProtocol);
  EXPECT_TRUE(p.valid()) << "a failed free keeps the pointer";
  fake_->Canned(wire::kOpRead, std::vector<std::byte>(5));  // shorter than a PtrReply
  std::vector<std::byte> out(20);
  EXPECT_EQ(c.read(p, out).status().code(), Code::kProtocol);
  fake_->Canned(wire::kOpCompact, {std::byte{'{'}, std::byte{'x'}});
  EXPECT_EQ(c.compact(0).status().code(), Code::kProtocol);
  std::string j = R"({"merges":-1})";
  std::vector<std::byte> jb(j.size());
  std::memcpy(jb.data(), j.data(), j.size());
  fake_->Canned(wire::kOpCompact, jb);
  EXPECT_EQ(c.compact(0).status().code(), Code::kProtocol);
  j = R"({"merges":2,"compaction":{"rounds":1}})";
  jb.resize(j.size());
  std::memcpy(jb.data(), j.data(), j.size());
  fake_->Canned(wire::kOpCompact, jb);
  Result<CompactResult> cr = c.compact(0);
  ASSERT_TRUE(cr.ok()) << cr.status().ToString();
  EXPECT_EQ(cr->merges, 2u);
  EXPECT_EQ(nlohmann::json::parse(cr->stats_json).value("rounds", 0), 1);
}

// ---- Header recheck (ReadValidation::kVersionsAndHeaderRecheck) -------------------------------

using objects_internal::ReadStage;

// Runs `action(offset, copy)` at `stage` of the next `times` one-sided reads (times < 0: always),
// through the client's test seam; removes the hook when destroyed.
class Interpose {
 public:
  using Action = std::function<void(uint64_t offset, std::span<uint8_t> copy)>;
  Interpose(ReadStage stage, int times, Action action)
      : stage_(stage), left_(times), action_(std::move(action)) {
    objects_internal::SetReadHookForTesting(&Run, this);
  }
  ~Interpose() { objects_internal::SetReadHookForTesting(nullptr, nullptr); }
  Interpose(const Interpose&) = delete;
  Interpose& operator=(const Interpose&) = delete;
  // How often the stage was reached (whether or not the action still ran).
  int reached() const { return reached_.load(); }

 private:
  static void Run(void* ctx, ReadStage stage, uint64_t offset, std::span<uint8_t> copy) {
    auto* self = static_cast<Interpose*>(ctx);
    if (stage != self->stage_) return;
    self->reached_.fetch_add(1);
    if (self->left_ == 0) return;
    if (self->left_ > 0) --self->left_;
    self->action_(offset, copy);
  }

  ReadStage stage_;
  int left_;
  Action action_;
  std::atomic<int> reached_{0};
};

ObjectClientOptions Validation(ReadValidation v, int budget_ms = 2000) {
  ObjectClientOptions o;
  o.validation = v;
  o.retry_budget = std::chrono::milliseconds(budget_ms);
  return o;
}

TEST(ReadValidationChoice, OnlyNativeTcpIsTrustedWithoutARecheck) {
  using objects_internal::UsesHeaderRecheck;
  EXPECT_FALSE(UsesHeaderRecheck(ReadValidation::kAuto, "tcp"));
  EXPECT_TRUE(UsesHeaderRecheck(ReadValidation::kAuto, "fabric:shm"));
  EXPECT_TRUE(UsesHeaderRecheck(ReadValidation::kAuto, "fabric:tcp;ofi_rxm"));
  EXPECT_TRUE(UsesHeaderRecheck(ReadValidation::kAuto, "fabric:verbs;ofi_rxm"));
  EXPECT_FALSE(UsesHeaderRecheck(ReadValidation::kVersions, "fabric:shm"));
  EXPECT_TRUE(UsesHeaderRecheck(ReadValidation::kVersionsAndHeaderRecheck, "tcp"));

  using objects_internal::CheckHeaderWord;
  corm::Header h{0x1234, false, false, true, 9, 3};
  EXPECT_EQ(CheckHeaderWord(h.Pack(), 0x1234, 0xffff, 0, 3), corm::SlotCheck::kOk);
  EXPECT_EQ(CheckHeaderWord(h.Pack(), 0x1234, 0xffff, 0, 4), corm::SlotCheck::kMoved);
  EXPECT_EQ(CheckHeaderWord(h.Pack(), 0x1235, 0xffff, 0, 3), corm::SlotCheck::kMoved);
  EXPECT_EQ(CheckHeaderWord(h.Pack(), 0x9999, 0, 0, 3), corm::SlotCheck::kOk) << "offset-only";
  corm::Header locked = h, compacting = h, freed = h;
  locked.locked = true;
  compacting.compacting = true;
  freed.allocated = false;
  freed.locked = true;  // freed is reported first, as CheckSlot does
  EXPECT_EQ(CheckHeaderWord(locked.Pack(), 0x1234, 0xffff, 0, 3), corm::SlotCheck::kLocked);
  EXPECT_EQ(CheckHeaderWord(compacting.Pack(), 0x1234, 0xffff, 0, 3), corm::SlotCheck::kLocked);
  EXPECT_EQ(CheckHeaderWord(freed.Pack(), 0x1234, 0xffff, 0, 3), corm::SlotCheck::kFreed);
}

TEST_F(FakeServerTest, ValidationModeIsCheckedAndAutoTrustsNativeTcp) {
  std::vector<std::string> servers{fake_->address()};
  ObjectClientOptions bad;
  bad.validation = static_cast<ReadValidation>(7);
  auto c = ObjectClient::Connect(*node_, servers, bad);
  EXPECT_EQ(c.status().code(), Code::kInvalidArgument) << c.status().ToString();

  const uint64_t off = kBlock + 128;
  auto pay = Payload(40, 3);
  fake_->Put(off, kC64, 5, pay, 2);
  std::vector<std::byte> out(40);
  ObjectClient& autoc = Client();  // the fake and the client run native TCP
  ObjectClient& forced = Client(Validation(ReadValidation::kVersionsAndHeaderRecheck));
  for (ObjectClient* cl : {&autoc, &forced}) {
    Ptr p = P(off, kC64, 5);
    ASSERT_TRUE(cl->direct_read(p, out).ok());
    EXPECT_TRUE(Same(out, pay));
    ASSERT_TRUE(cl->scan_read(p, out).ok());
    EXPECT_TRUE(Same(out, pay));
  }
  EXPECT_EQ(autoc.stats().header_rechecks, 0u);
  EXPECT_EQ(forced.stats().header_rechecks, 2u);
  EXPECT_EQ(forced.stats().recheck_failures, 0u);
}

// The case the recheck exists for: a transport that loaded the slot's header word (and version
// bytes) after a write W completed, but some payload words before W stored them. The copy is
// consistent as far as CheckSlot can tell; only a header read that completed before the copy
// began shows that W happened in between.
TEST_F(FakeServerTest, HeaderRecheckRejectsAnOutOfOrderCopyThatPassesTheVersionCheck) {
  const uint64_t off = 2 * kBlock + 72;  // ≡ 8 (mod 64): a line version inside the payload
  const size_t cap = corm::PayloadCapacity(72);
  auto old_pay = Payload(cap, 5), new_pay = Payload(cap, 100);
  std::vector<uint8_t> mixed(cap);  // (vector::insert here trips a GCC 12 -Warray-bounds)
  for (size_t i = 0; i < cap; ++i) mixed[i] = i < cap / 2 ? old_pay[i] : new_pay[i];
  auto torn_copy = [&](uint64_t at, std::span<uint8_t> copy) {
    fake_->Put(at, kC72, 7, new_pay, 21);  // W completes during the copy ...
    corm::Header h{7, false, false, true, 21, static_cast<uint32_t>(at / kBlock), kC72};
    corm::EncodeSlot(copy, at, h, mixed);  // ... which holds W's header, half of its payload
    ASSERT_EQ(corm::CheckSlot(copy, at, 7, 0xffff, kC72), corm::SlotCheck::kOk);
  };
  std::vector<std::byte> out(cap);

  // Versions only: the copy is accepted. This is why that mode is for ordered copies only, and
  // it shows that the copy below really passes every version check.
  {
    fake_->Put(off, kC72, 7, old_pay, 20);
    ObjectClient& c = Client(Validation(ReadValidation::kVersions));
    Interpose torn(ReadStage::kAfterCopy, 1, torn_copy);
    Ptr p = P(off, kC72, 7);
    ASSERT_TRUE(c.direct_read(p, out).ok());
    EXPECT_TRUE(Same(out, mixed));
  }
  for (bool scan : {false, true}) {
    SCOPED_TRACE(scan ? "scan_read" : "direct_read");
    fake_->Put(off, kC72, 7, old_pay, 20);
    ObjectClient& c = Client(Validation(ReadValidation::kVersionsAndHeaderRecheck));
    Interpose torn(ReadStage::kAfterCopy, 1, torn_copy);
    Ptr p = P(off, kC72, 7);
    Result<size_t> r = scan ? c.scan_read(p, out) : c.direct_read(p, out);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(Same(out, new_pay)) << "the retry reads W's value";
    const ObjectClientStats st = c.stats();
    EXPECT_EQ(st.recheck_failures, 1u);
    EXPECT_EQ(st.header_rechecks, 2u);
    EXPECT_EQ(st.torn_retries, 0u);
    EXPECT_EQ(torn.reached(), 2);
  }
}

// A write that completes between the first header read and the copy, or between the copy and the
// second header read, changes the header: the copy is retried (conservatively: it may have been
// whole) and the retry returns the new value.
TEST_F(FakeServerTest, HeaderRecheckRetriesWhenAWriteLandsBetweenTheReads) {
  const uint64_t off = 3 * kBlock + 3 * 64;
  auto old_pay = Payload(50, 1), new_pay = Payload(50, 77);
  std::vector<std::byte> out(50);
  for (ReadStage stage : {ReadStage::kBeforeCopy, ReadStage::kAfterCopy}) {
    for (bool scan : {false, true}) {
      SCOPED_TRACE(std::string(stage == ReadStage::kBeforeCopy ? "before" : "after") +
                   " the copy, " + (scan ? "scan_read" : "direct_read"));
      fake_->Put(off, kC64, 0x77, old_pay, 250);
      ObjectClient& c = Client(Validation(ReadValidation::kVersionsAndHeaderRecheck));
      Interpose write(stage, 1, [&](uint64_t at, std::span<uint8_t>) {
        fake_->Put(at, kC64, 0x77, new_pay, 251);
      });
      Ptr p = P(off, kC64, 0x77);
      Result<size_t> r = scan ? c.scan_read(p, out) : c.direct_read(p, out);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_TRUE(Same(out, new_pay));
      EXPECT_EQ(c.stats().recheck_failures, 1u);
    }
  }
  // A slot that changes between every pair of reads is given up after the retry budget.
  ObjectClient& c = Client(Validation(ReadValidation::kVersionsAndHeaderRecheck, 20));
  uint8_t version = 1;
  Interpose busy(ReadStage::kAfterCopy, -1, [&](uint64_t at, std::span<uint8_t>) {
    fake_->Put(at, kC64, 0x77, new_pay, ++version);
  });
  Ptr p = P(off, kC64, 0x77);
  Result<size_t> r = c.direct_read(p, out);
  EXPECT_EQ(r.status().code(), Code::kTimedOut) << r.status().ToString();
  EXPECT_NE(r.status().message().find("changing"), std::string_view::npos) << r.status().ToString();
  EXPECT_GT(c.stats().recheck_failures, 0u);
}

// In recheck mode the first header read alone settles locked, moved and freed slots (no copy),
// and every other outcome of the version-only tests stays the same.
TEST_F(FakeServerTest, HeaderRecheckKeepsEveryOtherOutcome) {
  ObjectClient& c = Client(Validation(ReadValidation::kVersionsAndHeaderRecheck, 20));
  Interpose copies(ReadStage::kAfterCopy, 0, [](uint64_t, std::span<uint8_t>) {});
  std::vector<std::byte> out(60);

  // Decoding at every alignment.
  for (uint64_t slot = 0; slot < 8; ++slot) {
    const uint64_t off = kBlock + slot * 72;
    auto pay = Payload(corm::PayloadCapacity(72), static_cast<uint8_t>(off));
    fake_->Put(off, kC72, 0x1234, pay, 9);
    Ptr p = P(off, kC72, 0x1234);
    std::vector<std::byte> all(pay.size());
    ASSERT_TRUE(c.direct_read(p, all).ok());
    EXPECT_TRUE(Same(all, pay));
  }
  const int copied = copies.reached();
  EXPECT_EQ(copied, 8);

  // Locked: retried, then TimedOut, without ever copying the slot.
  const uint64_t off = 2 * kBlock + 72;
  fake_->Put(off, kC72, 7, Payload(60, 5), 20, /*locked=*/true);
  Ptr p = P(off, kC72, 7);
  Result<size_t> r = c.direct_read(p, out);
  EXPECT_EQ(r.status().code(), Code::kTimedOut);
  EXPECT_NE(r.status().message().find("locked"), std::string_view::npos);
  EXPECT_GT(c.stats().locked_retries, 0u);
  EXPECT_EQ(copies.reached(), copied);

  // Torn (a newer version byte in the copy): retried as torn.
  fake_->Put(off, kC72, 7, Payload(60, 5), 20);
  fake_->PokeByte(off, 56, 21);
  r = c.direct_read(p, out);
  EXPECT_EQ(r.status().code(), Code::kTimedOut);
  EXPECT_NE(r.status().message().find("torn"), std::string_view::npos);
  EXPECT_GT(c.stats().torn_retries, 0u);
  EXPECT_EQ(c.scan_read(p, out).status().code(), Code::kTimedOut);

  // Another object, or ours homed elsewhere, in the slot: moved (from the header alone).
  const int before_moved = copies.reached();
  fake_->Put(off, kC72, 8, Payload(60, 5), 20);
  EXPECT_EQ(c.direct_read(p, out).status().code(), Code::kMoved);
  fake_->Put(off, kC72, 7, Payload(60, 5), 20, false, /*home=*/6);
  EXPECT_EQ(c.direct_read(p, out).status().code(), Code::kMoved);
  Result<size_t> s = c.scan_read(p, out);  // skips the slot of another home; LOCATE: NotFound
  EXPECT_EQ(s.status().code(), Code::kNotFound) << s.status().ToString();
  fake_->Clear(off, kC72);
  EXPECT_EQ(c.direct_read(p, out).status().code(), Code::kMoved);
  EXPECT_EQ(copies.reached(), before_moved) << "decided by the first header read";

  // Offset-only: a free slot is NotFound.
  const uint64_t o = 5 * kBlock + 3 * 256;
  fake_->Put(o, kCOff, 0, Payload(200, 4), 1);
  Ptr q = P(o, kCOff, 0);
  std::vector<std::byte> big(200);
  ASSERT_TRUE(c.direct_read(q, big).ok());
  fake_->Clear(o, kCOff);
  EXPECT_EQ(c.direct_read(q, big).status().code(), Code::kNotFound);
}

// scan_read copies the found slot again and re-reads its header; an object that moves between
// the block copy and the slot copy is searched for again, not reported freed.
TEST_F(FakeServerTest, HeaderRecheckScanFollowsAnObjectThatMovesDuringTheScan) {
  ObjectClient& c = Client(Validation(ReadValidation::kVersionsAndHeaderRecheck));
  const uint64_t old_off = 6 * kBlock + 5 * 64, mid_off = 6 * kBlock + 20 * 64,
                 new_off = 6 * kBlock + 60 * 64;
  auto pay = Payload(50, 9);
  fake_->Put(old_off, kC64, 0x0bad, Payload(50, 0), 1);  // another object took the old slot
  fake_->Put(mid_off, kC64, 0x1111, pay, 4);
  Interpose move(ReadStage::kBeforeCopy, 1, [&](uint64_t at, std::span<uint8_t>) {
    EXPECT_EQ(at, mid_off);
    fake_->Put(new_off, kC64, 0x1111, pay, 4);  // compaction moved it on
    fake_->Clear(mid_off, kC64);
  });
  Ptr p = P(old_off, kC64, 0x1111);
  std::vector<std::byte> out(50);
  Result<size_t> r = c.read_any(p, out);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(p.offset, new_off);
  EXPECT_TRUE(Same(out, pay));
  EXPECT_EQ(c.stats().recheck_failures, 1u);
  EXPECT_EQ(c.stats().scans, 2u);
}

TEST(FakeServerConnect, RegionKeyMismatchIsRefused) {
  FakeServer fake(/*info_key=*/0xdeadbeef);
  auto n = Node::Create(node::testing::MakeConfig("tcp", "client"));
  ASSERT_TRUE(n.ok());
  ASSERT_TRUE((*n)->start().ok());
  std::vector<std::string> servers{fake.address()};
  auto c = ObjectClient::Connect(**n, servers);
  EXPECT_EQ(c.status().code(), Code::kProtocol) << c.status().ToString();
  EXPECT_NE(c.status().message().find("disagrees"), std::string_view::npos);
  (*n)->stop();
}

}  // namespace
}  // namespace farmem
