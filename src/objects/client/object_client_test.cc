// ObjectClient tests: OBJ_INFO decoding and pointer validation without a server, then end-to-end
// against an in-process MemoryServer on loopback (tcp and fabric shm): round trips through every
// read path (and read validation mode), free/double free, forged pointers, release_ptr, and
// compaction with both pointer correction modes (pointers corrected in place, survivors intact).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "objects/client/object_client_internal.h"
#include "objects/client/object_test_util.h"
#include "objects/format/object_layout.h"
#include "objects/format/object_wire.h"
#include "objects/format/size_classes.h"

namespace farmem {
namespace {

namespace wire = object_wire;
using objects_test::ObjectEnv;

// ---- OBJ_INFO decoding and pointer shape (no network) ----------------------------------------

std::vector<std::byte> InfoBytes(wire::InfoReply head, const std::vector<wire::WireClass>& cls) {
  std::vector<std::byte> out(sizeof(head) + cls.size() * sizeof(wire::WireClass));
  std::memcpy(out.data(), &head, sizeof(head));
  if (!cls.empty()) std::memcpy(out.data() + sizeof(head), cls.data(), cls.size() * sizeof(cls[0]));
  return out;
}

// A class of `slot`-byte slots in 4 KiB blocks (or one-slot blocks of whole base blocks).
wire::WireClass Cls(uint32_t slot, uint32_t mask = 0xffff, uint32_t block = 0) {
  if (block == 0) block = slot <= 4096 ? 4096 : (slot + 4095) / 4096 * 4096;
  return {slot, static_cast<uint32_t>(corm::PayloadCapacity(slot)), mask, block};
}

wire::InfoReply Head(uint16_t n) {
  return wire::InfoReply{0x1234, 1 << 20, 4096, 16, 1, n};
}

TEST(ObjectInfoDecode, AcceptsAConsistentReply) {
  auto bytes = InfoBytes(Head(3), {Cls(16), Cls(64), Cls(4096, 0)});
  Result<ObjectServerInfo> info = objects_internal::DecodeInfoReply(bytes, "s");
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->region_key, 0x1234u);
  EXPECT_EQ(info->block_size, 4096u);
  EXPECT_EQ(info->id_bits, 16u);
  EXPECT_TRUE(info->hybrid);
  ASSERT_EQ(info->classes.size(), 3u);
  EXPECT_EQ(info->classes[1].slot_size, 64u);
  EXPECT_EQ(info->classes[2].id_mask, 0u);
  EXPECT_EQ(info->max_object_size(), corm::PayloadCapacity(4096));
}

TEST(ObjectInfoDecode, RejectsMalformedReplies) {
  struct Case {
    const char* what;
    std::vector<std::byte> bytes;
  };
  auto bad_head = [](auto mutate) {
    wire::InfoReply h = Head(1);
    mutate(h);
    return InfoBytes(h, {Cls(64)});
  };
  std::vector<Case> cases;
  cases.push_back({"short", std::vector<std::byte>(10)});
  auto truncated = InfoBytes(Head(2), {Cls(16), Cls(64)});
  truncated.pop_back();
  cases.push_back({"truncated class table", truncated});
  cases.push_back({"no classes", InfoBytes(Head(0), {})});
  cases.push_back({"block size", bad_head([](wire::InfoReply& h) { h.block_size = 5000; })});
  cases.push_back({"id_bits", bad_head([](wire::InfoReply& h) { h.id_bits = 7; })});
  cases.push_back({"hybrid", bad_head([](wire::InfoReply& h) { h.hybrid = 2; })});
  cases.push_back({"tiny region", bad_head([](wire::InfoReply& h) { h.region_length = 100; })});
  cases.push_back({"unaligned slot", InfoBytes(Head(1), {Cls(60)})});
  cases.push_back({"slot > block", InfoBytes(Head(1), {Cls(8192, 0xffff, 4096)})});
  cases.push_back({"block not whole base blocks", InfoBytes(Head(1), {Cls(64, 0xffff, 6000)})});
  cases.push_back({"several slots in a block that is no power of two",
                   InfoBytes(Head(1), {Cls(64, 0xffff, 12288)})});
  cases.push_back({"block larger than the region", InfoBytes(Head(1), {Cls(64, 0xffff, 2 << 20)})});
  cases.push_back({"slot > largest slot", InfoBytes(Head(1), {Cls(2 << 20, 0, 2 << 20)})});
  cases.push_back({"not ascending", InfoBytes(Head(2), {Cls(64), Cls(32)})});
  wire::WireClass wrong_cap = Cls(64);
  wrong_cap.payload_capacity += 1;
  cases.push_back({"capacity", InfoBytes(Head(1), {wrong_cap})});
  cases.push_back({"id mask", InfoBytes(Head(1), {Cls(64, 0xff)})});
  for (const Case& c : cases) {
    Result<ObjectServerInfo> info = objects_internal::DecodeInfoReply(c.bytes, "srv");
    ASSERT_FALSE(info.ok()) << c.what;
    EXPECT_EQ(info.status().code(), Code::kProtocol) << c.what << ": " << info.status().ToString();
    EXPECT_NE(info.status().message().find("srv"), std::string_view::npos) << c.what;
  }
}

TEST(ObjectPtrShape, RejectsForgedPointersWithClearMessages) {
  auto bytes = InfoBytes(Head(3), {Cls(16), Cls(64), Cls(4096, 0)});
  ObjectServerInfo info = *objects_internal::DecodeInfoReply(bytes, "s");
  Ptr good;
  good.offset = 4096 + 3 * 64;
  good.id = 0xabcd;
  good.size_class = 1;
  good.flags = Ptr::kPtrValid;
  EXPECT_TRUE(objects_internal::CheckPtrShape(info, good, "op").ok());

  struct Case {
    const char* what;
    Ptr p;
    const char* expect;  // a word of the message
  };
  std::vector<Case> cases;
  Ptr p = good;
  p.flags = 0;
  cases.push_back({"not valid", p, "invalid pointer"});
  p = good;
  p.size_class = 3;
  cases.push_back({"class", p, "size class 3"});
  p = good;
  p.offset += 8;
  cases.push_back({"inside a slot", p, "slot boundary"});
  p = good;
  p.offset += 1;
  cases.push_back({"unaligned", p, "8-aligned"});
  p = good;
  p.offset = (1 << 20) - 32;
  cases.push_back({"end of region", p, "region"});
  p = good;
  p.offset = 1ull << 40;
  cases.push_back({"outside region", p, "region"});
  p = good;
  p.size_class = 2;
  p.offset = 0;
  p.id = 1;
  cases.push_back({"id in offset-only class", p, "ID"});
  p = good;
  p.offset = 4096 + 63 * 64;  // last 64-byte slot: fine
  EXPECT_TRUE(objects_internal::CheckPtrShape(info, p, "op").ok());
  for (const Case& c : cases) {
    Status st = objects_internal::CheckPtrShape(info, c.p, "op");
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << c.what << ": " << st.ToString();
    EXPECT_NE(st.message().find(c.expect), std::string_view::npos)
        << c.what << ": " << st.ToString();
  }
}

// ---- End to end ------------------------------------------------------------------------------

class ObjectClientE2E : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { Boot(ObjectEnv::DefaultObjects(), {}); }

  void Boot(const ObjectsConfig& objects, ObjectClientOptions options) {
    client_.reset();
    env_ = ObjectEnv::Start(GetParam(), objects);
    ASSERT_TRUE(env_->server);
    auto c = env_->Connect(options);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    client_ = std::move(*c);
  }

  void TearDown() override {
    client_.reset();
    env_.reset();
  }

  // Writes MakeValue(size, index, seq) into p.
  void Put(Ptr& p, size_t size, uint64_t index, uint64_t seq = 1) {
    auto v = objects_test::MakeValue(size, index, seq);
    Status st = client_->write(p, v);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }

  std::unique_ptr<ObjectEnv> env_;
  std::unique_ptr<ObjectClient> client_;
};

TEST_P(ObjectClientE2E, ConnectLearnsTheServerGeometry) {
  ASSERT_EQ(client_->server_count(), 1u);
  const ObjectServerInfo& info = client_->server_info(0);
  EXPECT_EQ(info.name, "objects-farmemd");
  EXPECT_EQ(info.block_size, 4096u);
  EXPECT_EQ(info.id_bits, 16u);
  EXPECT_GT(info.classes.size(), 10u);
  EXPECT_EQ(info.max_object_size(), corm::PayloadCapacity(corm::kMaxSlotSize));
  // Blocks per class (docs/objects.md, "Block geometry"): 64 B objects in 4 KiB blocks, 2 KiB
  // objects in 64 KiB blocks of 31 slots, 100 KiB objects one per block of whole base blocks.
  auto geometry = corm::SizeClasses::Create({}).value();
  for (size_t size : {size_t{64}, size_t{2048}, size_t{100000}}) {
    const uint32_t c = geometry.ClassFor(size).value();
    EXPECT_EQ(info.classes.at(c).block_bytes, geometry.at(c).block_bytes) << size;
  }
  EXPECT_EQ(info.classes.at(geometry.ClassFor(2048).value()).block_bytes, 65536u);
  EXPECT_GE(info.region_length, 64ull << 20);
  EXPECT_NE(info.region_key, 0u);
  // An unknown index gets an empty description rather than a crash.
  EXPECT_TRUE(client_->server_info(5).classes.empty());

  std::vector<std::string> none;
  auto bad = ObjectClient::Connect(*env_->node, none);
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  std::vector<std::string> nobody{"127.0.0.1:1"};
  auto unreachable = ObjectClient::Connect(*env_->node, nobody);
  EXPECT_FALSE(unreachable.ok());
}

TEST_P(ObjectClientE2E, RoundTripThroughEveryReadPath) {
  const size_t max = client_->server_info(0).max_object_size();
  // Small, one line, just over a line (the payload crosses a cacheline and its version byte),
  // several lines, and the largest object.
  for (size_t size :
       {size_t{1}, size_t{6}, size_t{24}, size_t{54}, size_t{55}, size_t{63}, size_t{64},
        size_t{100}, size_t{129}, size_t{500}, size_t{1000}, size_t{2047}, max}) {
    SCOPED_TRACE("size " + std::to_string(size));
    Result<Ptr> a = client_->alloc(size);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    Ptr p = *a;
    EXPECT_TRUE(p.valid());
    EXPECT_EQ(p.server, 0);
    const auto& cls = client_->server_info(0).classes.at(p.size_class);
    EXPECT_GE(cls.payload_capacity, size);
    const size_t cap = cls.payload_capacity;

    // A fresh object reads as zeros.
    std::vector<std::byte> out(cap, std::byte{0x55});
    Result<size_t> n = client_->direct_read(p, out);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    EXPECT_EQ(*n, cap);
    EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](std::byte b) { return b == std::byte{0}; }));

    std::vector<std::byte> value(size);
    for (size_t i = 0; i < size; ++i) value[i] = static_cast<std::byte>((i * 37 + size) & 0xff);
    ASSERT_TRUE(client_->write(p, value).ok());

    auto check = [&](const char* path, Result<size_t> got) {
      ASSERT_TRUE(got.ok()) << path << ": " << got.status().ToString();
      EXPECT_EQ(*got, cap) << path;
      EXPECT_TRUE(std::equal(value.begin(), value.end(), out.begin())) << path;
      EXPECT_TRUE(
          std::all_of(out.begin() + size, out.end(), [](std::byte b) { return b == std::byte{0}; }))
          << path << ": bytes past the object are not zero";
    };
    std::fill(out.begin(), out.end(), std::byte{0xee});
    check("read", client_->read(p, out));
    std::fill(out.begin(), out.end(), std::byte{0xee});
    check("direct_read", client_->direct_read(p, out));
    std::fill(out.begin(), out.end(), std::byte{0xee});
    check("scan_read", client_->scan_read(p, out));
    std::fill(out.begin(), out.end(), std::byte{0xee});
    check("read_any", client_->read_any(p, out));
    EXPECT_EQ(p.offset, a->offset) << "nothing moved, the pointer must not change";
    EXPECT_EQ(p.id, a->id);
    EXPECT_EQ(p.size_class, a->size_class);

    // A short output buffer gets a prefix.
    std::vector<std::byte> small(std::min<size_t>(size, 3));
    Result<size_t> s = client_->direct_read(p, small);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(*s, small.size());
    EXPECT_TRUE(std::equal(small.begin(), small.end(), value.begin()));

    // A shorter write zero-fills the rest.
    std::vector<std::byte> one{std::byte{0x7f}};
    ASSERT_TRUE(client_->write(p, one).ok());
    ASSERT_TRUE(client_->direct_read(p, out).ok());
    EXPECT_EQ(out[0], std::byte{0x7f});
    EXPECT_TRUE(
        std::all_of(out.begin() + 1, out.end(), [](std::byte b) { return b == std::byte{0}; }));
  }
  ObjectClientStats st = client_->stats();
  EXPECT_GT(st.direct_reads, 0u);
  EXPECT_EQ(st.direct_ok, st.direct_reads);
  EXPECT_GT(st.scans, 0u);
  EXPECT_GT(st.rpc_reads, 0u);
  EXPECT_EQ(st.corrections, 0u);
}

TEST_P(ObjectClientE2E, ReadValidationFollowsTheTransportAndCanBeForced) {
  const size_t max = client_->server_info(0).max_object_size();
  const bool native_tcp = GetParam() == "tcp";
  for (ReadValidation mode : {ReadValidation::kAuto, ReadValidation::kVersions,
                              ReadValidation::kVersionsAndHeaderRecheck}) {
    SCOPED_TRACE("validation " + std::to_string(static_cast<int>(mode)));
    ObjectClientOptions o;
    o.validation = mode;
    auto c = env_->Connect(o);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    ObjectClient& cl = **c;
    uint64_t index = 0;
    for (size_t size : {size_t{24}, size_t{1000}, max}) {
      Result<Ptr> a = cl.alloc(size);
      ASSERT_TRUE(a.ok()) << a.status().ToString();
      Ptr p = *a;
      ASSERT_TRUE(cl.write(p, objects_test::MakeValue(size, ++index, 3)).ok());
      std::vector<std::byte> out(size);
      for (int path = 0; path < 3; ++path) {
        Result<size_t> r = path == 0   ? cl.direct_read(p, out)
                           : path == 1 ? cl.scan_read(p, out)
                                       : cl.read_any(p, out);
        ASSERT_TRUE(r.ok()) << path << ": " << r.status().ToString();
        const auto v = objects_test::CheckValue(out);
        EXPECT_TRUE(v.checksum_ok && v.index == index && v.seq == 3) << path;
      }
    }
    // Nothing writes concurrently: every recheck passes, and only the recheck mode (chosen, or
    // picked by kAuto for a transport other than native TCP) rechecks at all.
    const bool recheck = mode == ReadValidation::kVersionsAndHeaderRecheck ||
                         (mode == ReadValidation::kAuto && !native_tcp);
    const ObjectClientStats st = cl.stats();
    EXPECT_EQ(st.header_rechecks, recheck ? 9u : 0u);
    EXPECT_EQ(st.recheck_failures, 0u);
    EXPECT_EQ(st.direct_ok, 6u);
  }
}

TEST_P(ObjectClientE2E, BadSizesAndServersAreRejectedBeforeSending) {
  const size_t max = client_->server_info(0).max_object_size();
  auto zero = client_->alloc(0);
  EXPECT_EQ(zero.status().code(), Code::kInvalidArgument) << zero.status().ToString();
  auto big = client_->alloc(max + 1);
  EXPECT_EQ(big.status().code(), Code::kInvalidArgument);
  EXPECT_NE(big.status().message().find(std::to_string(max)), std::string_view::npos);
  auto nosrv = client_->alloc(8, 3);
  EXPECT_EQ(nosrv.status().code(), Code::kInvalidArgument);
  EXPECT_NE(nosrv.status().message().find("server index 3"), std::string_view::npos);

  Result<Ptr> a = client_->alloc(30);
  ASSERT_TRUE(a.ok());
  Ptr p = *a;
  std::vector<std::byte> too_big(client_->server_info(0).classes[p.size_class].payload_capacity +
                                 1);
  Status w = client_->write(p, too_big);
  EXPECT_EQ(w.code(), Code::kInvalidArgument) << w.ToString();
  auto c = client_->compact(0, uint16_t{9999});
  EXPECT_EQ(c.status().code(), Code::kInvalidArgument);
  auto c2 = client_->compact(4);
  EXPECT_EQ(c2.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(client_->stats_json(4).status().code(), Code::kInvalidArgument);
}

TEST_P(ObjectClientE2E, FreeThenReadAndDoubleFree) {
  // Several objects of one class so the block stays alive after one free.
  std::vector<Ptr> ptrs;
  for (int i = 0; i < 8; ++i) {
    Result<Ptr> a = client_->alloc(40);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    ptrs.push_back(*a);
    Put(ptrs.back(), 40, i);
  }
  Ptr victim = ptrs[3];
  Ptr copy = victim;
  ASSERT_TRUE(client_->free(victim).ok());
  EXPECT_FALSE(victim.valid()) << "free invalidates the pointer";

  std::vector<std::byte> out(40);
  Result<size_t> d = client_->direct_read(copy, out);
  EXPECT_EQ(d.status().code(), Code::kMoved) << d.status().ToString();
  EXPECT_EQ(copy, ptrs[3]) << "direct_read leaves the pointer unchanged";
  Result<size_t> s = client_->scan_read(copy, out);
  EXPECT_EQ(s.status().code(), Code::kNotFound) << s.status().ToString();
  EXPECT_NE(s.status().message().find("freed"), std::string_view::npos);
  Result<size_t> any = client_->read_any(copy, out);
  EXPECT_EQ(any.status().code(), Code::kNotFound) << any.status().ToString();
  Result<size_t> rpc = client_->read(copy, out);
  EXPECT_FALSE(rpc.ok());

  // Freeing the invalidated pointer is caught locally; freeing a stale copy by the server.
  Status again = client_->free(victim);
  EXPECT_EQ(again.code(), Code::kInvalidArgument) << again.ToString();
  Status twice = client_->free(copy);
  EXPECT_EQ(twice.code(), Code::kNotFound) << twice.ToString();

  // The neighbours are untouched.
  for (int i = 0; i < 8; ++i) {
    if (i == 3) continue;
    ASSERT_TRUE(client_->direct_read(ptrs[i], out).ok());
    auto v = objects_test::CheckValue(out);
    EXPECT_TRUE(v.checksum_ok);
    EXPECT_EQ(v.index, static_cast<uint64_t>(i));
  }
  // Free everything: the block is released and a stale pointer's read sees no object either.
  for (int i = 0; i < 8; ++i) {
    if (i != 3) {
      ASSERT_TRUE(client_->free(ptrs[i]).ok());
    }
  }
  Ptr last = ptrs[0];
  last.flags = Ptr::kPtrValid;
  EXPECT_EQ(client_->read_any(last, out).status().code(), Code::kNotFound);
}

TEST_P(ObjectClientE2E, ForgedPointersGetClearErrorsAndTheServerKeepsServing) {
  Result<Ptr> a = client_->alloc(100);
  ASSERT_TRUE(a.ok());
  Ptr p = *a;
  Put(p, 100, 77);
  std::vector<std::byte> out(100);
  const ObjectServerInfo& info = client_->server_info(0);

  // Wrong ID: the slot holds another object; no slot of the block has the forged ID.
  Ptr wrong_id = p;
  wrong_id.id = static_cast<uint16_t>(p.id ^ 0x5a5a);
  EXPECT_EQ(client_->direct_read(wrong_id, out).status().code(), Code::kMoved);
  EXPECT_EQ(client_->read_any(wrong_id, out).status().code(), Code::kNotFound);
  EXPECT_FALSE(client_->read(wrong_id, out).ok());
  EXPECT_FALSE(client_->write(wrong_id, out).ok());
  EXPECT_FALSE(client_->free(wrong_id).ok());
  Ptr wrong_id_locate = wrong_id;
  EXPECT_FALSE(client_->locate(wrong_id_locate).ok());

  // Wrong class: checked locally when it does not even exist or the offset is off its grid.
  Ptr wrong_class = p;
  wrong_class.size_class = static_cast<uint16_t>(info.classes.size());
  EXPECT_EQ(client_->direct_read(wrong_class, out).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(client_->free(wrong_class).code(), Code::kInvalidArgument);
  // A class whose grid the offset happens to be on (block start): the server refuses it.
  Ptr other_class = p;
  other_class.offset = p.offset - p.offset % info.classes[p.size_class].block_bytes;
  other_class.size_class = static_cast<uint16_t>(p.size_class == 0 ? 1 : p.size_class - 1);
  EXPECT_FALSE(client_->read(other_class, out).ok());
  EXPECT_FALSE(client_->free(other_class).ok());

  // Wrong offsets: inside a slot, beyond the region, in a block never allocated.
  Ptr inside = p;
  inside.offset += 8;
  Status st = client_->free(inside);
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
  Ptr beyond = p;
  beyond.offset = info.region_length + p.offset;
  EXPECT_EQ(client_->read(beyond, out).status().code(), Code::kInvalidArgument);
  Ptr far = p;
  far.offset = info.region_length - info.block_size;  // the last block: nothing lives there
  Result<size_t> fr = client_->direct_read(far, out);
  EXPECT_EQ(fr.status().code(), Code::kMoved) << fr.status().ToString();
  EXPECT_EQ(client_->read_any(far, out).status().code(), Code::kNotFound);
  EXPECT_FALSE(client_->read(far, out).ok());
  EXPECT_FALSE(client_->free(far).ok());
  // Not a pointer at all / unknown server.
  Ptr invalid;
  EXPECT_EQ(client_->read_any(invalid, out).status().code(), Code::kInvalidArgument);
  Ptr other_server = p;
  other_server.server = 9;
  EXPECT_EQ(client_->direct_read(other_server, out).status().code(), Code::kInvalidArgument);

  // Still serving, and the real object is intact.
  ASSERT_TRUE(client_->read_any(p, out).ok());
  EXPECT_EQ(objects_test::CheckValue(out).index, 77u);
  EXPECT_TRUE(objects_test::CheckValue(out).checksum_ok);
  Result<Ptr> b = client_->alloc(10);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
}

TEST_P(ObjectClientE2E, CoroutineCallsInFlightOnOneScheduler) {
  auto made = env_->node->make_scheduler();
  ASSERT_TRUE(made.ok());
  Scheduler& s = **made;
  constexpr int kN = 32;
  std::vector<Ptr> ptrs(kN);
  std::vector<Status> errors(kN);
  auto one = [](ObjectClient* c, Scheduler* s, Ptr* out, Status* err, int i) -> Task<void> {
    Result<Ptr> a = co_await c->alloc(*s, 80);
    if (!a.ok()) {
      *err = a.status();
      co_return;
    }
    *out = *a;
    auto v = objects_test::MakeValue(80, i, 5);
    Status w = co_await c->write(*s, *out, v);
    if (!w.ok()) {
      *err = w;
      co_return;
    }
    std::vector<std::byte> back(80);
    Result<size_t> r = co_await c->read_any(*s, *out, back);
    if (!r.ok()) {
      *err = r.status();
    } else if (back != v) {
      *err = Status::Internal("value mismatch");
    }
  };
  for (int i = 0; i < kN; ++i) s.spawn(one(client_.get(), &s, &ptrs[i], &errors[i], i));
  ASSERT_TRUE(s.run(std::chrono::seconds(30)).ok());
  std::set<uint64_t> offsets;
  for (int i = 0; i < kN; ++i) {
    EXPECT_TRUE(errors[i].ok()) << i << ": " << errors[i].ToString();
    offsets.insert(ptrs[i].offset);
  }
  EXPECT_EQ(offsets.size(), static_cast<size_t>(kN)) << "distinct objects";
  Result<std::string> st = s.block_on(client_->stats_json(s, 0));
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_TRUE(nlohmann::json::parse(*st).contains("objects"));
}

// Fills many blocks of one class, frees 75 % at random, compacts, and checks every survivor
// through read_any with the given correction mode: intact, pointers corrected in place. With
// `redraws`, merges must have re-drawn IDs (the server's id_bits make them collide) and read_any
// must have followed them (the new ID comes from the server's LOCATE answer).
// kSize 48: 4 KiB blocks of 64 slots; 2000: 64 KiB blocks (16 base blocks) of 31 slots, so merges
// remap multi-page blocks and scans read whole 64 KiB blocks.
void CompactAndVerify(ObjectClient& client, Correction mode, bool redraws = false,
                      size_t kSize = 48) {
  constexpr int kObjects = 512;
  std::vector<Ptr> ptrs;
  for (int i = 0; i < kObjects; ++i) {
    Result<Ptr> a = client.alloc(kSize);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    ptrs.push_back(*a);
    auto v = objects_test::MakeValue(kSize, i, 9);
    ASSERT_TRUE(client.write(ptrs.back(), v).ok());
  }
  std::mt19937_64 rng(42);
  std::vector<int> order(kObjects);
  for (int i = 0; i < kObjects; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<bool> live(kObjects, true);
  for (int k = 0; k < kObjects * 3 / 4; ++k) {
    ASSERT_TRUE(client.free(ptrs[order[k]]).ok());
    live[order[k]] = false;
  }
  const std::vector<Ptr> before = ptrs;
  uint32_t merges = 0;
  for (int round = 0; round < 20; ++round) {
    Result<CompactResult> c = client.compact(0);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_TRUE(nlohmann::json::parse(c->stats_json, nullptr, false).is_object()) << c->stats_json;
    merges += c->merges;
    if (c->merges == 0) break;
  }
  EXPECT_GT(merges, 0u) << "75 % free blocks must merge";

  const ObjectClientStats s0 = client.stats();
  std::vector<std::byte> out(kSize);
  int moved = 0, renamed = 0, corrected = 0;
  for (int i = 0; i < kObjects; ++i) {
    if (!live[i]) continue;
    Result<size_t> r = client.read_any(ptrs[i], out);
    ASSERT_TRUE(r.ok()) << i << ": " << r.status().ToString();
    auto v = objects_test::CheckValue(out);
    ASSERT_TRUE(v.checksum_ok) << i;
    ASSERT_EQ(v.index, static_cast<uint64_t>(i));
    ASSERT_EQ(v.seq, 9u);
    const ObjectServerInfo& info = client.server_info(0);
    EXPECT_EQ(objects_internal::BlockStart(info, ptrs[i].size_class, ptrs[i].offset),
              objects_internal::BlockStart(info, before[i].size_class, before[i].offset))
        << "pointers stay in their block";
    EXPECT_EQ(ptrs[i].gen, before[i].gen);
    if (ptrs[i].offset != before[i].offset) ++moved;
    if (ptrs[i].id != before[i].id) ++renamed;
    if (ptrs[i].offset != before[i].offset || ptrs[i].id != before[i].id) ++corrected;
    // The corrected pointer now reads directly.
    Result<size_t> again = client.direct_read(ptrs[i], out);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
  }
  const ObjectClientStats s1 = client.stats();
  EXPECT_GT(moved, 0) << "some objects must have been relocated by the merges";
  if (redraws) {
    EXPECT_GT(renamed, 0) << "merges must have re-drawn IDs";
  }
  EXPECT_EQ(s1.corrections - s0.corrections, static_cast<uint64_t>(corrected));
  EXPECT_GE(s1.moved - s0.moved, static_cast<uint64_t>(moved));
  if (mode == Correction::kScan) {
    // (A re-drawn ID is not in the scan: read_any then asks the server.)
    EXPECT_GE(s1.scans - s0.scans, static_cast<uint64_t>(moved));
  } else {
    EXPECT_EQ(s1.scans, s0.scans) << "ask-owner mode never scans";
  }
  // The server reports the work in its STAT "objects" section.
  Result<std::string> st = client.stats_json(0);
  ASSERT_TRUE(st.ok());
  const nlohmann::json j = nlohmann::json::parse(*st);
  ASSERT_TRUE(j.contains("objects")) << *st;
  if (redraws) {
    uint64_t redrawn = 0;
    for (const auto& c : j["objects"]["classes"]) redrawn += c.value("ids_redrawn", uint64_t{0});
    EXPECT_GE(redrawn, static_cast<uint64_t>(renamed)) << *st;
    EXPECT_EQ(j["objects"]["compaction"].value("ids_redrawn", uint64_t{0}), redrawn) << *st;
  }
}

// 8-bit IDs: blocks of this class have ~64 slots and 256 IDs, so most merges collide and
// re-draw the colliding objects' IDs.
ObjectsConfig CollidingIds() {
  ObjectsConfig o = ObjectEnv::DefaultObjects();
  o.id_bits = 8;
  return o;
}

TEST_P(ObjectClientE2E, CompactionMovesObjectsScanCorrection) {
  ObjectClientOptions o;
  o.correction = Correction::kScan;
  Boot(ObjectEnv::DefaultObjects(), o);
  CompactAndVerify(*client_, Correction::kScan);
}

TEST_P(ObjectClientE2E, CompactionMovesObjectsAskOwnerCorrection) {
  ObjectClientOptions o;
  o.correction = Correction::kAskOwner;
  Boot(ObjectEnv::DefaultObjects(), o);
  CompactAndVerify(*client_, Correction::kAskOwner);
}

TEST_P(ObjectClientE2E, CompactionOfMultiPageBlocksScanCorrection) {
  ObjectClientOptions o;
  o.correction = Correction::kScan;
  Boot(ObjectEnv::DefaultObjects(), o);
  const auto& cls =
      client_->server_info(0).classes[*corm::SizeClasses::Create({}).value().ClassFor(2000)];
  ASSERT_GT(cls.block_bytes, client_->server_info(0).block_size);
  CompactAndVerify(*client_, Correction::kScan, /*redraws=*/false, 2000);
}

TEST_P(ObjectClientE2E, CompactionOfMultiPageBlocksAskOwnerCorrection) {
  ObjectClientOptions o;
  o.correction = Correction::kAskOwner;
  Boot(ObjectEnv::DefaultObjects(), o);
  CompactAndVerify(*client_, Correction::kAskOwner, /*redraws=*/false, 2000);
}

TEST_P(ObjectClientE2E, CompactionRedrawsIdsScanCorrection) {
  ObjectClientOptions o;
  o.correction = Correction::kScan;
  Boot(CollidingIds(), o);
  CompactAndVerify(*client_, Correction::kScan, /*redraws=*/true);
}

TEST_P(ObjectClientE2E, CompactionRedrawsIdsAskOwnerCorrection) {
  ObjectClientOptions o;
  o.correction = Correction::kAskOwner;
  Boot(CollidingIds(), o);
  CompactAndVerify(*client_, Correction::kAskOwner, /*redraws=*/true);
}

TEST_P(ObjectClientE2E, OffsetOnlyObjectsNeverMove) {
  ObjectsConfig cfg = ObjectEnv::DefaultObjects();
  cfg.id_bits = 0;  // every class offset-only
  Boot(cfg, {});
  constexpr int kN = 256;
  std::vector<Ptr> ptrs;
  for (int i = 0; i < kN; ++i) {
    Result<Ptr> a = client_->alloc(48);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    EXPECT_EQ(a->id, 0);
    EXPECT_EQ(client_->server_info(0).classes[a->size_class].id_mask, 0u);
    ptrs.push_back(*a);
    Put(ptrs.back(), 48, i);
  }
  std::vector<std::byte> out(48);
  // Offset-only blocks merge only when their occupied offsets are disjoint: keep the first
  // quarter of the slots in every other block and the third quarter in the rest.
  const ObjectServerInfo& info = client_->server_info(0);
  const uint32_t block_bytes = info.classes[ptrs[0].size_class].block_bytes;
  const uint32_t slots = block_bytes / info.classes[ptrs[0].size_class].slot_size;
  std::map<uint64_t, int> block_rank;
  std::vector<bool> keep(kN);
  for (int i = 0; i < kN; ++i) {
    const uint64_t block = ptrs[i].offset / block_bytes;
    const int rank = block_rank.emplace(block, static_cast<int>(block_rank.size())).first->second;
    const uint64_t slot = ptrs[i].offset % block_bytes / info.classes[ptrs[i].size_class].slot_size;
    keep[i] = rank % 2 == 0 ? slot < slots / 4 : (slot >= slots / 2 && slot < 3 * slots / 4);
  }
  ASSERT_GE(block_rank.size(), 2u);
  bool checked_gone = false;
  for (int i = 0; i < kN; ++i) {
    if (keep[i]) continue;
    Ptr gone = ptrs[i];
    ASSERT_TRUE(client_->free(ptrs[i]).ok());
    if (!checked_gone) {
      checked_gone = true;
      Result<size_t> d = client_->direct_read(gone, out);
      EXPECT_EQ(d.status().code(), Code::kNotFound)
          << "an offset-only object cannot have moved: " << d.status().ToString();
      EXPECT_EQ(client_->scan_read(gone, out).status().code(), Code::kNotFound);
    }
  }
  uint32_t merges = 0;
  for (int round = 0; round < 10; ++round) {
    auto c = client_->compact(0);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    merges += c->merges;
    if (c->merges == 0) break;
  }
  EXPECT_GT(merges, 0u) << "blocks with disjoint offsets must merge";
  for (int i = 0; i < kN; ++i) {
    if (!keep[i]) continue;
    const Ptr before = ptrs[i];
    ASSERT_TRUE(client_->direct_read(ptrs[i], out).ok()) << i;
    auto v = objects_test::CheckValue(out);
    EXPECT_TRUE(v.checksum_ok);
    EXPECT_EQ(v.index, static_cast<uint64_t>(i));
    EXPECT_EQ(ptrs[i].offset, before.offset);
  }
  EXPECT_EQ(client_->stats().corrections, 0u);
  EXPECT_EQ(client_->stats().moved, 0u);
}

TEST_P(ObjectClientE2E, ReleasePtrRehomesAndRetiresTheOldName) {
  // Fragment and compact so survivors live in merged blocks, homed at aliases.
  constexpr int kN = 256;
  std::vector<Ptr> ptrs;
  for (int i = 0; i < kN; ++i) {
    Result<Ptr> a = client_->alloc(48);
    ASSERT_TRUE(a.ok());
    ptrs.push_back(*a);
    Put(ptrs.back(), 48, i);
  }
  for (int i = 0; i < kN; ++i) {
    if (i % 4 != 0) {
      ASSERT_TRUE(client_->free(ptrs[i]).ok());
    }
  }
  for (int round = 0; round < 10; ++round) {
    auto c = client_->compact(0);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    if (c->merges == 0) break;
  }
  std::vector<std::byte> out(48);
  int rehomed = 0;
  for (int i = 0; i < kN; i += 4) {
    Ptr p = ptrs[i];
    ASSERT_TRUE(client_->read_any(p, out).ok());
    const Ptr old = p;
    Status st = client_->release_ptr(p);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(p.id, old.id);
    EXPECT_TRUE(p.valid());
    ASSERT_TRUE(client_->direct_read(p, out).ok()) << "the new pointer reads directly";
    auto v = objects_test::CheckValue(out);
    EXPECT_TRUE(v.checksum_ok);
    EXPECT_EQ(v.index, static_cast<uint64_t>(i));
    if (p.offset / 4096 != old.offset / 4096) {
      ++rehomed;
      Ptr stale = old;
      EXPECT_FALSE(client_->read_any(stale, out).ok()) << "the old name is dead";
      EXPECT_FALSE(client_->read(stale, out).ok());
    }
    ptrs[i] = p;
  }
  EXPECT_GT(rehomed, 0) << "after merges some objects live in another block's primary";
  for (int i = 0; i < kN; i += 4) {
    ASSERT_TRUE(client_->read(ptrs[i], out).ok());
    EXPECT_EQ(objects_test::CheckValue(out).index, static_cast<uint64_t>(i));
    ASSERT_TRUE(client_->free(ptrs[i]).ok());
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, ObjectClientE2E, ::testing::Values("tcp", "fabric:shm"),
                         [](const auto& info) {
                           return info.param == "tcp" ? std::string("tcp")
                                                      : std::string("fabric_shm");
                         });

}  // namespace
}  // namespace farmem
