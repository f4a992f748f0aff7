// libFuzzer target for the object RPCs (objects/format/object_wire.h) as farmemd decodes them: a
// sequence of OBJ_* request bodies goes through ObjectService::Handle, the very function the node
// calls for each RPC, on a real store (small, one worker, no compaction thread) created per input.
// No network: the Node only exists because the service exports its region through one (its TCP
// transport is never started). Store IDs come from std::random_device (objects/engine), so a
// finding may need a few runs of its input to reproduce.
//
// Input: byte 0 picks the store geometry (id_bits 0/8/12/16, hybrid); then operations, each an
// opcode byte and its operands (see Run()). Requests are either well-formed ones through the
// pointers the model holds, or raw bytes / mutated pointers (forged), for every opcode.
//
// Checked beyond "no crash", for every answer: an error leaves the reply empty; a request of the
// wrong size, or a pointer with non-zero reserved bytes, is a Protocol error; every pointer in a
// reply has zero reserved bytes, an existing size class, lies inside the region on a slot boundary
// of its class, and has an ID inside the class's mask; READ / WRITE / LOCATE replies keep the
// request's class, generation and home block, and its ID unless a merge re-drew it (the model
// learns re-draws after each compaction and keeps every old name); OBJ_INFO is consistent with the
// slot layout code; OBJ_ALLOC picks the smallest class that fits. A model of the live objects
// checks, while no forged request has succeeded in changing something: reads through a live pointer
// return exactly the bytes last written (zeros after ALLOC), writes/locates/releases/frees through
// live pointers succeed and keep class, ID and (except a re-homing RELEASE) generation, and
// oversize writes are refused.
//
// Strict stale-pointer mode (on by default; FARMEM_FUZZ_STALE_POINTERS=0 turns it off) checks that
// pointers are exact on the RPC paths (issue 16; docs/objects.md, "Pointer identity"): FREE /
// WRITE / RELEASE / READ through a freed or released pointer fail with NotFound or
// InvalidArgument and change nothing; no request through a pointer that names no live object (home
// block, class, ID and generation; offset-only classes: slot and generation) succeeds, e.g. a live
// pointer with another generation; and no allocation gets the identity of a dead pointer. The one
// exception, a 16-bit per-block generation counter that wrapped, needs >= 2^15 allocations homed
// at one virtual block: more than an input's 256 operations can make.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/fuzz_support.h"
#include "farmem/node.h"
#include "farmem/server.h"
#include "objects/format/object_layout.h"
#include "objects/format/object_wire.h"
#include "objects/format/size_classes.h"
#include "objects/service/object_service.h"

namespace {

using namespace farmem;
namespace wire = farmem::object_wire;

bool g_strict_stale = true;

Node& TheNode() {
  static std::unique_ptr<Node> node = [] {
    NodeConfig nc;
    nc.name = "object-rpc-fuzz";
    nc.transport.backend = "tcp";
    nc.transport.cluster_token = "fuzz";
    auto n = Node::Create(nc);
    FUZZ_CHECK(n.ok());
    return std::move(*n);
  }();
  return *node;
}

struct Reader {
  std::span<const uint8_t> in;
  bool empty() const { return in.empty(); }
  uint8_t byte() {
    if (in.empty()) return 0;
    const uint8_t b = in[0];
    in = in.subspan(1);
    return b;
  }
  uint16_t u16() { return static_cast<uint16_t>(byte() | (byte() << 8)); }
  std::vector<std::byte> bytes(size_t n) {
    n = std::min(n, in.size());
    std::vector<std::byte> out(n);
    if (n > 0) std::memcpy(out.data(), in.data(), n);
    in = in.subspan(n);
    return out;
  }
};

template <typename T>
std::vector<std::byte> Bytes(const T& v) {
  std::vector<std::byte> out(sizeof(T));
  std::memcpy(out.data(), &v, sizeof(T));
  return out;
}

struct Object {
  wire::WirePtr ptr;
  std::vector<uint8_t> payload;  // the whole payload capacity, as last written
  // Earlier names: the object's IDs before merges re-drew them (docs/objects.md, "Merges that
  // re-draw IDs"). They name the object as long as it lives; once it is freed or re-homed they
  // are dead pointers.
  std::vector<wire::WirePtr> old_names;
};

class Harness {
 public:
  explicit Harness(uint8_t geometry) {
    static constexpr int kIdBits[] = {0, 8, 12, 16};
    ServerConfig sc;
    sc.memory_bytes = 1 << 20;
    sc.pool_bytes = 64 << 10;
    sc.node.rpc_workers = 1;
    sc.objects.block_size = 4096;
    sc.objects.id_bits = kIdBits[geometry & 3];
    sc.objects.hybrid = (geometry & 4) == 0;
    sc.objects.compaction.interval_ms = 0;  // no leader thread: OBJ_COMPACT compacts
    sc.objects.compaction.max_merges_per_second = 0;
    id_bits_ = sc.objects.id_bits;
    auto s = ObjectService::Create(sc, TheNode(), sessions_);
    FUZZ_CHECK(s.ok());
    service_ = std::move(*s);
    LoadInfo();
  }
  ~Harness() {
    service_.reset();
    // The next input's store exports the region again.
    (void)TheNode().unexport_region(ObjectService::kRegionName);
  }

  void Run(Reader& in) {
    for (int ops = 0; !in.empty() && ops < 256; ++ops) {
      const uint8_t op = in.byte();
      switch (op % 12) {
        case 0:
          Alloc(in.u16() % 5000);
          break;
        case 1:
          ReadLive(in.byte(), in.u16());
          break;
        case 2:
          WriteLive(in.byte(), in.u16() % 4200, in.byte());
          break;
        case 3:
          FreeLive(in.byte());
          break;
        case 4:
          LocateLive(in.byte(), op & 0x10);
          break;
        case 5:
          Compact(in.byte());
          break;
        case 6: {  // any opcode, raw request bytes
          const uint16_t opcode = wire::kOpInfo + in.byte() % 9;
          Forged(opcode, in.bytes(in.byte() % 48));
          break;
        }
        case 7:  // a live or dead pointer with one field changed
          Mutated(in);
          break;
        case 8:  // a freed or released pointer, as is
          Stale(in.byte(), in.byte());
          break;
        default:
          Alloc(in.byte() % 200 + 1);
          break;
      }
    }
  }

 private:
  void LoadInfo() {
    std::vector<std::byte> reply;
    const Status st = Call(wire::kOpInfo, {}, reply);
    FUZZ_CHECK(st.ok() && reply.size() >= sizeof(wire::InfoReply));
    std::memcpy(&info_, reply.data(), sizeof(info_));
    FUZZ_CHECK(reply.size() == sizeof(info_) + info_.num_classes * sizeof(wire::WireClass));
    FUZZ_CHECK(info_.block_size == 4096 && info_.id_bits == id_bits_ && info_.num_classes > 0 &&
               info_.num_classes <= corm::kMaxSizeClasses);
    FUZZ_CHECK(info_.region_length >= info_.block_size);
    const uint32_t full_mask = id_bits_ == 0 ? 0 : (1u << id_bits_) - 1;
    for (uint16_t c = 0; c < info_.num_classes; ++c) {
      wire::WireClass wc;
      std::memcpy(&wc, reply.data() + sizeof(info_) + c * sizeof(wc), sizeof(wc));
      FUZZ_CHECK(wc.slot_size >= 16 && wc.slot_size % corm::kSlotAlign == 0 &&
                 wc.slot_size <= wc.block_bytes && wc.block_bytes % info_.block_size == 0);
      FUZZ_CHECK(classes_.empty() || wc.slot_size > classes_.back().slot_size);
      FUZZ_CHECK(wc.payload_capacity == corm::PayloadCapacity(wc.slot_size));
      FUZZ_CHECK(wc.id_mask == 0 || wc.id_mask == full_mask);
      classes_.push_back(wc);
    }
  }

  // One RPC through the service; the checks every answer gets.
  Status Call(uint16_t opcode, const std::vector<std::byte>& request,
              std::vector<std::byte>& reply) {
    reply.clear();
    const Status st = service_->Handle(RpcCall{opcode, request, "fuzz-client"}, reply);
    if (!st.ok()) FUZZ_CHECK(reply.empty());
    return st;
  }

  void CheckPtr(const wire::WirePtr& p) const {
    FUZZ_CHECK(p.reserved == 0);
    FUZZ_CHECK(p.size_class < classes_.size() && p.size_class < corm::kMaxSizeClasses);
    const wire::WireClass& c = classes_[p.size_class];
    FUZZ_CHECK(p.offset % corm::kSlotAlign == 0 && p.offset < info_.region_length &&
               info_.region_length - p.offset >= c.slot_size);
    FUZZ_CHECK(corm::IsSlotStart(p.offset, Geometry(c), info_.block_size));
    FUZZ_CHECK((p.id & ~c.id_mask) == 0);
  }

  // A reply that must be exactly one PtrReply.
  wire::WirePtr PtrOf(const std::vector<std::byte>& reply) const {
    FUZZ_CHECK(reply.size() == sizeof(wire::PtrReply));
    wire::PtrReply r;
    std::memcpy(&r, reply.data(), sizeof(r));
    CheckPtr(r.ptr);
    return r.ptr;
  }

  static corm::SizeClass Geometry(const wire::WireClass& c) {
    return corm::SizeClass{c.slot_size, c.payload_capacity, c.block_bytes / c.slot_size,
                           c.block_bytes};
  }
  uint64_t BlockOf(const wire::WirePtr& p) const {
    return corm::BlockStartOf(p.offset, Geometry(classes_[p.size_class])) / info_.block_size;
  }

  // Whether `a` and `b` name the same allocation as far as the server's RPC paths can tell: same
  // class, ID and generation, and the same home block (ID classes: the server finds the slot by
  // ID, the offset only names the block) or the same slot (offset-only classes).
  bool SameObject(const wire::WirePtr& a, const wire::WirePtr& b) const {
    if (a.size_class != b.size_class || a.id != b.id || a.gen != b.gen) return false;
    if (a.size_class >= classes_.size()) return false;
    if (classes_[a.size_class].id_mask == 0) return a.offset == b.offset;
    return BlockOf(a) == BlockOf(b);
  }
  bool NamesLive(const wire::WirePtr& p) const { return LiveNamed(p) != nullptr; }
  const Object* LiveNamed(const wire::WirePtr& p) const {
    for (const Object& o : live_) {
      if (SameObject(o.ptr, p)) return &o;
      for (const wire::WirePtr& n : o.old_names) {
        if (SameObject(n, p)) return &o;
      }
    }
    return nullptr;
  }
  bool NamesDead(const wire::WirePtr& p) const {
    return std::any_of(dead_.begin(), dead_.end(),
                       [&](const wire::WirePtr& d) { return SameObject(d, p); });
  }

  // A reply to READ / WRITE / LOCATE through `req` names the same object: only the offset inside
  // the home block may change (the object's current slot), and the ID if a merge re-drew it:
  // then `req` is an old name of a live object whose current ID the reply carries (the model
  // learns every re-draw: Refresh after each compaction), unless the model lost track.
  void CheckSameName(const wire::WirePtr& req, const wire::WirePtr& reply) const {
    FUZZ_CHECK(reply.size_class == req.size_class && reply.gen == req.gen);
    FUZZ_CHECK(BlockOf(reply) == BlockOf(req));
    if (reply.id != req.id && !tainted_) {
      const Object* o = LiveNamed(req);
      FUZZ_CHECK(o != nullptr && o->ptr.id == reply.id);
    }
  }

  // A reply named o's object (CheckSameName passed): take its pointer, keeping an old ID.
  static void Renamed(Object& o, const wire::WirePtr& p) {
    if (p.id != o.ptr.id) o.old_names.push_back(o.ptr);
    o.ptr = p;
  }

  // After a compaction: learn every re-drawn ID (LOCATE through each live pointer), so the
  // model keeps knowing every name of every live object.
  void Refresh() {
    if (tainted_) return;
    for (Object& o : live_) {
      std::vector<std::byte> reply;
      const Status st = Call(wire::kOpLocate, Bytes(wire::PtrRequest{o.ptr}), reply);
      FUZZ_CHECK(st.ok());
      const wire::WirePtr p = PtrOf(reply);
      FUZZ_CHECK(p.size_class == o.ptr.size_class && p.gen == o.ptr.gen &&
                 BlockOf(p) == BlockOf(o.ptr));
      Renamed(o, p);
    }
  }

  // o is gone (freed, or re-homed: RELEASE): all its names are dead pointers.
  void Bury(Object& o) {
    dead_.push_back(o.ptr);
    dead_.insert(dead_.end(), o.old_names.begin(), o.old_names.end());
    o.old_names.clear();
  }

  // A new object (ALLOC): never the identity of a live or (strict mode) a dead one.
  void NewObject(const wire::WirePtr& p) {
    if (!tainted_) {
      for (const Object& o : live_) FUZZ_CHECK(!SameObject(o.ptr, p));  // nor the same pointer
    }
    if (g_strict_stale && NamesDead(p)) {
      Report("ALLOC", p, "a new object got the identity of a freed or released pointer");
    }
    live_.push_back({p, std::vector<uint8_t>(classes_[p.size_class].payload_capacity, 0)});
  }

  [[noreturn]] void Report(const char* what, const wire::WirePtr& p, const char* why) const {
    std::fprintf(stderr,
                 "%s through {offset %llu (block %llu), id %u, class %u, gen %u}: %s (id_bits %d, "
                 "%zu live objects, %zu dead pointers%s)\n",
                 what, static_cast<unsigned long long>(p.offset),
                 static_cast<unsigned long long>(BlockOf(p)), p.id, p.size_class, p.gen, why,
                 id_bits_, live_.size(), dead_.size(), tainted_ ? ", model tainted" : "");
    FUZZ_CHECK(!"stale pointer accepted");
    std::abort();
  }

  Object* Live(uint8_t index) {
    if (live_.empty()) return nullptr;
    return &live_[index % live_.size()];
  }

  void Alloc(uint16_t size) {
    std::vector<std::byte> reply;
    const Status st = Call(wire::kOpAlloc, Bytes(wire::AllocRequest{size, 0}), reply);
    const uint32_t max = classes_.back().payload_capacity;
    if (size == 0 || size > max) {
      FUZZ_CHECK(st.code() == Code::kInvalidArgument);
      return;
    }
    if (!st.ok()) {
      FUZZ_CHECK(st.code() == Code::kResourceExhausted);  // the 1 MiB store is full
      return;
    }
    const wire::WirePtr p = PtrOf(reply);
    // The smallest class that holds `size` bytes.
    FUZZ_CHECK(classes_[p.size_class].payload_capacity >= size);
    FUZZ_CHECK(p.size_class == 0 || classes_[p.size_class - 1].payload_capacity < size);
    NewObject(p);
  }

  void ReadLive(uint8_t index, uint16_t max_bytes) {
    Object* o = Live(index);
    if (o == nullptr) return;
    wire::ReadRequest req{};
    req.ptr = o->ptr;
    req.max_bytes = max_bytes;
    std::vector<std::byte> reply;
    const Status st = Call(wire::kOpRead, Bytes(req), reply);
    if (tainted_) return;
    FUZZ_CHECK(st.ok());
    FUZZ_CHECK(reply.size() >= sizeof(wire::PtrReply));
    const size_t n = reply.size() - sizeof(wire::PtrReply);
    FUZZ_CHECK(n == std::min<size_t>(max_bytes, o->payload.size()));
    std::vector<std::byte> head(reply.begin(), reply.begin() + sizeof(wire::PtrReply));
    const wire::WirePtr p = PtrOf(head);
    CheckSameName(o->ptr, p);
    FUZZ_CHECK(n == 0 ||
               std::memcmp(reply.data() + sizeof(wire::PtrReply), o->payload.data(), n) == 0);
    Renamed(*o, p);
  }

  void WriteLive(uint8_t index, uint16_t len, uint8_t fill) {
    Object* o = Live(index);
    if (o == nullptr) return;
    std::vector<std::byte> req = Bytes(wire::PtrRequest{o->ptr});
    std::vector<uint8_t> data(len);
    for (size_t i = 0; i < len; ++i) data[i] = static_cast<uint8_t>(fill + i * 7);
    const auto* b = reinterpret_cast<const std::byte*>(data.data());
    req.insert(req.end(), b, b + data.size());
    std::vector<std::byte> reply;
    const Status st = Call(wire::kOpWrite, req, reply);
    if (tainted_) return;
    if (len > o->payload.size()) {
      FUZZ_CHECK(!st.ok());
      return;
    }
    FUZZ_CHECK(st.ok());
    const wire::WirePtr p = PtrOf(reply);
    CheckSameName(o->ptr, p);
    Renamed(*o, p);
    std::fill(o->payload.begin(), o->payload.end(), 0);
    std::copy(data.begin(), data.end(), o->payload.begin());
  }

  void FreeLive(uint8_t index) {
    if (live_.empty()) return;
    const size_t i = index % live_.size();
    std::vector<std::byte> reply;
    const Status st = Call(wire::kOpFree, Bytes(wire::PtrRequest{live_[i].ptr}), reply);
    if (!tainted_) FUZZ_CHECK(st.ok() && reply.empty());
    Bury(live_[i]);
    live_.erase(live_.begin() + static_cast<std::ptrdiff_t>(i));
  }

  void LocateLive(uint8_t index, bool release) {
    Object* o = Live(index);
    if (o == nullptr) return;
    std::vector<std::byte> reply;
    const Status st =
        Call(release ? wire::kOpRelease : wire::kOpLocate, Bytes(wire::PtrRequest{o->ptr}), reply);
    if (tainted_) return;
    FUZZ_CHECK(st.ok());
    const wire::WirePtr p = PtrOf(reply);
    if (!release || BlockOf(p) == BlockOf(o->ptr)) {
      // LOCATE, or RELEASE of an object already homed at its block's primary: the same name.
      CheckSameName(o->ptr, p);
      Renamed(*o, p);
    } else {
      // Re-homed: a new name (the new home's next generation); the old ones are dead.
      FUZZ_CHECK(p.size_class == o->ptr.size_class && p.id == o->ptr.id);
      if (g_strict_stale && NamesDead(p)) {
        Report("RELEASE", p, "the new name is the identity of a freed or released pointer");
      }
      Bury(*o);
      o->ptr = p;
    }
  }

  void Compact(uint8_t which) {
    wire::CompactRequest req{};
    req.size_class = which == 0xff ? wire::kAllClasses : static_cast<uint16_t>(which % 64);
    std::vector<std::byte> reply;
    const Status st = Call(wire::kOpCompact, Bytes(req), reply);
    if (req.size_class != wire::kAllClasses && req.size_class >= classes_.size()) {
      FUZZ_CHECK(st.code() == Code::kInvalidArgument);
      return;
    }
    FUZZ_CHECK(st.ok() && !reply.empty());
    FUZZ_CHECK(static_cast<char>(reply.front()) == '{' && static_cast<char>(reply.back()) == '}');
    Refresh();
  }

  // Any request the model cannot predict: only the per-answer checks, and the size rules.
  void Forged(uint16_t opcode, const std::vector<std::byte>& request) {
    std::vector<std::byte> reply;
    const Status st = Call(opcode, request, reply);
    const size_t n = request.size();
    switch (opcode) {
      case wire::kOpInfo:
        FUZZ_CHECK(n == 0 ? st.ok() : st.code() == Code::kProtocol);
        break;
      case wire::kOpAlloc:
        if (n != sizeof(wire::AllocRequest)) FUZZ_CHECK(st.code() == Code::kProtocol);
        if (n == sizeof(wire::AllocRequest)) {
          uint64_t size, session;
          std::memcpy(&size, request.data(), sizeof(size));
          std::memcpy(&session, request.data() + 8, sizeof(session));
          // The size is checked first; then the session, and none is open.
          const bool bad_size = size == 0 || size > classes_.back().payload_capacity;
          if (session != 0) {
            FUZZ_CHECK(st.code() == (bad_size ? Code::kInvalidArgument : Code::kNotFound));
          }
        }
        if (st.ok()) {
          const wire::WirePtr p = PtrOf(reply);
          uint64_t size;
          std::memcpy(&size, request.data(), sizeof(size));
          FUZZ_CHECK(size >= 1 && size <= classes_[p.size_class].payload_capacity);
          NewObject(p);
        }
        break;
      case wire::kOpFree:
      case wire::kOpLocate:
      case wire::kOpRelease:
        if (n != sizeof(wire::PtrRequest)) FUZZ_CHECK(st.code() == Code::kProtocol);
        if (st.ok() && opcode != wire::kOpFree) {
          const wire::WirePtr p = PtrOf(reply);
          if (opcode == wire::kOpLocate) CheckSameName(PtrIn(request), p);
        }
        if (st.ok()) Accepted(opcode, request);
        break;
      case wire::kOpWrite:
        if (n < sizeof(wire::PtrRequest)) FUZZ_CHECK(st.code() == Code::kProtocol);
        if (st.ok()) {
          CheckSameName(PtrIn(request), PtrOf(reply));
          Accepted(opcode, request);
        }
        break;
      case wire::kOpRead:
        if (n != sizeof(wire::ReadRequest)) FUZZ_CHECK(st.code() == Code::kProtocol);
        if (st.ok()) {
          wire::ReadRequest req;
          std::memcpy(&req, request.data(), sizeof(req));
          FUZZ_CHECK(reply.size() >= sizeof(wire::PtrReply));
          std::vector<std::byte> head(reply.begin(), reply.begin() + sizeof(wire::PtrReply));
          const wire::WirePtr p = PtrOf(head);
          CheckSameName(req.ptr, p);
          FUZZ_CHECK(reply.size() - sizeof(wire::PtrReply) <=
                     std::min<size_t>(req.max_bytes, classes_[p.size_class].payload_capacity));
          Accepted(opcode, request);
        }
        break;
      case wire::kOpCompact:
        if (n != sizeof(wire::CompactRequest)) FUZZ_CHECK(st.code() == Code::kProtocol);
        if (st.ok()) Refresh();
        break;
      default:
        FUZZ_CHECK(st.code() == Code::kNotFound);  // an opcode the service does not serve
        break;
    }
  }

  static wire::WirePtr PtrIn(const std::vector<std::byte>& request) {
    wire::WirePtr w;
    FUZZ_CHECK(request.size() >= sizeof(w));
    std::memcpy(&w, request.data(), sizeof(w));
    return w;
  }

  // A forged request succeeded. A FREE / WRITE / RELEASE may have changed an object the model
  // knows, so the model's data checks stop for this input. Through a pointer naming a live object
  // that is a legitimate request (the pointer is the capability); through a freed or replaced
  // pointer it is the stale-pointer bug of issue 16, and, while the model knows every live object
  // (untainted), through any pointer that names none (strict mode).
  void Accepted(uint16_t opcode, const std::vector<std::byte>& request) {
    const wire::WirePtr w = PtrIn(request);
    if (g_strict_stale) {
      // Issue 16: a pointer whose object is gone must never reach another allocation.
      if (NamesDead(w)) Report(ObjectService::OpName(opcode), w, "accepted (a dead pointer)");
      if (!tainted_ && !NamesLive(w)) {
        Report(ObjectService::OpName(opcode), w, "accepted (names no live object)");
      }
    }
    if (opcode != wire::kOpRead && opcode != wire::kOpLocate) tainted_ = true;
  }

  void Mutated(Reader& in) {
    const uint8_t what = in.byte();
    const uint8_t index = in.byte();
    const uint16_t value = in.u16();
    wire::WirePtr p{};
    if (Object* o = Live(index); o != nullptr && (what & 0x80) == 0) {
      p = o->ptr;
    } else if (!dead_.empty()) {
      p = dead_[index % dead_.size()];
    } else {
      return;
    }
    switch ((what >> 2) % 6) {
      case 0:
        p.offset += static_cast<int16_t>(value);
        break;
      case 1:
        p.offset ^= uint64_t{1} << (value % 64);
        break;
      case 2:
        p.id ^= value;
        break;
      case 3:
        p.size_class = static_cast<uint16_t>(p.size_class + static_cast<int8_t>(value));
        break;
      case 4:
        p.reserved = static_cast<uint16_t>(value | 1);  // must be 0: Protocol
        break;
      case 5:
        p.gen = value;  // another allocation of the slot (strict mode: must fail unless equal)
        break;
    }
    static constexpr uint16_t kOps[] = {wire::kOpFree, wire::kOpRead, wire::kOpWrite,
                                        wire::kOpLocate};
    const uint16_t opcode = kOps[what & 3];
    std::vector<std::byte> req = Bytes(wire::PtrRequest{p});
    if (opcode == wire::kOpRead) req = Bytes(wire::ReadRequest{p, value, 0});
    if (opcode == wire::kOpWrite) req.resize(req.size() + value % 64, std::byte{0x3c});
    std::vector<std::byte> reply;
    if ((what >> 2) % 6 == 4) {
      FUZZ_CHECK(Call(opcode, req, reply).code() == Code::kProtocol);
      return;
    }
    Forged(opcode, req);
  }

  void Stale(uint8_t index, uint8_t op) {
    if (dead_.empty()) return;
    const wire::WirePtr p = dead_[index % dead_.size()];
    static constexpr uint16_t kOps[] = {wire::kOpFree, wire::kOpRead, wire::kOpWrite,
                                        wire::kOpRelease};
    const uint16_t opcode = kOps[op & 3];
    std::vector<std::byte> req = Bytes(wire::PtrRequest{p});
    if (opcode == wire::kOpRead) req = Bytes(wire::ReadRequest{p, 64, 0});
    if (opcode == wire::kOpWrite) {
      // At most the capacity: an oversize write is refused before the pointer is looked at.
      const size_t len = std::min<size_t>(8, classes_[p.size_class].payload_capacity);
      req.resize(req.size() + len, std::byte{0x77});
    }
    std::vector<std::byte> reply;
    const Status st = Call(opcode, req, reply);
    if (g_strict_stale) {
      // Exact on the RPC paths: a dead pointer reaches no object (no live one can carry its
      // identity before a generation counter wraps), and is refused as such.
      if (st.ok()) {
        if (reply.size() >= sizeof(wire::PtrReply)) {
          wire::PtrReply r;
          std::memcpy(&r, reply.data(), sizeof(r));
          std::fprintf(stderr, "reply pointer {offset %llu, id %u, class %u, gen %u}\n",
                       static_cast<unsigned long long>(r.ptr.offset), r.ptr.id, r.ptr.size_class,
                       r.ptr.gen);
        }
        Report(ObjectService::OpName(opcode), p, "OK through a freed or released pointer");
      }
      if (st.code() != Code::kNotFound && st.code() != Code::kInvalidArgument) {
        std::fprintf(stderr, "%s\n", st.ToString().c_str());
        Report(ObjectService::OpName(opcode), p, "neither NotFound nor InvalidArgument");
      }
    }
    if (st.ok() && opcode != wire::kOpRead) tainted_ = true;
  }

  // Persistent allocations only (session 0), so the model never loses objects; raw requests with
  // other session ids are refused (NotFound) by this registry, which has no session open.
  SessionRegistry sessions_;  // before service_: the service registers its end listener here
  std::unique_ptr<ObjectService> service_;
  int id_bits_ = 0;
  wire::InfoReply info_{};
  std::vector<wire::WireClass> classes_;
  std::vector<Object> live_;
  std::vector<wire::WirePtr> dead_;  // freed, or released and replaced
  bool tainted_ = false;
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  farmem::fuzz::RestoreCrashSignals();
  // Strict unless FARMEM_FUZZ_STALE_POINTERS=0.
  const char* strict = std::getenv("FARMEM_FUZZ_STALE_POINTERS");
  g_strict_stale = strict == nullptr || std::strcmp(strict, "0") != 0;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  Reader in{std::span(data + 1, size - 1)};
  Harness h(data[0]);
  h.Run(in);
  return 0;
}
