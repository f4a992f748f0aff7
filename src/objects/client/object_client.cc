// ObjectClient: the client side of farmem objects (CoRM). RPCs (alloc/free/read/write/locate/
// release/compact/stat) use object_wire.h; direct_read and scan_read copy slots or whole blocks
// one-sidedly and run the server's own layout code (corm::CheckSlot, DecodePayload,
// ScanBlockImage) on the copy, so client and server can never disagree about the slot format.
// Over transports that do not copy in address order they also re-read the header (a seqlock).
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/wire_struct.h"
#include "farmem/objects.h"
#include "node/rpc_call.h"
#include "node/session_keeper.h"
#include "objects/client/object_client_internal.h"
#include "objects/format/object_layout.h"
#include "objects/format/object_wire.h"
#include "objects/format/size_classes.h"

namespace farmem {

namespace wire = object_wire;
using Clock = std::chrono::steady_clock;

namespace {

std::string Hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%#" PRIx64, v);
  return buf;
}

// "object id 0x1a2b (class 3) at offset 0x5040 on server 0": the prefix of every error about p.
std::string Describe(const Ptr& p) {
  return "object id " + Hex(p.id) + " (class " + std::to_string(p.size_class) + ") at offset " +
         Hex(p.offset) + " on server " + std::to_string(p.server);
}

// Exponential backoff for torn/locked copies (1 µs doubling up to max_backoff, 256 µs by
// default). The caller waits with `co_await sched.sleep_for(...)`: only the retrying coroutine
// waits, the scheduler's other coroutines keep going.
// The budget counts from the first retry, so a read that succeeds at once never reads the clock.
class Backoff {
 public:
  Backoff(std::chrono::milliseconds budget, std::chrono::microseconds max)
      : budget_(budget), max_(std::max(max, std::chrono::microseconds(1))) {}
  // nullopt once the budget is spent (caller gives up); else how long to wait before retrying.
  std::optional<std::chrono::microseconds> Next() {
    const auto now = Clock::now();
    if (!deadline_) deadline_ = now + budget_;
    if (now >= *deadline_) return std::nullopt;
    const auto left = std::chrono::duration_cast<std::chrono::microseconds>(*deadline_ - now);
    const auto wait = std::min(cur_, left);
    cur_ = std::min(cur_ * 2, max_);
    return wait;
  }

 private:
  std::chrono::milliseconds budget_;
  std::optional<Clock::time_point> deadline_;  // set by the first Next()
  std::chrono::microseconds max_;
  std::chrono::microseconds cur_{1};
};

uint16_t IdMaskOf(const ObjectServerInfo& info, uint16_t size_class) {
  return static_cast<uint16_t>(info.classes[size_class].id_mask);
}

// direct_read copies slots up to this size into its coroutine frame (the 48..256 B classes).
constexpr size_t kInlineSlotCopyBytes = 256;

uint64_t HeaderOf(std::span<const uint8_t> copy) {
  uint64_t word;
  std::memcpy(&word, copy.data(), sizeof(word));
  return word;
}

// The header tag a pointer's object carries (its ID and the low bits of its generation).
uint16_t TagOf(const Ptr& p, uint16_t id_mask) {
  return corm::TagOf(p.id, p.gen, id_mask);
}

// CheckSlot on a copy (class and full tag), plus the home check: a slot that passes the tag
// check but names another home is some other object (our pointer is stale after release_ptr,
// or forged): "moved".
corm::SlotCheck CheckCopy(std::span<const uint8_t> copy, uint64_t addr, uint16_t tag,
                          uint32_t size_class, uint32_t home) {
  corm::SlotCheck check = corm::CheckSlot(copy, addr, tag, corm::hdr::kTagMask, size_class);
  if (check == corm::SlotCheck::kOk && corm::Header::Unpack(HeaderOf(copy)).home_block != home) {
    check = corm::SlotCheck::kMoved;
  }
  return check;
}

// The test seam of object_client_internal.h. The flag keeps the unset case to one relaxed load.
struct ReadHookSlot {
  std::atomic<bool> set{false};
  std::mutex mu;
  objects_internal::ReadHook hook = nullptr;
  void* ctx = nullptr;
};
ReadHookSlot& Hook() {
  static ReadHookSlot slot;
  return slot;
}
void RunReadHook(objects_internal::ReadStage stage, uint64_t offset, std::span<uint8_t> copy) {
  ReadHookSlot& h = Hook();
  if (!h.set.load(std::memory_order_relaxed)) return;
  objects_internal::ReadHook hook;
  void* ctx;
  {
    std::lock_guard lock(h.mu);
    hook = h.hook;
    ctx = h.ctx;
  }
  if (hook != nullptr) hook(ctx, stage, offset, copy);
}

// A one-sided read found a slot of another size class at the pointer's offset. Objects never
// change class, so the pointer's class is forged (or the pointer is stale and its block now
// holds another class): refused like the RPC path refuses it.
Status WrongClass(std::string_view op, const Ptr& p, uint64_t header) {
  return Status::InvalidArgument(std::string(op) + " " + Describe(p) +
                                 ": the slot holds an object of size class " +
                                 std::to_string(corm::Header::Unpack(header).size_class) +
                                 " (forged size class, or a stale pointer)");
}

// Why a read gave up, for its TimedOut message.
std::string RetryReason(bool changed, corm::SlotCheck check) {
  return changed ? "changing (the header read before or after the copy differed from the copy's)"
                 : std::string(corm::SlotCheckName(check));
}

}  // namespace

// ---- Pure helpers (object_client_internal.h) -------------------------------------------------

namespace objects_internal {

Result<ObjectServerInfo> DecodeInfoReply(std::span<const std::byte> reply,
                                         std::string_view server) {
  const std::string who = "OBJ_INFO reply of " + std::string(server) + ": ";
  if (reply.size() < sizeof(wire::InfoReply)) {
    return Status::Protocol(who + std::to_string(reply.size()) + " bytes, expected at least " +
                            std::to_string(sizeof(wire::InfoReply)));
  }
  wire::InfoReply head;
  std::memcpy(&head, reply.data(), sizeof(head));
  const size_t want = sizeof(wire::InfoReply) + size_t{head.num_classes} * sizeof(wire::WireClass);
  if (reply.size() != want) {
    return Status::Protocol(who + std::to_string(reply.size()) + " bytes for " +
                            std::to_string(head.num_classes) + " size classes, expected " +
                            std::to_string(want));
  }
  if (head.block_size < 4096 || head.block_size > (1u << 20) ||
      (head.block_size & (head.block_size - 1)) != 0) {
    return Status::Protocol(who + "block size " + std::to_string(head.block_size) +
                            " is not a power of two in 4 KiB..1 MiB");
  }
  if (head.id_bits != 0 && head.id_bits != 8 && head.id_bits != 12 && head.id_bits != 16) {
    return Status::Protocol(who + "id_bits " + std::to_string(head.id_bits) +
                            " is not 0, 8, 12 or 16");
  }
  if (head.hybrid > 1) return Status::Protocol(who + "hybrid flag is not 0/1");
  if (head.num_classes == 0) return Status::Protocol(who + "no size classes");
  if (head.num_classes > corm::kMaxSizeClasses) {
    return Status::Protocol(who + std::to_string(head.num_classes) +
                            " size classes; slot headers and pointers hold at most " +
                            std::to_string(corm::kMaxSizeClasses));
  }
  if (head.region_length < head.block_size) {
    return Status::Protocol(who + "object region of " + std::to_string(head.region_length) +
                            " bytes is smaller than one block");
  }
  ObjectServerInfo info;
  info.region_key = head.region_key;
  info.region_length = head.region_length;
  info.block_size = head.block_size;
  info.id_bits = head.id_bits;
  info.hybrid = head.hybrid != 0;
  const uint32_t full_mask = head.id_bits == 0 ? 0 : (1u << head.id_bits) - 1;
  const std::byte* at = reply.data() + sizeof(wire::InfoReply);
  for (uint16_t c = 0; c < head.num_classes; ++c) {
    wire::WireClass wc;
    std::memcpy(&wc, at + size_t{c} * sizeof(wc), sizeof(wc));
    const std::string cls = who + "class " + std::to_string(c) + ": ";
    if (wc.slot_size < 16 || wc.slot_size % corm::kSlotAlign != 0 ||
        wc.slot_size > corm::kMaxSlotSize) {
      return Status::Protocol(cls + "slot size " + std::to_string(wc.slot_size) +
                              " is not a multiple of 8 in 16.." +
                              std::to_string(corm::kMaxSlotSize));
    }
    if (!info.classes.empty() && wc.slot_size <= info.classes.back().slot_size) {
      return Status::Protocol(cls + "slot sizes are not ascending");
    }
    // The client decodes slots with its own copy of the layout code: a different capacity means
    // a different layout, and every one-sided read would decode garbage.
    if (wc.payload_capacity != corm::PayloadCapacity(wc.slot_size)) {
      return Status::Protocol(cls + "payload capacity " + std::to_string(wc.payload_capacity) +
                              " differs from this client's slot layout (" +
                              std::to_string(corm::PayloadCapacity(wc.slot_size)) +
                              "): incompatible farmem versions");
    }
    if (wc.id_mask != 0 && wc.id_mask != full_mask) {
      return Status::Protocol(cls + "id mask " + Hex(wc.id_mask) + " does not match id_bits " +
                              std::to_string(head.id_bits));
    }
    // The block geometry decides which bytes a scan reads and which block a pointer's offset
    // names: a lying server must not make either leave the class's block.
    const uint32_t slots = wc.block_bytes / wc.slot_size;
    if (wc.block_bytes % head.block_size != 0 || slots == 0 ||
        wc.block_bytes > head.region_length ||
        (slots > 1 && (wc.block_bytes & (wc.block_bytes - 1)) != 0)) {
      return Status::Protocol(cls + "block of " + std::to_string(wc.block_bytes) +
                              " bytes is not a whole number of " + std::to_string(head.block_size) +
                              "-byte base blocks holding a slot (a power of two when it holds "
                              "several)");
    }
    info.classes.push_back({wc.slot_size, wc.payload_capacity, wc.id_mask, wc.block_bytes, slots});
  }
  return info;
}

Status CheckPtrShape(const ObjectServerInfo& info, const Ptr& p, std::string_view op) {
  // Built only on error: this check runs on every direct_read.
  auto who = [op] { return std::string(op) + ": "; };
  if (!p.valid()) {
    return Status::InvalidArgument(who() + "invalid pointer (not from alloc(), or already freed)");
  }
  if (p.size_class >= info.classes.size()) {
    return Status::InvalidArgument(who() + "size class " + std::to_string(p.size_class) +
                                   " does not exist (server has " +
                                   std::to_string(info.classes.size()) + ")");
  }
  const auto& c = info.classes[p.size_class];
  if (p.offset % corm::kSlotAlign != 0 || p.offset >= info.region_length ||
      info.region_length - p.offset < c.slot_size) {
    return Status::InvalidArgument(who() + "offset " + Hex(p.offset) +
                                   " is not an 8-aligned slot inside the " +
                                   std::to_string(info.region_length) + "-byte object region");
  }
  // (Masks, not divisions where the sizes are powers of two: this runs on every read.)
  const uint64_t start = BlockStart(info, p.size_class, p.offset);
  const uint64_t in_block = p.offset - start;
  const bool slot_start =
      c.slots_per_block == 1
          ? (p.offset & (uint64_t{info.block_size} - 1)) == 0
          : in_block % c.slot_size == 0 &&
                in_block + c.slot_size <= uint64_t{c.slots_per_block} * c.slot_size;
  if (!slot_start || info.region_length - start < c.block_bytes) {
    return Status::InvalidArgument(
        who() + "offset " + Hex(p.offset) + " is not on a slot boundary of class " +
        std::to_string(p.size_class) + " (slot size " + std::to_string(c.slot_size) + ")");
  }
  if ((p.id & ~c.id_mask) != 0) {
    return Status::InvalidArgument(who() + "object ID " + Hex(p.id) + " does not fit class " +
                                   std::to_string(p.size_class) + " (ID mask " + Hex(c.id_mask) +
                                   ")");
  }
  return Status::OK();
}

bool UsesHeaderRecheck(ReadValidation mode, std::string_view transport_name) {
  switch (mode) {
    case ReadValidation::kVersions:
      return false;
    case ReadValidation::kVersionsAndHeaderRecheck:
      return true;
    case ReadValidation::kAuto:
      break;
  }
  // Exactly the native TCP backend: "fabric:tcp;ofi_rxm" is libfabric's tcp provider, which
  // copies through the kernel without word atomicity.
  return transport_name != "tcp";
}

corm::SlotCheck CheckHeaderWord(uint64_t word, uint16_t tag, uint16_t tag_mask, uint32_t size_class,
                                uint32_t home) {
  const corm::Header h = corm::Header::Unpack(word);
  if (!h.allocated) return corm::SlotCheck::kFreed;
  if (h.locked || h.compacting) return corm::SlotCheck::kLocked;
  if (h.size_class != size_class) return corm::SlotCheck::kWrongClass;
  if ((h.tag & tag_mask) != (tag & tag_mask) || h.home_block != home) {
    return corm::SlotCheck::kMoved;
  }
  return corm::SlotCheck::kOk;
}

void SetReadHookForTesting(ReadHook hook, void* ctx) {
  ReadHookSlot& h = Hook();
  std::lock_guard lock(h.mu);
  h.hook = hook;
  h.ctx = ctx;
  h.set.store(hook != nullptr, std::memory_order_relaxed);
}

}  // namespace objects_internal

// ---- Impl ------------------------------------------------------------------------------------

struct ObjectClient::Impl {
  struct Server {
    PeerId peer = kInvalidPeer;
    std::string address;
    bool header_recheck = false;  // ReadValidation resolved for this server's connection
  };
  std::vector<Server> servers;  // parallel to ObjectClient::servers_
  std::atomic<uint32_t> round_robin{0};
  uint32_t max_rpc_bytes = 0;

  struct Counters {
    std::atomic<uint64_t> direct_reads{0}, direct_ok{0}, torn_retries{0}, locked_retries{0},
        moved{0}, scans{0}, corrections{0}, rpc_reads{0}, header_rechecks{0}, recheck_failures{0};
  } counters;

  // The blocking API's scheduler (one call at a time); made in the constructor.
  std::unique_ptr<BlockingRunner> blocking;
  // One session per server (docs/sessions.md); closed in ~ObjectClient.
  std::unique_ptr<SessionKeeper> sessions;

  static void Inc(std::atomic<uint64_t>& c) { c.fetch_add(1, std::memory_order_relaxed); }

  // Counts a rejected copy (torn, locked, or changed under a header recheck) and says how long to
  // wait before the next attempt; TimedOut once the retry budget is spent.
  Result<std::chrono::microseconds> CountAndBackOff(std::string_view op, const Ptr& p, bool changed,
                                                    corm::SlotCheck check, Backoff& backoff,
                                                    uint64_t& retries,
                                                    std::chrono::milliseconds budget);

  Node* node = nullptr;
};

Result<std::chrono::microseconds> ObjectClient::Impl::CountAndBackOff(
    std::string_view op, const Ptr& p, bool changed, corm::SlotCheck check, Backoff& backoff,
    uint64_t& retries, std::chrono::milliseconds budget) {
  Inc(changed                           ? counters.recheck_failures
      : check == corm::SlotCheck::kTorn ? counters.torn_retries
                                        : counters.locked_retries);
  ++retries;
  if (auto wait = backoff.Next()) return *wait;
  return Status::TimedOut(std::string(op) + " " + Describe(p) + ": slot stayed " +
                          RetryReason(changed, check) + " for the whole retry budget of " +
                          std::to_string(budget.count()) + " ms (" + std::to_string(retries) +
                          " retries)");
}

namespace {

// Runs `make(sched)` on the client's internal scheduler under its mutex.
template <typename Fn>
auto RunBlocking(ObjectClient::Impl& impl, Fn&& make) {
  return impl.blocking->run(std::forward<Fn>(make));
}

}  // namespace

ObjectClient::ObjectClient(Node& node, ObjectClientOptions options)
    : node_(node), options_(options), impl_(std::make_unique<Impl>()) {
  impl_->node = &node;
  impl_->blocking = std::make_unique<BlockingRunner>(node, "ObjectClient");
  impl_->sessions = std::make_unique<SessionKeeper>(
      node, SessionKeeperOptions{options.session_ttl, "", "ObjectClient", options.cluster_member});
  impl_->max_rpc_bytes = node.config().transport.max_rpc_bytes;
}

ObjectClient::~ObjectClient() {
  // SESSION_CLOSE on every server: they free the objects this client allocated with
  // Lifetime::kSession and did not free.
  impl_->sessions->close();
}

SessionClientStats ObjectClient::session_stats() const {
  return impl_->sessions->stats();
}

Result<std::unique_ptr<ObjectClient>> ObjectClient::Connect(Node& node,
                                                            std::span<const std::string> servers,
                                                            ObjectClientOptions options) {
  if (servers.empty()) return Status::InvalidArgument("ObjectClient: no servers given");
  if (servers.size() >= kAnyServer) {
    return Status::InvalidArgument("ObjectClient: at most " + std::to_string(kAnyServer - 1) +
                                   " servers");
  }
  if (options.session_ttl.count() < 0) {
    return Status::InvalidArgument("ObjectClient: session_ttl must be >= 0");
  }
  if (options.retry_budget.count() < 0 || options.max_backoff.count() < 0) {
    return Status::InvalidArgument("ObjectClient: retry_budget and max_backoff must be >= 0");
  }
  if (options.correction != Correction::kScan && options.correction != Correction::kAskOwner) {
    return Status::InvalidArgument("ObjectClient: unknown correction mode");
  }
  if (options.validation != ReadValidation::kAuto &&
      options.validation != ReadValidation::kVersions &&
      options.validation != ReadValidation::kVersionsAndHeaderRecheck) {
    return Status::InvalidArgument("ObjectClient: unknown read validation mode " +
                                   std::to_string(static_cast<int>(options.validation)));
  }
  std::unique_ptr<ObjectClient> client(new ObjectClient(node, options));
  Impl& impl = *client->impl_;
  std::vector<std::byte> reply(impl.max_rpc_bytes);
  for (const std::string& address : servers) {
    const std::string ctx = "connecting to farmemd objects at " + address;
    Result<PeerInfo> peer = node.connect(address);
    if (!peer.ok()) return peer.status().WithContext(ctx);
    Result<std::span<const std::byte>> r = impl.blocking->run([&](Scheduler& s) {
      return CallRpc(s, peer->id, wire::kOpInfo, {}, reply, ctx + ": OBJ_INFO");
    });
    if (!r.ok()) return r.status();
    Result<ObjectServerInfo> info = objects_internal::DecodeInfoReply(*r, address);
    if (!info.ok()) return info.status();
    info->name = peer->name;
    // The handshake's region list (if it names the object region) must agree with OBJ_INFO:
    // a mismatch means we would read some other region one-sidedly.
    for (const RegionInfo& region : peer->regions) {
      if (region.name != "objects") continue;
      if (region.key != info->region_key || region.length != info->region_length) {
        return Status::Protocol(ctx + ": region 'objects' from the handshake (key " +
                                Hex(region.key) + ", " + std::to_string(region.length) +
                                " bytes) disagrees with OBJ_INFO (key " + Hex(info->region_key) +
                                ", " + std::to_string(info->region_length) + " bytes)");
      }
    }
    if (!options.open_session) {
      // no session: only persistent allocations (alloc refuses kSession)
    } else if (Status st = impl.sessions->open(peer->id); !st.ok()) {
      return st.WithContext(ctx + ": SESSION_OPEN");
    }
    client->servers_.push_back(std::move(*info));
    // One transport per node today, but the choice is kept per connection: it is a property of
    // how this server's memory is copied, and a node with several backends would differ here.
    impl.servers.push_back(
        {peer->id, address,
         objects_internal::UsesHeaderRecheck(options.validation, node.transport().name())});
  }
  return client;
}

const ObjectServerInfo& ObjectClient::server_info(uint16_t server) const {
  static const ObjectServerInfo kNone;
  return server < servers_.size() ? servers_[server] : kNone;
}

ObjectClientStats ObjectClient::stats() const {
  const auto& c = impl_->counters;
  auto ld = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  ObjectClientStats s;
  s.direct_reads = ld(c.direct_reads);
  s.direct_ok = ld(c.direct_ok);
  s.torn_retries = ld(c.torn_retries);
  s.locked_retries = ld(c.locked_retries);
  s.moved = ld(c.moved);
  s.scans = ld(c.scans);
  s.corrections = ld(c.corrections);
  s.rpc_reads = ld(c.rpc_reads);
  s.header_rechecks = ld(c.header_rechecks);
  s.recheck_failures = ld(c.recheck_failures);
  return s;
}

// ---- Validation helpers (members: they need servers_ / impl_) ---------------------------------

namespace {

Status CheckServerIndex(size_t count, uint16_t server, std::string_view op) {
  if (server >= count) {
    return Status::InvalidArgument(std::string(op) + ": server index " + std::to_string(server) +
                                   " unknown (client has " + std::to_string(count) + ")");
  }
  return Status::OK();
}

// A pointer the server sent back: it must have a valid shape, or we refuse it (Protocol).
Result<Ptr> FromWire(const ObjectServerInfo& info, const wire::WirePtr& w, uint16_t server,
                     std::string_view op) {
  if (w.size_class >= info.classes.size() || w.reserved != 0) {
    return Status::Protocol(std::string(op) + ": server replied with a malformed pointer (class " +
                            std::to_string(w.size_class) + ", reserved " +
                            std::to_string(w.reserved) + ")");
  }
  Ptr p;
  p.offset = w.offset;
  p.id = w.id;
  p.gen = w.gen;
  p.size_class = static_cast<uint8_t>(w.size_class);
  p.server = server;
  p.flags = Ptr::kPtrValid;
  Status st = objects_internal::CheckPtrShape(info, p, op);
  if (!st.ok()) {
    return Status::Protocol(std::string(op) + ": server replied with a malformed pointer (" +
                            std::string(st.message()) + ")");
  }
  return p;
}

// Applies a server's corrected pointer for the same object to p.
Status ApplyReplyPtr(const ObjectServerInfo& info, const wire::WirePtr& w, Ptr& p,
                     std::string_view op, std::atomic<uint64_t>& corrections) {
  Result<Ptr> q = FromWire(info, w, p.server, op);
  if (!q.ok()) return q.status();
  // The ID may differ: a merge re-drew it (docs/objects.md, "Merges that re-draw IDs"); the
  // server found the object through the rename that the pointer's home and generation name.
  if (q->gen != p.gen || q->size_class != p.size_class) {
    return Status::Protocol(std::string(op) + ": server replied for another object (id " +
                            Hex(q->id) + " generation " + std::to_string(q->gen) + " class " +
                            std::to_string(q->size_class) + ") than " + Describe(p));
  }
  if (q->offset != p.offset || q->id != p.id) {
    corrections.fetch_add(1, std::memory_order_relaxed);
  }
  q->flags |= p.flags & Ptr::kPtrPersistent;  // the same object: its lifetime is unchanged
  p = *q;
  return Status::OK();
}

// An RPC whose request is the pointer and whose reply is a pointer (LOCATE, RELEASE, WRITE's
// reply too).
Task<Result<wire::WirePtr>> PtrRpc(Scheduler& sched, PeerId peer, uint16_t opcode, const Ptr& p,
                                   const char* op) {
  Result<wire::PtrReply> r = co_await CallStruct<wire::PtrReply>(
      sched, peer, opcode, wire::PtrRequest{wire::ToWire(p)}, std::string(op) + " " + Describe(p));
  if (!r.ok()) co_return r.status();
  co_return r->ptr;
}

}  // namespace

// ---- RPC operations ----------------------------------------------------------------------------

Task<Result<Ptr>> ObjectClient::alloc(Scheduler& sched, size_t size, uint16_t server,
                                      Lifetime lifetime) {
  if (server == kAnyServer) {
    server = static_cast<uint16_t>(impl_->round_robin.fetch_add(1, std::memory_order_relaxed) %
                                   servers_.size());
  }
  FARMEM_CO_RETURN_IF_ERROR(CheckServerIndex(servers_.size(), server, "alloc"));
  const ObjectServerInfo& info = servers_[server];
  if (size == 0 || size > info.max_object_size()) {
    co_return Status::InvalidArgument("alloc: size " + std::to_string(size) + " out of range 1.." +
                                      std::to_string(info.max_object_size()) + " of server " +
                                      std::to_string(server));
  }
  const PeerId peer = impl_->servers[server].peer;
  const bool persistent = lifetime == Lifetime::kPersistent;
  uint64_t session = persistent ? 0 : impl_->sessions->session_id(peer);
  if (!persistent && session == 0) {
    co_return Status::FailedPrecondition("alloc: no session with server " + std::to_string(server));
  }
  Result<wire::PtrReply> msg = co_await CallStruct<wire::PtrReply>(
      sched, peer, wire::kOpAlloc, wire::AllocRequest{size, session},
      "alloc " + std::to_string(size) + " bytes");
  if (!persistent && msg.status().code() == Code::kNotFound) {
    // The lease ran out before the keeper noticed (this process stalled longer than its TTL):
    // the server freed the old session's objects; allocate in a new one.
    Result<uint64_t> fresh = co_await impl_->sessions->renew(sched, peer, session);
    if (!fresh.ok()) co_return fresh.status().WithContext("alloc");
    msg = co_await CallStruct<wire::PtrReply>(sched, peer, wire::kOpAlloc,
                                              wire::AllocRequest{size, *fresh},
                                              "alloc " + std::to_string(size) + " bytes");
  }
  if (!msg.ok()) co_return msg.status();
  Result<Ptr> p = FromWire(info, msg->ptr, server, "alloc");
  if (!p.ok()) co_return p.status();
  if (persistent) p->flags |= Ptr::kPtrPersistent;
  if (info.classes[p->size_class].payload_capacity < size) {
    co_return Status::Protocol("alloc: server gave class " + std::to_string(p->size_class) +
                               " (capacity " +
                               std::to_string(info.classes[p->size_class].payload_capacity) +
                               ") for " + std::to_string(size) + " bytes");
  }
  co_return *p;
}

Task<Status> ObjectClient::free(Scheduler& sched, Ptr& p) {
  FARMEM_CO_RETURN_IF_ERROR(CheckServerIndex(servers_.size(), p.server, "free"));
  FARMEM_CO_RETURN_IF_ERROR(objects_internal::CheckPtrShape(servers_[p.server], p, "free"));
  const auto request = EncodeStruct(wire::PtrRequest{wire::ToWire(p)});
  std::byte reply[sizeof(wire::PtrReply)];  // room to see (and reject) a non-empty reply
  Result<std::span<const std::byte>> r = co_await CallRpc(
      sched, impl_->servers[p.server].peer, wire::kOpFree, request, reply, "free " + Describe(p));
  if (!r.ok()) co_return r.status();
  if (!r->empty()) {
    co_return Status::Protocol("free " + Describe(p) + ": reply has " + std::to_string(r->size()) +
                               " bytes, expected 0");
  }
  p.flags = static_cast<uint8_t>(p.flags & ~Ptr::kPtrValid);
  co_return Status::OK();
}

Task<Result<size_t>> ObjectClient::read(Scheduler& sched, Ptr& p, std::span<std::byte> out) {
  FARMEM_CO_RETURN_IF_ERROR(CheckServerIndex(servers_.size(), p.server, "read"));
  const ObjectServerInfo& info = servers_[p.server];
  FARMEM_CO_RETURN_IF_ERROR(objects_internal::CheckPtrShape(info, p, "read"));
  Impl::Inc(impl_->counters.rpc_reads);
  const size_t cap = info.classes[p.size_class].payload_capacity;
  const auto max_bytes = static_cast<uint32_t>(std::min(out.size(), cap));
  const auto request = EncodeStruct(wire::ReadRequest{wire::ToWire(p), max_bytes, 0});
  std::vector<std::byte> reply(sizeof(wire::PtrReply) + max_bytes);
  Result<HeadAndTail<wire::PtrReply>> r = co_await CallWithTail<wire::PtrReply>(
      sched, impl_->servers[p.server].peer, wire::kOpRead, request, reply, "read " + Describe(p));
  if (!r.ok()) co_return r.status();
  FARMEM_CO_RETURN_IF_ERROR(
      ApplyReplyPtr(info, r->head.ptr, p, "read", impl_->counters.corrections));
  std::memcpy(out.data(), r->tail.data(), r->tail.size());
  co_return r->tail.size();
}

Task<Status> ObjectClient::write(Scheduler& sched, Ptr& p, std::span<const std::byte> data) {
  FARMEM_CO_RETURN_IF_ERROR(CheckServerIndex(servers_.size(), p.server, "write"));
  const ObjectServerInfo& info = servers_[p.server];
  FARMEM_CO_RETURN_IF_ERROR(objects_internal::CheckPtrShape(info, p, "write"));
  const size_t cap = info.classes[p.size_class].payload_capacity;
  if (data.size() > cap) {
    co_return Status::InvalidArgument("write: " + std::to_string(data.size()) +
                                      " bytes do not fit " + Describe(p) + " (capacity " +
                                      std::to_string(cap) + ")");
  }
  if (sizeof(wire::PtrRequest) + data.size() > impl_->max_rpc_bytes) {
    co_return Status::InvalidArgument("write: " + std::to_string(data.size()) +
                                      " bytes exceed the transport's RPC limit of " +
                                      std::to_string(impl_->max_rpc_bytes) + " bytes");
  }
  // One buffer sized up front (vector::insert after Encode trips a GCC 12 -Warray-bounds).
  std::vector<std::byte> request(sizeof(wire::PtrRequest) + data.size());
  const wire::PtrRequest head{wire::ToWire(p)};
  std::memcpy(request.data(), &head, sizeof(head));
  if (!data.empty()) std::memcpy(request.data() + sizeof(head), data.data(), data.size());
  Result<wire::PtrReply> msg = co_await CallStruct<wire::PtrReply>(
      sched, impl_->servers[p.server].peer, wire::kOpWrite, std::span<const std::byte>(request),
      "write " + Describe(p));
  if (!msg.ok()) co_return msg.status();
  co_return ApplyReplyPtr(info, msg->ptr, p, "write", impl_->counters.corrections);
}

// LOCATE and RELEASE differ in whether the offset may leave the block.
Task<Status> ObjectClient::locate(Scheduler& sched, Ptr& p) {
  FARMEM_CO_RETURN_IF_ERROR(CheckServerIndex(servers_.size(), p.server, "locate"));
  const ObjectServerInfo& info = servers_[p.server];
  FARMEM_CO_RETURN_IF_ERROR(objects_internal::CheckPtrShape(info, p, "locate"));
  Result<wire::WirePtr> w =
      co_await PtrRpc(sched, impl_->servers[p.server].peer, wire::kOpLocate, p, "locate");
  if (!w.ok()) co_return w.status();
  // Objects move only inside their home block as far as the pointer is concerned.
  if (w->size_class != p.size_class ||
      objects_internal::BlockStart(info, p.size_class, w->offset) !=
          objects_internal::BlockStart(info, p.size_class, p.offset)) {
    co_return Status::Protocol("locate: server moved " + Describe(p) + " to another block (" +
                               Hex(w->offset) + ")");
  }
  co_return ApplyReplyPtr(info, *w, p, "locate", impl_->counters.corrections);
}

Task<Status> ObjectClient::release_ptr(Scheduler& sched, Ptr& p) {
  FARMEM_CO_RETURN_IF_ERROR(CheckServerIndex(servers_.size(), p.server, "release_ptr"));
  const ObjectServerInfo& info = servers_[p.server];
  FARMEM_CO_RETURN_IF_ERROR(objects_internal::CheckPtrShape(info, p, "release_ptr"));
  Result<wire::WirePtr> w =
      co_await PtrRpc(sched, impl_->servers[p.server].peer, wire::kOpRelease, p, "release_ptr");
  if (!w.ok()) co_return w.status();
  Result<Ptr> q = FromWire(info, *w, p.server, "release_ptr");
  if (!q.ok()) co_return q.status();
  if (q->size_class != p.size_class) {  // (the ID may have been re-drawn by a merge)
    co_return Status::Protocol("release_ptr: server re-homed another object (id " + Hex(q->id) +
                               " class " + std::to_string(q->size_class) + ") than " + Describe(p));
  }
  // A re-homed pointer is a new name for the object, not a correction: not counted.
  q->flags |= p.flags & Ptr::kPtrPersistent;
  p = *q;
  co_return Status::OK();
}

Task<Result<CompactResult>> ObjectClient::compact(Scheduler& sched, uint16_t server,
                                                  std::optional<uint16_t> size_class) {
  FARMEM_CO_RETURN_IF_ERROR(CheckServerIndex(servers_.size(), server, "compact"));
  if (size_class && *size_class >= servers_[server].classes.size()) {
    co_return Status::InvalidArgument("compact: size class " + std::to_string(*size_class) +
                                      " does not exist (server has " +
                                      std::to_string(servers_[server].classes.size()) + ")");
  }
  const auto request =
      EncodeStruct(wire::CompactRequest{size_class.value_or(wire::kAllClasses), {0, 0, 0}});
  std::vector<std::byte> reply(impl_->max_rpc_bytes);
  Result<RpcReply> r = co_await sched.rpc(impl_->servers[server].peer, RpcImm(wire::kOpCompact),
                                          request, std::span(reply));
  if (!r.ok()) co_return r.status().WithContext("compact on server " + std::to_string(server));
  if (r->length > reply.size()) co_return Status::Protocol("compact reply longer than its buffer");
  const char* text = reinterpret_cast<const char*>(reply.data());
  nlohmann::json j = nlohmann::json::parse(text, text + r->length, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("merges") ||
      !j["merges"].is_number_unsigned()) {
    co_return Status::Protocol("compact reply is not JSON with an unsigned \"merges\"");
  }
  CompactResult out;
  out.merges = j["merges"].get<uint32_t>();
  out.partial = j.contains("partial") && j["partial"].is_boolean() && j["partial"].get<bool>();
  if (j.contains("compaction")) out.stats_json = j["compaction"].dump();
  co_return out;
}

Task<Result<std::string>> ObjectClient::stats_json(Scheduler& sched, uint16_t server) {
  FARMEM_CO_RETURN_IF_ERROR(CheckServerIndex(servers_.size(), server, "stat"));
  std::vector<std::byte> reply(impl_->max_rpc_bytes);
  Result<RpcReply> r =
      co_await sched.rpc(impl_->servers[server].peer, RpcImm(kOpStat), {}, std::span(reply));
  if (!r.ok()) co_return r.status().WithContext("STAT of server " + std::to_string(server));
  if (r->length > reply.size()) co_return Status::Protocol("STAT reply longer than its buffer");
  const char* text = reinterpret_cast<const char*>(reply.data());
  nlohmann::json j = nlohmann::json::parse(text, text + r->length, nullptr, false);
  if (j.is_discarded() || !j.is_object()) co_return Status::Protocol("STAT reply is not JSON");
  co_return std::string(text, r->length);
}

// ---- One-sided reads -------------------------------------------------------------------------
//
// Slot addresses: WirePtr.offset is relative to the object region, whose base is block-aligned
// (at least 4 KiB), so offset ≡ address (mod 64) and the offset can stand in for the absolute
// address in every layout function (they only use it modulo 64). The header's home block index
// is the offset of the slot's block (BlockStart) / block_size for the same reason.
//
// Validation (ReadValidation). CheckSlot's version bytes prove a copy consistent only if the copy
// loaded the header first and the tail last, word by word (docs/objects.md, "Writer and reader
// protocols"). Other transports may load the header word last: a copy can then hold the header
// and version bytes of a write W that completed during the copy next to payload loaded while W
// was storing it, and pass CheckSlot. So in recheck mode a copy is bracketed by two header reads,
// each issued after the previous operation completed (a seqlock):
//   before = header; copy = slot; after = header; accept iff before == copy's header == after.
// Why this is sound for any copy order: a writer CASes the lock bit into the header before it
// stores anything and publishes a new version (lock clear) after its last store. A write whose
// stores overlap the copy took the lock after `before` was read (else `before` shows it locked,
// or the write had finished before the copy began), so `after` shows it locked or with a newer
// version. Compaction sets the compaction bit (seen as locked) and an object moved to another
// offset leaves another header behind. Residual risk as with the version bytes: exactly 256*k
// writes between the two header reads (8-bit version). Re-reading only the header after the
// copy (comparing with the copy's own header) would NOT be enough: the copy's header word may
// itself have been loaded after the payload, from W's final store.

Task<Result<size_t>> ObjectClient::direct_read(Scheduler& sched, Ptr& p, std::span<std::byte> out) {
  FARMEM_CO_RETURN_IF_ERROR(CheckServerIndex(servers_.size(), p.server, "direct_read"));
  const ObjectServerInfo& info = servers_[p.server];
  FARMEM_CO_RETURN_IF_ERROR(objects_internal::CheckPtrShape(info, p, "direct_read"));
  auto& c = impl_->counters;
  Impl::Inc(c.direct_reads);
  const uint32_t slot = info.classes[p.size_class].slot_size;
  const uint16_t mask = IdMaskOf(info, p.size_class);
  const uint16_t tag = TagOf(p, mask);
  const uint32_t home = objects_internal::HomeBlockOf(info, p.size_class, p.offset);
  const bool recheck = impl_->servers[p.server].header_recheck;
  const RemoteRef ref{impl_->servers[p.server].peer, info.region_key, p.offset};
  // Small slots are copied into the coroutine frame: a heap buffer per read cost ~2 % of a
  // 32 B direct_read. Larger slots use the heap.
  std::array<uint8_t, kInlineSlotCopyBytes> inline_copy;
  std::vector<uint8_t> heap_copy(slot > inline_copy.size() ? slot : 0);
  const std::span<uint8_t> copy = slot > inline_copy.size() ? std::span<uint8_t>(heap_copy)
                                                            : std::span(inline_copy.data(), slot);
  Backoff backoff(options_.retry_budget, options_.max_backoff);
  uint64_t retries = 0;
  for (;;) {
    corm::SlotCheck check = corm::SlotCheck::kOk;
    bool changed = false;  // recheck mode: a header read differed from the copy's header
    uint64_t before = 0;
    uint64_t before_or_copy = 0;  // the last header seen (for error messages)
    if (recheck) {
      // A header that already shows the slot locked, freed or holding another object settles
      // the attempt without copying the slot.
      Status st = co_await sched.read(ref, &before, sizeof(before));
      if (!st.ok()) co_return st.WithContext("direct_read " + Describe(p) + " (header)");
      check =
          objects_internal::CheckHeaderWord(before, tag, corm::hdr::kTagMask, p.size_class, home);
      before_or_copy = before;
      if (check == corm::SlotCheck::kOk) {
        RunReadHook(objects_internal::ReadStage::kBeforeCopy, p.offset, {});
      }
    }
    if (check == corm::SlotCheck::kOk) {
      Status st = co_await sched.read(ref, copy.data(), slot);
      if (!st.ok()) co_return st.WithContext("direct_read " + Describe(p));
      RunReadHook(objects_internal::ReadStage::kAfterCopy, p.offset, copy);
      before_or_copy = HeaderOf(copy);
      check = CheckCopy(copy, p.offset, tag, p.size_class, home);
      if (check == corm::SlotCheck::kOk && recheck) {
        Impl::Inc(c.header_rechecks);
        uint64_t after = 0;
        st = co_await sched.read(ref, &after, sizeof(after));
        if (!st.ok()) co_return st.WithContext("direct_read " + Describe(p) + " (header recheck)");
        changed = before != HeaderOf(copy) || after != HeaderOf(copy);
      }
    }
    if (check == corm::SlotCheck::kOk && !changed) {
      Impl::Inc(c.direct_ok);
      co_return corm::DecodePayload(copy, p.offset,
                                    std::span(reinterpret_cast<uint8_t*>(out.data()), out.size()));
    }
    switch (check) {
      case corm::SlotCheck::kOk:  // changed
      case corm::SlotCheck::kTorn:
      case corm::SlotCheck::kLocked: {
        auto wait = impl_->CountAndBackOff("direct_read", p, changed, check, backoff, retries,
                                           options_.retry_budget);
        if (!wait.ok()) co_return wait.status();
        co_await sched.sleep_for(*wait);
        continue;
      }
      case corm::SlotCheck::kWrongClass:
        co_return WrongClass("direct_read", p, before_or_copy);
      case corm::SlotCheck::kMoved:
      case corm::SlotCheck::kFreed:
        if (mask == 0) {
          // Offset-only classes never move: an empty or foreign slot means the object is gone.
          co_return Status::NotFound("direct_read " + Describe(p) +
                                     ": the object was freed (offset-only class)");
        }
        Impl::Inc(c.moved);
        co_return Status::Moved(
            "direct_read " + Describe(p) + ": the slot " +
            (check == corm::SlotCheck::kFreed ? "is free" : "holds another object") +
            " (moved by compaction, or freed): correct the pointer");
    }
  }
}

Task<Result<size_t>> ObjectClient::scan_read(Scheduler& sched, Ptr& p, std::span<std::byte> out) {
  FARMEM_CO_RETURN_IF_ERROR(CheckServerIndex(servers_.size(), p.server, "scan_read"));
  const ObjectServerInfo& info = servers_[p.server];
  FARMEM_CO_RETURN_IF_ERROR(objects_internal::CheckPtrShape(info, p, "scan_read"));
  auto& c = impl_->counters;
  const uint32_t slot = info.classes[p.size_class].slot_size;
  const uint16_t mask = IdMaskOf(info, p.size_class);
  uint16_t tag = TagOf(p, mask);  // changes if the server reports a re-drawn ID
  bool asked = false;             // a scan miss was corrected by the server already
  Backoff locate_backoff(options_.retry_budget, options_.max_backoff);
  const uint64_t block_off = objects_internal::BlockStart(info, p.size_class, p.offset);
  const auto home = static_cast<uint32_t>(block_off / info.block_size);
  const bool recheck = impl_->servers[p.server].header_recheck;
  const RemoteRef ref{impl_->servers[p.server].peer, info.region_key, block_off};
  std::vector<uint8_t> image(info.classes[p.size_class].block_bytes);
  std::vector<uint8_t> slot_copy(recheck ? slot : 0);
  Backoff backoff(options_.retry_budget, options_.max_backoff);
  uint64_t retries = 0;
  for (;;) {
    Impl::Inc(c.scans);
    Status st = co_await sched.read(ref, image.data(), image.size());
    if (!st.ok()) co_return st.WithContext("scan_read " + Describe(p));
    // Offset-only classes have no IDs to search by, and their objects never move.
    const int64_t found =
        mask == 0 ? static_cast<int64_t>(p.offset - block_off)
                  : corm::ScanBlockImage(image, slot, tag, corm::hdr::kTagMask, p.size_class, home);
    if (found < 0) {
      // Freed, or a merge re-drew the object's ID (docs/objects.md, "Merges that re-draw IDs"),
      // or a block copy that overlapped the remap of a multi-page block missed it. Only the
      // server can tell: LOCATE answers NotFound if the object is gone, else its current ID and
      // slot, which the next scan finds. A miss right after a LOCATE (the object moved again
      // meanwhile) backs off like a torn copy, within the retry budget.
      if (asked) {
        const auto wait = locate_backoff.Next();
        if (!wait) {
          co_return Status::TimedOut("scan_read " + Describe(p) +
                                     ": the object kept moving for the whole retry budget");
        }
        co_await sched.sleep_for(*wait);
      }
      asked = true;
      FARMEM_CO_RETURN_IF_ERROR(co_await locate(sched, p));
      tag = TagOf(p, mask);
      continue;
    }
    const uint64_t addr = block_off + static_cast<uint64_t>(found);
    std::span<uint8_t> copy(image.data() + found, slot);
    corm::SlotCheck check = corm::SlotCheck::kOk;
    bool changed = false;
    if (!recheck) {
      RunReadHook(objects_internal::ReadStage::kAfterCopy, addr, copy);
      check = CheckCopy(copy, addr, tag, p.size_class, home);
    } else {
      // The block copy located the slot; its header word there was read before anything issued
      // after the block read, so it is the seqlock's first header read. Copy the slot alone,
      // then read its header again.
      check = CheckCopy(copy, addr, tag, p.size_class, home);
      if (check == corm::SlotCheck::kOk) {
        const uint64_t before = HeaderOf(copy);
        RunReadHook(objects_internal::ReadStage::kBeforeCopy, addr, {});
        const RemoteRef at{ref.peer, ref.key, addr};
        st = co_await sched.read(at, slot_copy.data(), slot);
        if (!st.ok()) co_return st.WithContext("scan_read " + Describe(p) + " (slot)");
        copy = std::span(slot_copy);
        RunReadHook(objects_internal::ReadStage::kAfterCopy, addr, copy);
        check = CheckCopy(copy, addr, tag, p.size_class, home);
        if (check == corm::SlotCheck::kMoved || check == corm::SlotCheck::kFreed) {
          // The block copy showed the object here a moment ago: it moved (or was freed) in
          // between. Scan again rather than report a move as a free.
          check = corm::SlotCheck::kOk;
          changed = true;
        } else if (check == corm::SlotCheck::kOk) {
          Impl::Inc(c.header_rechecks);
          uint64_t after = 0;
          st = co_await sched.read(at, &after, sizeof(after));
          if (!st.ok()) co_return st.WithContext("scan_read " + Describe(p) + " (header recheck)");
          changed = before != HeaderOf(copy) || after != HeaderOf(copy);
        }
      }
    }
    const corm::Header h = corm::Header::Unpack(HeaderOf(copy));
    if (check == corm::SlotCheck::kOk && !changed) {
      if (addr != p.offset) {
        p.offset = addr;
        Impl::Inc(c.corrections);
      }
      co_return corm::DecodePayload(copy, addr,
                                    std::span(reinterpret_cast<uint8_t*>(out.data()), out.size()));
    }
    switch (check) {
      case corm::SlotCheck::kOk:  // changed
      case corm::SlotCheck::kTorn:
      case corm::SlotCheck::kLocked: {
        auto wait = impl_->CountAndBackOff("scan_read", p, changed, check, backoff, retries,
                                           options_.retry_budget);
        if (!wait.ok()) co_return wait.status();
        co_await sched.sleep_for(*wait);
        continue;
      }
      case corm::SlotCheck::kWrongClass:
        co_return WrongClass("scan_read", p, HeaderOf(copy));
      case corm::SlotCheck::kMoved:
      case corm::SlotCheck::kFreed:
        co_return Status::NotFound(
            "scan_read " + Describe(p) + ": the object was freed (its slot is " +
            std::string(corm::SlotCheckName(check)) +
            (h.allocated && h.home_block != home ? ", homed elsewhere" : "") + ")");
    }
  }
}

Task<Result<size_t>> ObjectClient::read_any(Scheduler& sched, Ptr& p, std::span<std::byte> out) {
  Result<size_t> r = co_await direct_read(sched, p, out);
  if (r.ok() || r.status().code() != Code::kMoved) co_return r;
  if (options_.correction == Correction::kScan) {
    // scan_read confirms a miss with the server (LOCATE) itself: its NotFound is the server's.
    co_return co_await scan_read(sched, p, out);
  }
  // Ask the owner, then read at the corrected address. The object may move again between the
  // two (another compaction round): repeat within the retry budget.
  Backoff backoff(options_.retry_budget, options_.max_backoff);
  for (;;) {
    FARMEM_CO_RETURN_IF_ERROR(co_await locate(sched, p));
    r = co_await direct_read(sched, p, out);
    if (r.ok() || r.status().code() != Code::kMoved) co_return r;
    const auto wait = backoff.Next();
    if (!wait) {
      co_return Status::TimedOut("read_any " + Describe(p) +
                                 ": the object kept moving for the whole retry budget");
    }
    co_await sched.sleep_for(*wait);
  }
}

// ---- Blocking versions -----------------------------------------------------------------------

Result<Ptr> ObjectClient::alloc(size_t size, uint16_t server, Lifetime lifetime) {
  return RunBlocking(*impl_, [&](Scheduler& s) { return alloc(s, size, server, lifetime); });
}
Status ObjectClient::free(Ptr& p) {
  return RunBlocking(*impl_, [&](Scheduler& s) { return free(s, p); });
}
Result<size_t> ObjectClient::read(Ptr& p, std::span<std::byte> out) {
  return RunBlocking(*impl_, [&](Scheduler& s) { return read(s, p, out); });
}
Status ObjectClient::write(Ptr& p, std::span<const std::byte> data) {
  return RunBlocking(*impl_, [&](Scheduler& s) { return write(s, p, data); });
}
Result<size_t> ObjectClient::direct_read(Ptr& p, std::span<std::byte> out) {
  return RunBlocking(*impl_, [&](Scheduler& s) { return direct_read(s, p, out); });
}
Result<size_t> ObjectClient::scan_read(Ptr& p, std::span<std::byte> out) {
  return RunBlocking(*impl_, [&](Scheduler& s) { return scan_read(s, p, out); });
}
Result<size_t> ObjectClient::read_any(Ptr& p, std::span<std::byte> out) {
  return RunBlocking(*impl_, [&](Scheduler& s) { return read_any(s, p, out); });
}
Status ObjectClient::release_ptr(Ptr& p) {
  return RunBlocking(*impl_, [&](Scheduler& s) { return release_ptr(s, p); });
}
Status ObjectClient::locate(Ptr& p) {
  return RunBlocking(*impl_, [&](Scheduler& s) { return locate(s, p); });
}
Result<CompactResult> ObjectClient::compact(uint16_t server, std::optional<uint16_t> size_class) {
  return RunBlocking(*impl_, [&](Scheduler& s) { return compact(s, server, size_class); });
}
Result<std::string> ObjectClient::stats_json(uint16_t server) {
  return RunBlocking(*impl_, [&](Scheduler& s) { return stats_json(s, server); });
}

}  // namespace farmem
