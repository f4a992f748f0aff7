// End-to-end tests of farmemd's object RPCs: an in-process MemoryServer on loopback (native TCP)
// driven with raw RPCs built from object_wire.h, so the server side is tested apart from the
// ObjectClient. Round trips, frees, forged pointers, malformed requests, compaction, STAT.
#include "objects/service/object_service.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>
#include <vector>

#include "farmem/server.h"
#include "objects/format/object_layout.h"
#include "objects/format/object_wire.h"
#include "server/local_server_test_util.h"
#include "server/metrics_http.h"
#include "transport/tcp/tcp_transport.h"

namespace farmem {
namespace {

namespace wire = object_wire;
using nlohmann::json;

constexpr uint64_t kMemory = 8ull << 20;

template <typename T>
std::vector<std::byte> Bytes(const T& msg) {
  std::vector<std::byte> out(sizeof(T));
  std::memcpy(out.data(), &msg, sizeof(T));
  return out;
}

template <typename T>
T As(const std::vector<std::byte>& bytes) {
  T out{};
  std::memcpy(&out, bytes.data(), std::min(sizeof(T), bytes.size()));
  return out;
}

std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed * 131 + i * 7 + 1);
  return v;
}

ObjectsConfig TestObjects() {
  ObjectsConfig oc;
  oc.workers = 1;
  // No leader thread: compaction happens only when a test asks, so block counts are exact.
  oc.compaction.interval_ms = 0;
  return oc;
}

class ObjectServiceTest : public testing::LocalServerTest {
 protected:
  void TearDown() override { Shutdown(); }

  void Shutdown() {
    sched_.reset();
    if (node_) node_->stop();
    node_.reset();
    if (server_) server_->stop();
    server_.reset();
  }

  // Starts a server with `oc` and a client node connected to it.
  void Start(const ObjectsConfig& oc) {
    // No service list: every built one (minus objects when oc.enabled is false).
    ServerConfig sc = LoopbackConfig({}, kMemory, 1 << 20);
    sc.node.name = "obj-farmemd";
    sc.objects = oc;
    ASSERT_NO_FATAL_FAILURE(StartServer(sc, "obj-client"));
    auto peer = node_->connect(server_->node().bootstrap_address());
    ASSERT_TRUE(peer.ok()) << peer.status().ToString();
    peer_ = *peer;
    auto sched = node_->make_scheduler();
    ASSERT_TRUE(sched.ok()) << sched.status().ToString();
    sched_ = std::move(*sched);
    if (!oc.enabled) return;
    auto info = Call(wire::kOpInfo, {});
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    info_ = As<wire::InfoReply>(*info);
    ASSERT_EQ(info->size(), sizeof(wire::InfoReply) + info_.num_classes * sizeof(wire::WireClass));
    for (uint16_t c = 0; c < info_.num_classes; ++c) {
      wire::WireClass wc;
      std::memcpy(&wc, info->data() + sizeof(wire::InfoReply) + c * sizeof(wc), sizeof(wc));
      classes_.push_back(wc);
    }
  }

  Result<std::vector<std::byte>> Call(uint16_t op, std::vector<std::byte> request) {
    std::vector<std::byte> reply(64 << 10);
    Result<RpcReply> r =
        sched_->block_on(sched_->rpc(peer_.id, RpcImm(op), request, std::span(reply)));
    if (!r.ok()) return r.status();
    reply.resize(r->length);
    return reply;
  }

  // A reply that must be exactly one PtrReply.
  Result<wire::WirePtr> PtrCall(uint16_t op, std::vector<std::byte> request) {
    FARMEM_ASSIGN_OR_RETURN(auto reply, Call(op, std::move(request)));
    if (reply.size() != sizeof(wire::PtrReply)) {
      return Status::Protocol("reply of " + std::to_string(reply.size()) + " bytes");
    }
    return As<wire::PtrReply>(reply).ptr;
  }

  Result<wire::WirePtr> Alloc(uint64_t size) {
    return PtrCall(wire::kOpAlloc, Bytes(wire::AllocRequest{size, 0}));
  }
  Status Free(const wire::WirePtr& p) { return Call(wire::kOpFree, Bytes(p)).status(); }
  Result<wire::WirePtr> Locate(const wire::WirePtr& p) {
    return PtrCall(wire::kOpLocate, Bytes(p));
  }
  Result<wire::WirePtr> Release(const wire::WirePtr& p) {
    return PtrCall(wire::kOpRelease, Bytes(p));
  }
  Result<wire::WirePtr> Write(const wire::WirePtr& p, const std::vector<uint8_t>& data) {
    std::vector<std::byte> req = Bytes(p);
    const auto* b = reinterpret_cast<const std::byte*>(data.data());
    req.insert(req.end(), b, b + data.size());
    return PtrCall(wire::kOpWrite, std::move(req));
  }
  struct ReadResult {
    wire::WirePtr ptr;
    std::vector<uint8_t> data;
  };
  Result<ReadResult> Read(const wire::WirePtr& p, uint32_t max_bytes = 1 << 16) {
    wire::ReadRequest req{p, max_bytes, 0};
    FARMEM_ASSIGN_OR_RETURN(auto reply, Call(wire::kOpRead, Bytes(req)));
    if (reply.size() < sizeof(wire::PtrReply)) return Status::Protocol("short READ reply");
    ReadResult out;
    out.ptr = As<wire::PtrReply>(reply).ptr;
    const auto* d = reinterpret_cast<const uint8_t*>(reply.data()) + sizeof(wire::PtrReply);
    out.data.assign(d, d + reply.size() - sizeof(wire::PtrReply));
    return out;
  }
  Result<json> Compact(uint16_t size_class) {
    FARMEM_ASSIGN_OR_RETURN(auto reply,
                            Call(wire::kOpCompact, Bytes(wire::CompactRequest{size_class, {}})));
    json j = json::parse(std::string(reinterpret_cast<const char*>(reply.data()), reply.size()),
                         nullptr, false);
    if (j.is_discarded()) return Status::Protocol("COMPACT reply is not JSON");
    return j;
  }

  // One-sided copy of a slot through the exported region, checked like a client would: the
  // slot's address modulo 64 equals its offset modulo 64 (the region starts block-aligned).
  Result<std::vector<uint8_t>> DirectRead(const wire::WirePtr& p, size_t len) {
    const wire::WireClass& wc = classes_.at(p.size_class);
    std::vector<uint8_t> copy(wc.slot_size);
    FARMEM_RETURN_IF_ERROR(sched_->block_on(
        sched_->read(RemoteRef{peer_.id, info_.region_key, p.offset}, copy.data(), copy.size())));
    const corm::SlotCheck check =
        corm::CheckSlot(copy, p.offset, corm::TagOf(p.id, p.gen, static_cast<uint16_t>(wc.id_mask)),
                        corm::hdr::kTagMask, p.size_class);
    if (check != corm::SlotCheck::kOk) {
      return Status::Moved(std::string(corm::SlotCheckName(check)));
    }
    std::vector<uint8_t> out(len);
    corm::DecodePayload(copy, p.offset, out);
    return out;
  }

  json ClassStat(uint16_t size_class) {
    const json stats = nlohmann::json::parse(server_->stats_json());
    for (const json& c : stats["objects"]["classes"]) {
      if (c["class"] == size_class) return c;
    }
    return json{{"blocks", 0}, {"live", 0}};
  }

  PeerInfo peer_;
  std::unique_ptr<Scheduler> sched_;
  wire::InfoReply info_{};
  std::vector<wire::WireClass> classes_;
};

template <typename T>
Code CodeOf(const Result<T>& r) {
  return r.ok() ? Code::kOk : r.status().code();
}

TEST_F(ObjectServiceTest, InfoDescribesRegionAndClasses) {
  ASSERT_NO_FATAL_FAILURE(Start(TestObjects()));
  const RegionInfo* region = nullptr;
  for (const RegionInfo& r : peer_.regions) {
    if (r.name == "objects") region = &r;
  }
  ASSERT_NE(region, nullptr) << "object region not exported";
  EXPECT_EQ(info_.region_key, region->key);
  EXPECT_EQ(info_.region_length, region->length);
  EXPECT_EQ(info_.region_length, 2 * kMemory);  // reserve defaults to 2 x memory_bytes
  EXPECT_EQ(info_.block_size, 4096u);
  EXPECT_EQ(info_.id_bits, 16);
  EXPECT_EQ(info_.hybrid, 1);
  ASSERT_GT(classes_.size(), 10u);
  EXPECT_EQ(classes_.front().slot_size, 16u);
  for (size_t c = 1; c < classes_.size(); ++c) {
    EXPECT_GT(classes_[c].slot_size, classes_[c - 1].slot_size);
    EXPECT_LT(classes_[c].payload_capacity, classes_[c].slot_size);
    EXPECT_EQ(classes_[c].id_mask, 0xffffu);  // every class has <= 2^16 slots per block
    // Blocks per class (the default geometry): whole base blocks, slots tiling them.
    EXPECT_EQ(classes_[c].block_bytes % 4096, 0u);
    EXPECT_GE(classes_[c].block_bytes / classes_[c].slot_size, 1u);
    EXPECT_LT(classes_[c].block_bytes % classes_[c].slot_size, classes_[c].slot_size);
  }
  EXPECT_EQ(classes_.back().payload_capacity, corm::PayloadCapacity(corm::kMaxSlotSize));
  EXPECT_EQ(nlohmann::json::parse(server_->stats_json())["objects"]["max_object_size"],
            corm::PayloadCapacity(corm::kMaxSlotSize));
}

TEST_F(ObjectServiceTest, AllocWriteReadRoundTrip) {
  ASSERT_NO_FATAL_FAILURE(Start(TestObjects()));
  auto p = Alloc(100);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const wire::WireClass& wc = classes_.at(p->size_class);
  EXPECT_GE(wc.payload_capacity, 100u);
  EXPECT_LT(p->offset, info_.region_length);
  EXPECT_EQ(p->offset % 8, 0u);
  EXPECT_EQ(p->reserved, 0);

  auto zero = Read(*p);
  ASSERT_TRUE(zero.ok()) << zero.status().ToString();
  EXPECT_EQ(zero->data, std::vector<uint8_t>(wc.payload_capacity, 0));  // zero-filled, capacity

  const auto data = Pattern(100, 1);
  auto w = Write(*p, data);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->offset, p->offset);
  EXPECT_EQ(w->gen, p->gen);  // the same allocation

  auto r = Read(*p);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->data.size(), wc.payload_capacity);
  EXPECT_TRUE(std::equal(data.begin(), data.end(), r->data.begin()));
  EXPECT_TRUE(std::all_of(r->data.begin() + 100, r->data.end(), [](uint8_t b) { return b == 0; }));
  EXPECT_EQ(r->ptr.gen, w->gen);

  auto part = Read(*p, 10);  // max_bytes caps the copy
  ASSERT_TRUE(part.ok());
  EXPECT_EQ(part->data, std::vector<uint8_t>(data.begin(), data.begin() + 10));
  auto none = Read(*p, 0);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->data.empty());

  // The same bytes through the exported region, one-sided.
  auto direct = DirectRead(*p, 100);
  ASSERT_TRUE(direct.ok()) << direct.status().ToString();
  EXPECT_EQ(*direct, data);

  // The region is read-only for peers.
  uint64_t word = 0;
  Status one_sided_write = sched_->block_on(
      sched_->write(RemoteRef{peer_.id, info_.region_key, p->offset}, &word, 8, true));
  EXPECT_EQ(one_sided_write.code(), Code::kPermissionDenied) << one_sided_write.ToString();
  auto still = Read(*p, 100);
  ASSERT_TRUE(still.ok());
  EXPECT_EQ(still->data, data);

  // Too large for the object: OutOfRange, nothing changed.
  auto big = Write(*p, Pattern(wc.payload_capacity + 1, 2));
  EXPECT_EQ(CodeOf(big), Code::kOutOfRange) << big.status().ToString();
  auto full = Write(*p, Pattern(wc.payload_capacity, 3));
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  auto back = Read(*p);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->data, Pattern(wc.payload_capacity, 3));
}

TEST_F(ObjectServiceTest, FreeThenReadIsNotFoundAndDoubleFreeFails) {
  ASSERT_NO_FATAL_FAILURE(Start(TestObjects()));
  auto a = Alloc(40);
  auto b = Alloc(40);  // same block: the block stays alive after `a` is freed
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->offset / 4096, b->offset / 4096);
  ASSERT_TRUE(Write(*b, Pattern(40, 9)).ok());

  ASSERT_TRUE(Free(*a).ok());
  EXPECT_EQ(CodeOf(Read(*a)), Code::kNotFound);
  EXPECT_EQ(CodeOf(Write(*a, Pattern(4, 1))), Code::kNotFound);
  EXPECT_EQ(CodeOf(Locate(*a)), Code::kNotFound);
  EXPECT_EQ(CodeOf(Release(*a)), Code::kNotFound);
  Status twice = Free(*a);
  EXPECT_EQ(twice.code(), Code::kNotFound) << twice.ToString();

  // Freeing the last object releases the block; its pointer is then NotFound too.
  auto r = Read(*b, 40);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->data, Pattern(40, 9));
  ASSERT_TRUE(Free(*b).ok());
  EXPECT_EQ(CodeOf(Read(*b)), Code::kNotFound);
  EXPECT_EQ(Free(*b).code(), Code::kNotFound);
  EXPECT_EQ(nlohmann::json::parse(server_->stats_json())["objects"]["live_objects"], 0);
  EXPECT_EQ(nlohmann::json::parse(server_->stats_json())["objects"]["physical_bytes_held"], 0);

  // A one-sided read through a dangling pointer (its block was released) fails its check or the
  // read itself, and the server survives it.
  auto dangling = DirectRead(*b, 40);
  EXPECT_FALSE(dangling.ok());
  wire::WirePtr never = *b;
  never.offset = info_.region_length - 4096;  // a block never allocated
  EXPECT_FALSE(DirectRead(never, 40).ok());
  EXPECT_TRUE(Alloc(40).ok());
}

TEST_F(ObjectServiceTest, ForgedPointersAreRejected) {
  ASSERT_NO_FATAL_FAILURE(Start(TestObjects()));
  auto p = Alloc(100);
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(Write(*p, Pattern(100, 4)).ok());
  const uint16_t n = info_.num_classes;

  wire::WirePtr bad = *p;
  bad.size_class = n;
  Status st = Free(bad);
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("size class"), std::string_view::npos) << st.ToString();
  bad.size_class = 0xffff;
  EXPECT_EQ(CodeOf(Read(bad)), Code::kInvalidArgument);

  bad = *p;
  bad.offset = info_.region_length;
  st = Free(bad);
  EXPECT_EQ(st.code(), Code::kOutOfRange) << st.ToString();
  bad.offset = ~0ull;
  EXPECT_EQ(CodeOf(Read(bad)), Code::kOutOfRange);
  EXPECT_EQ(CodeOf(Write(bad, Pattern(1, 0))), Code::kOutOfRange);

  bad = *p;
  bad.offset += 8;  // inside the slot, not on a slot boundary
  EXPECT_EQ(CodeOf(Read(bad)), Code::kInvalidArgument);
  EXPECT_EQ(Free(bad).code(), Code::kInvalidArgument);

  bad = *p;
  bad.size_class = static_cast<uint16_t>(p->size_class + 1);  // block holds another class
  EXPECT_EQ(CodeOf(Read(bad)), Code::kInvalidArgument);

  bad = *p;
  bad.id ^= 0x5a5a;  // no such object in the block
  st = Free(bad);
  EXPECT_EQ(st.code(), Code::kNotFound) << st.ToString();
  EXPECT_EQ(CodeOf(Read(bad)), Code::kNotFound);

  bad = *p;
  bad.offset = 100 * 4096;  // a block never allocated
  EXPECT_EQ(CodeOf(Read(bad)), Code::kNotFound);

  bad = *p;
  bad.reserved = 1;
  EXPECT_EQ(Free(bad).code(), Code::kProtocol);

  // Nothing was freed or damaged; the server keeps serving.
  auto r = Read(*p, 100);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->data, Pattern(100, 4));
  EXPECT_EQ(nlohmann::json::parse(server_->stats_json())["objects"]["live_objects"], 1);
  EXPECT_TRUE(Alloc(8).ok());
}

TEST_F(ObjectServiceTest, IdBeyondTheClassWidthIsInvalid) {
  ObjectsConfig oc = TestObjects();
  oc.id_bits = 8;
  oc.block_size = 8192;
  ASSERT_NO_FATAL_FAILURE(Start(oc));
  EXPECT_EQ(info_.id_bits, 8);
  EXPECT_EQ(info_.block_size, 8192u);
  auto p = Alloc(100);  // 73 slots per block <= 256 IDs: a class with IDs
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(classes_.at(p->size_class).id_mask, 0xffu);
  EXPECT_LE(p->id, 0xff);
  EXPECT_EQ(classes_.front().id_mask, 0u);  // 512 slots of 16 B > 256 IDs: offset-only (hybrid)
  wire::WirePtr bad = *p;
  bad.id |= 0x100;
  Status st = Free(bad);
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
  EXPECT_TRUE(Free(*p).ok());
}

TEST_F(ObjectServiceTest, ObjectSizesAreChecked) {
  ASSERT_NO_FATAL_FAILURE(Start(TestObjects()));
  const uint64_t max = classes_.back().payload_capacity;
  auto zero = Alloc(0);
  EXPECT_EQ(CodeOf(zero), Code::kInvalidArgument) << zero.status().ToString();
  auto big = Alloc(max + 1);
  EXPECT_EQ(CodeOf(big), Code::kInvalidArgument) << big.status().ToString();
  EXPECT_NE(big.status().message().find("largest object"), std::string_view::npos);
  EXPECT_EQ(CodeOf(Alloc(~0ull)), Code::kInvalidArgument);
  auto largest = Alloc(max);
  ASSERT_TRUE(largest.ok()) << largest.status().ToString();
  EXPECT_EQ(largest->size_class, info_.num_classes - 1);
  auto one = Alloc(1);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->size_class, 0);
}

TEST_F(ObjectServiceTest, MalformedRequestsAreProtocolErrors) {
  ASSERT_NO_FATAL_FAILURE(Start(TestObjects()));
  auto code = [&](uint16_t op, size_t len) {
    return CodeOf(Call(op, std::vector<std::byte>(len, std::byte{0})));
  };
  const struct {
    uint16_t op;
    size_t len;
  } cases[] = {
      {wire::kOpInfo, 1},    {wire::kOpAlloc, 0},   {wire::kOpAlloc, 8},   {wire::kOpAlloc, 17},
      {wire::kOpFree, 0},    {wire::kOpFree, 15},   {wire::kOpFree, 17},   {wire::kOpRead, 16},
      {wire::kOpRead, 23},   {wire::kOpRead, 25},   {wire::kOpWrite, 0},   {wire::kOpWrite, 15},
      {wire::kOpLocate, 15}, {wire::kOpLocate, 17}, {wire::kOpRelease, 0}, {wire::kOpRelease, 17},
      {wire::kOpCompact, 0}, {wire::kOpCompact, 9},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(code(c.op, c.len), Code::kProtocol) << "opcode " << c.op << " length " << c.len;
  }
  auto p = Alloc(16);
  ASSERT_TRUE(p.ok());
  wire::ReadRequest rr{*p, 16, 7};
  EXPECT_EQ(CodeOf(Call(wire::kOpRead, Bytes(rr))), Code::kProtocol);
  wire::CompactRequest cr{wire::kAllClasses, {0, 1, 0}};
  EXPECT_EQ(CodeOf(Call(wire::kOpCompact, Bytes(cr))), Code::kProtocol);
  EXPECT_EQ(CodeOf(Compact(info_.num_classes)), Code::kInvalidArgument);
  // An unused opcode of the objects range has no handler.
  EXPECT_EQ(code(kObjectsOpcodes.first + 20, 0), Code::kNotFound);

  // Still serving; every failure was counted.
  auto r = Read(*p, 16);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const json rpc = nlohmann::json::parse(server_->stats_json())["rpc"];
  EXPECT_EQ(rpc["obj_alloc"]["errors"], 3);
  EXPECT_EQ(rpc["obj_alloc"]["calls"], 4);
  EXPECT_EQ(rpc["obj_read"]["errors"], 4);
  EXPECT_EQ(rpc["obj_compact"]["errors"], 4);
  EXPECT_EQ(rpc["obj_info"]["calls"], 2);  // Start() asked once
  EXPECT_EQ(rpc["obj_info"]["opcode"], wire::kOpInfo);
}

class ObjectCompactionTest : public ObjectServiceTest,
                             public ::testing::WithParamInterface<Correction> {};

TEST_P(ObjectCompactionTest, CompactFreesBlocksAndSurvivorsReadBackIntact) {
  ObjectsConfig oc = TestObjects();
  oc.correction = GetParam();
  ASSERT_NO_FATAL_FAILURE(Start(oc));
  // 100-byte objects: 112-byte slots, 36 per 4 KiB block. One worker fills blocks first-fit.
  constexpr int kBlocks = 16;
  auto first = Alloc(100);
  ASSERT_TRUE(first.ok());
  const uint16_t cls = first->size_class;
  const uint32_t per_block = 4096 / classes_.at(cls).slot_size;
  ASSERT_EQ(per_block, 36u);
  std::vector<wire::WirePtr> ptrs{*first};
  for (uint32_t i = 1; i < kBlocks * per_block; ++i) {
    auto p = Alloc(100);
    ASSERT_TRUE(p.ok()) << i << ": " << p.status().ToString();
    ptrs.push_back(*p);
  }
  for (size_t i = 0; i < ptrs.size(); ++i) ASSERT_TRUE(Write(ptrs[i], Pattern(100, i)).ok());
  EXPECT_EQ(ClassStat(cls)["blocks"], kBlocks);

  // Free 3 of every 4 objects: every block keeps 9 of 36 slots, all at the same offsets, so
  // merged objects must move (and keep their IDs, unless the two blocks shared an ID: then the
  // merge re-draws the colliding ones, docs/objects.md "Merges that re-draw IDs").
  std::vector<size_t> survivors;
  for (size_t i = 0; i < ptrs.size(); ++i) {
    if (i % 4 == 0) {
      survivors.push_back(i);
    } else {
      ASSERT_TRUE(Free(ptrs[i]).ok()) << i;
    }
  }
  json before = nlohmann::json::parse(server_->stats_json())["objects"];
  EXPECT_EQ(before["live_objects"], survivors.size());
  EXPECT_DOUBLE_EQ(ClassStat(cls)["fragmentation"].get<double>(), 0.75);
  const uint64_t held_before = before["physical_bytes_held"];
  EXPECT_EQ(held_before, kBlocks * 4096u);

  auto c = Compact(cls);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const uint64_t merges = (*c)["merges"];
  EXPECT_GE(merges, 1u) << c->dump();
  EXPECT_LE(merges, kBlocks - 4u);  // 144 survivors need at least 4 blocks
  EXPECT_EQ((*c)["compaction"]["compactions"], merges);
  EXPECT_EQ((*c)["compaction"]["blocks_freed"], merges);
  // Every merge waited for the NIC thread's one-sided copies in progress before its remap.
  auto tcp = GetTcpTransportStats(server_->node().transport());
  ASSERT_TRUE(tcp.ok()) << tcp.status().ToString();
  EXPECT_GE(tcp->read_copy_waits, merges);
  EXPECT_LE((*c)["compaction"]["grace_wait_max_ns"].get<uint64_t>(),
            (*c)["compaction"]["grace_wait_ns"].get<uint64_t>());
  json after = nlohmann::json::parse(server_->stats_json())["objects"];
  EXPECT_EQ(after["physical_bytes_held"], held_before - merges * 4096);
  EXPECT_EQ(ClassStat(cls)["blocks"], kBlocks - merges);
  EXPECT_EQ(after["live_objects"], survivors.size());
  EXPECT_EQ(after["compaction"]["compactions"], merges);

  // Every survivor reads back intact through its old pointer; READ corrects the offset inside
  // the home block, LOCATE agrees, and a one-sided read at the corrected offset checks out.
  int relocated = 0;
  uint64_t ids_changed = 0;
  const uint64_t ids_redrawn = ClassStat(cls)["ids_redrawn"].get<uint64_t>();
  std::vector<size_t> moved_home;  // survivors whose home block is now an alias
  for (size_t i : survivors) {
    auto r = Read(ptrs[i], 100);
    ASSERT_TRUE(r.ok()) << i << ": " << r.status().ToString();
    EXPECT_EQ(r->data, Pattern(100, i)) << i;
    EXPECT_EQ(r->ptr.offset / 4096, ptrs[i].offset / 4096) << "home block is kept";
    if (r->ptr.id != ptrs[i].id) ++ids_changed;
    if (r->ptr.offset != ptrs[i].offset) ++relocated;
    auto l = Locate(ptrs[i]);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    EXPECT_EQ(l->offset, r->ptr.offset);
    auto d = DirectRead(r->ptr, 100);
    ASSERT_TRUE(d.ok()) << i << ": " << d.status().ToString();
    EXPECT_EQ(*d, Pattern(100, i));
    auto rel = Release(r->ptr);
    ASSERT_TRUE(rel.ok()) << rel.status().ToString();
    if (rel->offset / 4096 != ptrs[i].offset / 4096) moved_home.push_back(i);
    ptrs[i] = *rel;
  }
  EXPECT_GT(relocated, 0);
  // An ID changes only where a merge re-drew it (random 16-bit IDs: rarely, ~1 run in 100).
  EXPECT_LE(ids_changed, ids_redrawn) << "an ID changed that no merge re-drew";
  EXPECT_FALSE(moved_home.empty());  // objects of merged-away blocks were re-homed

  // Re-homed pointers work; writes through them land; the old alias pointers are gone.
  for (size_t i : survivors) {
    auto r = Read(ptrs[i], 100);
    ASSERT_TRUE(r.ok()) << i << ": " << r.status().ToString();
    EXPECT_EQ(r->data, Pattern(100, i));
    ASSERT_TRUE(Write(ptrs[i], Pattern(100, i + 1000)).ok());
  }
  after = nlohmann::json::parse(server_->stats_json())["objects"];
  EXPECT_EQ(after["virtual_blocks_in_use"], kBlocks - merges);  // aliases released

  // The server keeps serving: new objects, and the survivors can all be freed.
  auto fresh = Alloc(100);
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  ASSERT_TRUE(Write(*fresh, Pattern(100, 77)).ok());
  auto fr = Read(*fresh, 100);
  ASSERT_TRUE(fr.ok());
  EXPECT_EQ(fr->data, Pattern(100, 77));
  for (size_t i : survivors) {
    auto r = Read(ptrs[i], 100);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->data, Pattern(100, i + 1000));
    ASSERT_TRUE(Free(ptrs[i]).ok());
  }
  ASSERT_TRUE(Free(*fresh).ok());
  EXPECT_EQ(nlohmann::json::parse(server_->stats_json())["objects"]["live_objects"], 0);
  EXPECT_EQ(nlohmann::json::parse(server_->stats_json())["objects"]["physical_bytes_held"], 0);
  // All classes at once answers too (nothing left to merge).
  auto all = Compact(wire::kAllClasses);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ((*all)["merges"], 0);
}

INSTANTIATE_TEST_SUITE_P(Correction, ObjectCompactionTest,
                         ::testing::Values(Correction::kAskOwner, Correction::kScan),
                         [](const auto& info) {
                           return info.param == Correction::kScan ? "Scan" : "AskOwner";
                         });

TEST_F(ObjectServiceTest, WorkerSelectionByConnectionAndRandom) {
  ObjectsConfig oc = TestObjects();
  oc.workers = 4;
  ASSERT_NO_FATAL_FAILURE(Start(oc));
  // One connection -> one worker: 30 objects of one class share a block.
  uint16_t cls = 0;
  for (int i = 0; i < 30; ++i) {
    auto p = Alloc(100);
    ASSERT_TRUE(p.ok());
    cls = p->size_class;
  }
  EXPECT_EQ(ClassStat(cls)["blocks"], 1);
  EXPECT_EQ(nlohmann::json::parse(server_->stats_json())["objects"]["config"]["worker_selection"],
            "connection");
  Shutdown();

  oc.worker_selection = WorkerSelection::kRandom;
  ASSERT_NO_FATAL_FAILURE(Start(oc));
  // Random workers: 30 allocations all landing on one of 4 workers has probability 4^-29.
  for (int i = 0; i < 30; ++i) ASSERT_TRUE(Alloc(100).ok());
  EXPECT_GE(ClassStat(cls)["blocks"].get<int>(), 2);
  EXPECT_EQ(nlohmann::json::parse(server_->stats_json())["objects"]["config"]["worker_selection"],
            "random");
}

TEST_F(ObjectServiceTest, PacedCompactAnswersWithinItsBudgetAndSaysPartial) {
  ObjectsConfig oc = TestObjects();
  oc.compaction.max_merges_per_second = 2;  // 3 of the 7 possible merges fit in the 1 s budget
  ASSERT_NO_FATAL_FAILURE(Start(oc));
  std::vector<wire::WirePtr> ptrs;
  for (int i = 0; i < 8 * 36; ++i) {
    auto p = Alloc(100);
    ASSERT_TRUE(p.ok());
    ptrs.push_back(*p);
  }
  for (size_t i = 0; i < ptrs.size(); ++i) {
    if (i % 9 != 0) {
      ASSERT_TRUE(Free(ptrs[i]).ok());
    }
  }
  const uint16_t cls = ptrs[0].size_class;
  auto c = Compact(cls);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE((*c)["partial"].get<bool>()) << c->dump();
  const uint64_t first = (*c)["merges"];
  EXPECT_GE(first, 1u);
  EXPECT_LE(first, 4u) << "1 s at 2 merges/s (plus one batch)";
  EXPECT_EQ(nlohmann::json::parse(
                server_->stats_json())["objects"]["config"]["compaction"]["max_merges_per_second"],
            2);
  // Asking again continues where the budget stopped.
  auto again = Compact(cls);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_GE((*again)["merges"].get<uint64_t>(), 1u) << again->dump();
}

TEST_F(ObjectServiceTest, LeaderThreadCompactsFragmentedClasses) {
  ObjectsConfig oc = TestObjects();
  oc.compaction.interval_ms = 5;
  oc.compaction.threshold = 0.5;
  ASSERT_NO_FATAL_FAILURE(Start(oc));
  std::vector<wire::WirePtr> ptrs;
  for (int i = 0; i < 4 * 36; ++i) {
    auto p = Alloc(100);
    ASSERT_TRUE(p.ok());
    ptrs.push_back(*p);
  }
  for (size_t i = 0; i < ptrs.size(); ++i) {
    if (i % 4 != 0) {
      ASSERT_TRUE(Free(ptrs[i]).ok());
    }
  }
  // Wait (bounded) for the leader to notice fragmentation 0.75 > 0.5 and merge.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  uint64_t compactions = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    compactions =
        nlohmann::json::parse(server_->stats_json())["objects"]["compaction"]["compactions"];
    if (compactions > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_GT(compactions, 0u);
  for (size_t i = 0; i < ptrs.size(); i += 4) EXPECT_TRUE(Read(ptrs[i], 8).ok());
}

TEST_F(ObjectServiceTest, StatAndPrometheusShowTheObjectStore) {
  ASSERT_NO_FATAL_FAILURE(Start(TestObjects()));
  auto a = Alloc(100);
  auto b = Alloc(100);
  auto c = Alloc(1000);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  const json o = nlohmann::json::parse(server_->stats_json())["objects"];
  EXPECT_EQ(o["enabled"], true);
  EXPECT_EQ(o["config"]["block_size"], 4096);
  EXPECT_EQ(o["config"]["id_bits"], 16);
  EXPECT_EQ(o["config"]["workers"], 1);
  EXPECT_EQ(o["config"]["correction"], "owner");
  EXPECT_EQ(o["config"]["reserve_bytes"], 2 * kMemory);
  EXPECT_EQ(o["config"]["max_block_size"], 65536);
  EXPECT_EQ(o["config"]["min_slots_per_block"], 16);
  EXPECT_EQ(o["config"]["max_physical_bytes"], kMemory);
  EXPECT_EQ(o["region"]["name"], "objects");
  EXPECT_EQ(o["live_objects"], 3);
  EXPECT_EQ(o["live_blocks"], 2);
  const uint64_t held =
      uint64_t{classes_.at(a->size_class).block_bytes} + classes_.at(c->size_class).block_bytes;
  EXPECT_EQ(o["physical_bytes_held"], held);
  EXPECT_GT(o["process_rss_bytes"].get<uint64_t>(), 0u);
  ASSERT_EQ(o["classes"].size(), 2u);
  const json& small = o["classes"][0]["class"] == a->size_class ? o["classes"][0] : o["classes"][1];
  EXPECT_EQ(small["live"], 2);
  EXPECT_EQ(small["slot_size"], classes_.at(a->size_class).slot_size);
  EXPECT_DOUBLE_EQ(
      small["fragmentation"].get<double>(),
      1.0 - 2.0 / (classes_.at(a->size_class).block_bytes / classes_.at(a->size_class).slot_size));
  EXPECT_TRUE(o["compaction"].contains("rounds"));
  // The STAT RPC carries the same section.
  auto st = Call(kOpStat, {});
  ASSERT_TRUE(st.ok());
  json remote = json::parse(std::string(reinterpret_cast<const char*>(st->data()), st->size()));
  EXPECT_EQ(remote["objects"]["live_objects"], 3);

  const std::string text = server_->metrics_text();
  EXPECT_NE(text.find("farmem_objects_live 3\n"), std::string::npos) << text;
  EXPECT_NE(text.find("farmem_objects_physical_bytes " + std::to_string(held) + "\n"),
            std::string::npos);
  EXPECT_NE(text.find("farmem_objects_compactions_total 0\n"), std::string::npos);
  EXPECT_NE(text.find("farmem_objects_compaction_grace_wait_seconds_total 0"), std::string::npos);
  EXPECT_NE(text.find("farmem_objects_class_fragmentation{class=\"" +
                      std::to_string(a->size_class) + "\",slot_size=\"112\"} "),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("farmem_rpc_calls_total{service=\"objects\",op=\"obj_alloc\"} 3\n"),
            std::string::npos);
}

TEST_F(ObjectServiceTest, DisabledStoreHasNoRegionAndNoHandlers) {
  ObjectsConfig oc;
  oc.enabled = false;
  ASSERT_NO_FATAL_FAILURE(Start(oc));
  for (const RegionInfo& r : peer_.regions) EXPECT_NE(r.name, "objects");
  EXPECT_EQ(CodeOf(Call(wire::kOpInfo, {})), Code::kNotFound);
  const json s = nlohmann::json::parse(server_->stats_json());
  EXPECT_FALSE(s.contains("objects"));
  EXPECT_EQ(s["services"], json({"pools"}));
  EXPECT_FALSE(s["rpc"].contains("obj_alloc"));
  EXPECT_EQ(server_->metrics_text().find("farmem_objects_"), std::string::npos);
}

TEST(ObjectServiceConfigTest, BadConfigsAreRejectedWithClearErrors) {
  auto create = [](auto mutate) {
    ServerConfig sc;
    sc.memory_bytes = kMemory;
    sc.pool_bytes = 1 << 20;
    mutate(sc.objects);
    return MemoryServer::Create(sc).status();
  };
  Status st = create([](ObjectsConfig& o) { o.block_size = 5000; });
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("power of two"), std::string_view::npos) << st.ToString();
  EXPECT_EQ(create([](ObjectsConfig& o) { o.block_size = 2048; }).code(), Code::kInvalidArgument);
  EXPECT_EQ(create([](ObjectsConfig& o) { o.block_size = 2 << 20; }).code(),
            Code::kInvalidArgument);
  st = create([](ObjectsConfig& o) { o.id_bits = 7; });
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("id_bits"), std::string_view::npos) << st.ToString();
  EXPECT_EQ(create([](ObjectsConfig& o) { o.compaction.threshold = 1.5; }).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(create([](ObjectsConfig& o) { o.reserve_bytes = 4096 + 1; }).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(create([](ObjectsConfig& o) { o.max_physical_bytes = 100; }).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(create([](ObjectsConfig& o) { o.compaction.max_merges_per_round = 0; }).code(),
            Code::kInvalidArgument);
  // 1 MiB blocks and offset-only stores are valid.
  EXPECT_TRUE(create([](ObjectsConfig& o) {
                o.block_size = 1 << 20;
                o.id_bits = 0;
              }).ok());
}

}  // namespace
}  // namespace farmem
