// ObjectService: decodes and validates the object RPCs (object_wire.h), calls the CoRM Store, and
// renders the STAT "objects" section. Nothing here trusts a client: sizes, reserved bytes, size
// classes and offsets are checked before the Store (which checks the rest) sees a pointer.
#include "objects/service/object_service.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "common/log.h"
#include "objects/format/object_layout.h"
#include "objects/format/object_wire.h"
#include "objects/format/size_classes.h"

namespace farmem {

namespace wire = object_wire;

namespace {

// How long one OBJ_COMPACT may merge before it answers (a paced round can take longer).
constexpr std::chrono::milliseconds kCompactRpcBudget{1000};

static_assert(wire::kOpCompact < wire::kLastObjectsOpcode);

template <typename T>
std::optional<T> DecodeExact(std::span<const std::byte> bytes) {
  static_assert(std::is_trivially_copyable_v<T>);
  if (bytes.size() != sizeof(T)) return std::nullopt;
  T msg;
  std::memcpy(&msg, bytes.data(), sizeof(T));
  return msg;
}

template <typename T>
void Append(std::vector<std::byte>& out, const T& msg) {
  static_assert(std::is_trivially_copyable_v<T>);
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &msg, sizeof(T));
}

Status WrongSize(const char* op, size_t want, size_t got, const char* what = "") {
  return Status::Protocol(std::string(op) + " request must be " + std::to_string(want) + " bytes" +
                          what + ", got " + std::to_string(got));
}

// FNV-1a: a hash that is the same in every process and run, so a connection always maps to the
// same worker (std::hash makes no such promise).
uint64_t StableHash(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t ProcessRssBytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long long size = 0, resident = 0;
  const int n = std::fscanf(f, "%llu %llu", &size, &resident);
  std::fclose(f);
  if (n != 2) return 0;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

nlohmann::json CompactionJson(const corm::CompactionStats& s) {
  return {{"rounds", s.rounds},
          {"compactions", s.compactions},
          {"blocks_freed", s.blocks_freed},
          {"physical_bytes_freed", s.physical_bytes_freed},
          {"bytes_moved", s.bytes_moved},
          {"objects_copied", s.objects_copied},
          {"objects_relocated", s.objects_relocated},
          {"collisions", s.collisions},
          {"ids_redrawn", s.ids_redrawn},
          {"skipped_busy", s.skipped_busy},
          {"grace_wait_ns", s.grace_wait_ns},
          {"grace_wait_max_ns", s.grace_wait_max_ns},
          {"structs_moved", s.structs_moved},
          {"struct_pages_released", s.struct_pages_released},
          {"struct_grace_timeouts", s.struct_grace_timeouts}};
}

const char* SelectionName(WorkerSelection s) {
  return s == WorkerSelection::kRandom ? "random" : "connection";
}

const char* CorrectionName(Correction c) {
  return c == Correction::kScan ? "scan" : "owner";
}

uint64_t EffectiveReserve(const ServerConfig& c) {
  const uint64_t bs = c.objects.block_size;
  return c.objects.reserve_bytes != 0 ? c.objects.reserve_bytes : 2 * c.memory_bytes / bs * bs;
}

corm::GeometryOptions Geometry(const ObjectsConfig& o) {
  return corm::GeometryOptions{
      o.block_size,
      o.max_block_size != 0 ? o.max_block_size : std::max<uint32_t>(64 << 10, o.block_size),
      o.min_slots_per_block};
}

}  // namespace

Status ValidateObjectsConfig(const ServerConfig& config) {
  const ObjectsConfig& o = config.objects;
  if (!o.enabled) return Status::OK();
  const uint64_t bs = o.block_size;
  if (bs < corm::kMinBlockSize || bs > corm::kMaxBlockSize || (bs & (bs - 1)) != 0) {
    return Status::InvalidArgument(
        "objects.block_size (--objects-block-size) must be a power of two in 4096..1048576, "
        "got " +
        std::to_string(bs));
  }
  if (Status g = corm::ValidateGeometry(Geometry(o)); !g.ok()) {
    return Status::InvalidArgument(
        "objects block geometry (--objects-block-size, --objects-max-block-size, "
        "--objects-min-slots-per-block): " +
        std::string(g.message()));
  }
  if (o.id_bits != 0 && o.id_bits != 8 && o.id_bits != 12 && o.id_bits != 16) {
    return Status::InvalidArgument(
        "objects.id_bits (--objects-id-bits) must be 0, 8, 12 or 16, got " +
        std::to_string(o.id_bits));
  }
  if (o.workers > 1024) {
    return Status::InvalidArgument("objects.workers (--objects-workers) must be 0..1024, got " +
                                   std::to_string(o.workers));
  }
  if (o.worker_selection != WorkerSelection::kByConnection &&
      o.worker_selection != WorkerSelection::kRandom) {
    return Status::InvalidArgument("objects.worker_selection must be connection or random");
  }
  if (o.correction != Correction::kAskOwner && o.correction != Correction::kScan) {
    return Status::InvalidArgument("objects.correction must be owner or scan");
  }
  const uint64_t reserve = EffectiveReserve(config);
  if (reserve < bs || reserve % bs != 0) {
    return Status::InvalidArgument(
        "objects.reserve_bytes (--objects-reserve-mib) must be a "
        "non-zero multiple of the block size " +
        std::to_string(bs) + ", got " + std::to_string(reserve));
  }
  if (reserve / bs > corm::kMaxHomeBlocks) {
    // Slot headers name their home block in 30 bits (object_layout.h).
    return Status::InvalidArgument("objects.reserve_bytes holds more than 2^" +
                                   std::to_string(corm::hdr::kHomeBits) +
                                   " blocks: use a larger objects block size");
  }
  const uint64_t physical = o.max_physical_bytes != 0 ? o.max_physical_bytes : config.memory_bytes;
  if (physical < bs) {
    return Status::InvalidArgument(
        "objects.max_physical_bytes (--objects-max-physical-mib) must hold at least one block (" +
        std::to_string(bs) + " bytes), got " + std::to_string(physical));
  }
  if (!(o.compaction.threshold >= 0.0 && o.compaction.threshold <= 1.0)) {
    return Status::InvalidArgument(
        "objects.compaction.threshold (--objects-compaction-threshold) must be in 0..1, got " +
        std::to_string(o.compaction.threshold));
  }
  if (o.compaction.interval_ms > 3600 * 1000) {
    return Status::InvalidArgument(
        "objects.compaction.interval_ms (--objects-compaction-interval-ms) must be at most one "
        "hour");
  }
  if (o.compaction.max_merges_per_round == 0) {
    return Status::InvalidArgument(
        "objects.compaction.max_merges_per_round (--objects-compaction-max-merges-per-round) must "
        "be at least 1");
  }
  return Status::OK();
}

Result<std::unique_ptr<ObjectService>> ObjectService::Create(const ServerConfig& config, Node& node,
                                                             SessionRegistry& sessions) {
  if (!config.objects.enabled) return Status::InvalidArgument("the object store is disabled");
  FARMEM_RETURN_IF_ERROR(ValidateObjectsConfig(config));
  std::unique_ptr<ObjectService> s(new ObjectService());
  s->config_ = config.objects;
  ObjectsConfig& c = s->config_;
  if (c.workers == 0) c.workers = static_cast<uint32_t>(std::max(1, config.node.rpc_workers));
  c.reserve_bytes = EffectiveReserve(config);
  if (c.max_physical_bytes == 0) c.max_physical_bytes = config.memory_bytes;
  s->max_rpc_bytes_ = config.node.transport.max_rpc_bytes;

  const corm::GeometryOptions geometry = Geometry(c);
  c.max_block_size = static_cast<uint32_t>(geometry.max_block_size);
  corm::StoreOptions so;
  so.block_size = c.block_size;
  so.max_block_size = geometry.max_block_size;
  so.min_slots_per_block = geometry.min_slots_per_block;
  so.id_bits = c.id_bits;
  so.hybrid = c.hybrid;
  so.workers = c.workers;
  so.correction = c.correction == Correction::kScan ? corm::CorrectionMode::kScan
                                                    : corm::CorrectionMode::kAskOwner;
  so.reserve_bytes = c.reserve_bytes;
  // memfd files as large as the raw pools, rounded up to whole blocks.
  so.pool_bytes = (std::max<uint64_t>(config.pool_bytes, c.block_size) + c.block_size - 1) /
                  c.block_size * c.block_size;
  so.max_physical_bytes = c.max_physical_bytes;
  // An RPC handler must answer well before the caller's own timeout.
  so.op_timeout = std::max(std::chrono::milliseconds(1), config.node.transport.op_timeout / 2);
  auto store = corm::Store::Create(so);
  if (!store.ok()) return store.status().WithContext("object store");
  s->store_ = std::move(*store);

  corm::CompactionOptions co;
  co.default_threshold = c.compaction.threshold;
  co.max_merges_per_round = c.compaction.max_merges_per_round;
  co.max_merges_per_second = c.compaction.max_merges_per_second;
  co.interval = std::chrono::milliseconds(std::max<uint32_t>(1, c.compaction.interval_ms));
  // A merge waits for the transport's one-sided copies in progress before it remaps (its grace
  // period; fabric answers at once: its clients validate each copy with a seqlock instead).
  co.wait_for_readers = [&transport = node.transport()](std::chrono::steady_clock::time_point d) {
    return transport.wait_for_read_copies(d).ok();
  };
  s->compactor_ = std::make_unique<corm::Compactor>(*s->store_, co);

  corm::BlockAllocator& ba = s->store_->blocks();
  s->base_ = reinterpret_cast<uint64_t>(ba.base());
  // Clients only read the range one-sidedly; every change goes through the RPCs (a one-sided
  // write could forge headers and break the store's invariants).
  auto region = node.export_region(kRegionName, ba.base(), ba.reserve_bytes(), Access::kReadOnly);
  if (!region.ok()) return region.status().WithContext("exporting the object region");
  s->region_ = *region;
  s->sessions_ = &sessions;
  // The registry outlives the service and runs listeners only while services run (its reaper
  // stops first; SESSION_CLOSE handlers only run while the node serves).
  sessions.add_end_listener([svc = s.get()](SessionIndex i) { return svc->FreeSession(i); });
  return s;
}

SessionFreed ObjectService::FreeSession(SessionIndex index) {
  SessionFreed freed;
  // FreeOwned's precondition (no allocation for `index` starts meanwhile) is the registry's: the
  // session is ending, so acquire() refuses it, and the guards in flight were waited for.
  // TimedOut leaves the objects freed so far freed and may be repeated; a block lock held that
  // long means a stuck operation, so give up after a few tries rather than stall the reaper.
  for (int attempt = 0; attempt < 5; ++attempt) {
    Result<uint64_t> n = store_->FreeOwned(index);
    if (n.ok()) {
      freed.objects += *n;
      return freed;
    }
    FARMEM_LOG_WARN("freeing the objects of session {}: {}", index, n.status().ToString());
  }
  FARMEM_LOG_ERROR("session {}: {} objects could not be freed and stay allocated", index,
                   store_->OwnedObjects(index));
  return freed;
}

ObjectService::~ObjectService() {
  stop();
  compactor_.reset();  // removes its allocation-failure hook from the store
  store_.reset();
}

Status ObjectService::start() {
  if (config_.compaction.interval_ms == 0) return Status::OK();
  return compactor_->Start();
}

void ObjectService::stop() {
  if (compactor_) compactor_->Stop();
}

std::vector<ServiceMethod> ObjectService::methods() {
  std::vector<ServiceMethod> out;
  for (uint16_t op = kObjectsOpcodes.first; op <= kObjectsOpcodes.last; ++op) {
    const char* name = OpName(op);
    if (name == nullptr) continue;
    out.push_back(
        {op, name, Execution(op), [this](const RpcCall& call, std::vector<std::byte>& reply) {
           return Handle(call, reply);
         }});
  }
  return out;
}

void ObjectService::stats(nlohmann::json& doc) const {
  doc["objects"] = Stats();
}

void ObjectService::metrics(MetricsWriter& w) const {
  const nlohmann::json obj = Stats();
  const auto num = [](const nlohmann::json& j, const char* key) {
    auto it = j.find(key);
    return (it != j.end() && it->is_number()) ? it->get<double>() : 0.0;
  };
  w.gauge("farmem_objects_live", "Live objects.", num(obj, "live_objects"));
  w.gauge("farmem_objects_owned", "Live objects owned by a client session (freed when it ends).",
          num(obj, "owned_objects"));
  w.gauge("farmem_objects_persistent", "Live persistent objects.", num(obj, "persistent_objects"));
  w.gauge("farmem_objects_blocks", "Blocks holding objects.", num(obj, "live_blocks"));
  w.gauge("farmem_objects_physical_bytes",
          "Physical memory held by the object store (its own accounting).",
          num(obj, "physical_bytes_held"));
  w.gauge("farmem_objects_metadata_bytes",
          "Heap memory of the object store outside its blocks (block structs, per-slot and ID "
          "tables, lists, fixed per-virtual-block and per-session tables).",
          num(obj, "metadata_bytes"));
  w.gauge("farmem_objects_virtual_blocks",
          "Virtual blocks mapped (primaries and compaction aliases).",
          num(obj, "virtual_blocks_in_use"));
  w.gauge("farmem_process_rss_bytes", "Resident set of farmemd.", num(obj, "process_rss_bytes"));
  const nlohmann::json& comp = obj["compaction"];
  w.counter("farmem_objects_compaction_rounds_total", "Compaction rounds run.",
            num(comp, "rounds"));
  w.counter("farmem_objects_compactions_total", "Block merges done by compaction.",
            num(comp, "compactions"));
  w.counter("farmem_objects_compaction_blocks_freed_total",
            "Physical blocks released by compaction.", num(comp, "blocks_freed"));
  w.counter("farmem_objects_compaction_bytes_moved_total", "Slot bytes copied by compaction.",
            num(comp, "bytes_moved"));
  w.counter("farmem_objects_compaction_struct_pages_released_total",
            "Pages of block structs given back after compaction rounds.",
            num(comp, "struct_pages_released"));
  w.counter("farmem_objects_compaction_grace_wait_seconds_total",
            "Time merges waited for one-sided copies in progress before remapping.",
            num(comp, "grace_wait_ns") / 1e9);
  struct PerClass {
    const char* key;
    const char* name;
    const char* help;
  };
  static constexpr PerClass kPerClass[] = {
      {"fragmentation", "farmem_objects_class_fragmentation",
       "1 - live / capacity of a size class."},
      {"blocks", "farmem_objects_class_blocks", "Blocks of a size class."},
      {"live", "farmem_objects_class_live", "Live objects of a size class."},
      {"merge_attempts", "farmem_objects_class_merge_attempts",
       "Compaction merge attempts in a size class."},
      {"merges", "farmem_objects_class_merges", "Compaction merges done in a size class."},
      {"ids_redrawn", "farmem_objects_class_ids_redrawn",
       "Objects whose ID a merge re-drew (the merge's ID sets collided) in a size class."},
  };
  for (const PerClass& m : kPerClass) {
    w.family(m.name, MetricsWriter::Kind::kGauge, m.help);
    for (const auto& c : obj["classes"]) {
      const std::string cls = std::to_string(c.value("class", 0u));
      const std::string slot = std::to_string(c.value("slot_size", 0u));
      w.sample({{"class", cls}, {"slot_size", slot}}, num(c, m.key));
    }
  }
}

const char* ObjectService::OpName(uint16_t opcode) {
  switch (opcode) {
    case wire::kOpInfo:
      return "obj_info";
    case wire::kOpAlloc:
      return "obj_alloc";
    case wire::kOpFree:
      return "obj_free";
    case wire::kOpRead:
      return "obj_read";
    case wire::kOpWrite:
      return "obj_write";
    case wire::kOpLocate:
      return "obj_locate";
    case wire::kOpRelease:
      return "obj_release";
    case wire::kOpCompact:
      return "obj_compact";
  }
  return nullptr;
}

RpcExecution ObjectService::Execution(uint16_t opcode) {
  // LOCATE (a fixed-size lookup) and READ: a READ holds the progress thread for one slot copy
  // under the block's shared lock, no longer than the one-sided READ of the same slot the NIC
  // thread serves anyway (the copy is at most the largest class); inline it costs no worker
  // hand-off and its reply leaves in the NIC thread's batch. WRITE takes the slot lock and the
  // rest allocate, free or compact: workers.
  return opcode == wire::kOpLocate || opcode == wire::kOpRead ? RpcExecution::kInline
                                                              : RpcExecution::kWorker;
}

Status ObjectService::Handle(const RpcCall& call, std::vector<std::byte>& reply) {
  Status st;
  switch (call.opcode) {
    case wire::kOpInfo:
      st = Info(call, reply);
      break;
    case wire::kOpAlloc:
      st = Alloc(call, reply);
      break;
    case wire::kOpFree:
      st = Free(call, reply);
      break;
    case wire::kOpRead:
      st = Read(call, reply);
      break;
    case wire::kOpWrite:
      st = Write(call, reply);
      break;
    case wire::kOpLocate:
      st = Locate(call, reply);
      break;
    case wire::kOpRelease:
      st = Release(call, reply);
      break;
    case wire::kOpCompact:
      st = Compact(call, reply);
      break;
    default:
      return Status::NotFound("no object handler for opcode " + std::to_string(call.opcode));
  }
  if (!st.ok()) {
    reply.clear();
    FARMEM_LOG_DEBUG("{} from {}: {}", OpName(call.opcode), call.source, st.ToString());
  }
  return st;
}

Result<corm::ObjectPtr> ObjectService::FromWire(const void* wire_ptr) const {
  wire::WirePtr w;
  std::memcpy(&w, wire_ptr, sizeof(w));
  if (w.reserved != 0) return Status::Protocol("pointer's reserved bytes must be 0");
  const size_t classes = store_->classes().count();
  if (w.size_class >= classes) {
    return Status::InvalidArgument("size class " + std::to_string(w.size_class) +
                                   " does not exist (the store has " + std::to_string(classes) +
                                   " classes)");
  }
  if (w.offset >= config_.reserve_bytes) {
    return Status::OutOfRange("pointer offset " + std::to_string(w.offset) +
                              " is outside the object region (" +
                              std::to_string(config_.reserve_bytes) + " bytes)");
  }
  corm::ObjectPtr p;
  p.addr = base_ + w.offset;
  p.id = w.id;
  p.size_class = w.size_class;
  p.gen = w.gen;
  // The block a slot of the class at this offset would be in (the store checks the offset is
  // such a slot, and that this block is the pointer's).
  p.block = static_cast<uint32_t>(corm::BlockStartOf(w.offset, store_->classes().at(w.size_class)) /
                                  config_.block_size);
  return p;
}

void ObjectService::AppendPtrReply(const corm::ObjectPtr& p, std::vector<std::byte>& reply) const {
  wire::PtrReply r{};
  r.ptr.offset = p.addr - base_;
  r.ptr.id = p.id;
  r.ptr.size_class = static_cast<uint16_t>(p.size_class);
  r.ptr.gen = p.gen;
  Append(reply, r);
}

uint32_t ObjectService::PickWorker(std::string_view source) {
  if (config_.worker_selection == WorkerSelection::kRandom) return store_->PickWorker();
  return static_cast<uint32_t>(StableHash(source) % store_->workers());
}

Status ObjectService::Info(const RpcCall& call, std::vector<std::byte>& reply) {
  if (!call.request.empty()) return WrongSize("OBJ_INFO", 0, call.request.size(), " (empty)");
  const corm::SizeClasses& classes = store_->classes();
  wire::InfoReply info{};
  info.region_key = region_.key;
  info.region_length = region_.length;
  info.block_size = config_.block_size;
  info.id_bits = static_cast<uint8_t>(config_.id_bits);
  info.hybrid = config_.hybrid ? 1 : 0;
  info.num_classes = static_cast<uint16_t>(classes.count());
  reply.reserve(sizeof(info) + classes.count() * sizeof(wire::WireClass));
  Append(reply, info);
  for (uint32_t c = 0; c < classes.count(); ++c) {
    const corm::SizeClass& sc = classes.at(c);
    Append(reply,
           wire::WireClass{sc.slot_size, sc.payload_capacity, store_->IdMask(c), sc.block_bytes});
  }
  return Status::OK();
}

Status ObjectService::Alloc(const RpcCall& call, std::vector<std::byte>& reply) {
  auto req = DecodeExact<wire::AllocRequest>(call.request);
  if (!req) return WrongSize("OBJ_ALLOC", sizeof(wire::AllocRequest), call.request.size());
  const size_t max = store_->classes().max_payload();
  if (req->size == 0) return Status::InvalidArgument("object size must be at least 1 byte");
  if (req->size > max) {
    return Status::InvalidArgument("object size " + std::to_string(req->size) +
                                   " exceeds the largest object, " + std::to_string(max) +
                                   " bytes");
  }
  // The guard holds off the session's end while we allocate: the object is either allocated
  // before the end listener frees the session's objects (and freed with them) or refused here.
  Result<SessionGuard> guard = sessions_->acquire(req->session_id);
  if (!guard.ok()) return guard.status().WithContext("OBJ_ALLOC");
  FARMEM_ASSIGN_OR_RETURN(corm::ObjectPtr p,
                          store_->Alloc(req->size, PickWorker(call.source), guard->index()));
  AppendPtrReply(p, reply);
  return Status::OK();
}

Status ObjectService::Free(const RpcCall& call, std::vector<std::byte>& reply) {
  (void)reply;
  if (call.request.size() != sizeof(wire::PtrRequest)) {
    return WrongSize("OBJ_FREE", sizeof(wire::PtrRequest), call.request.size());
  }
  FARMEM_ASSIGN_OR_RETURN(corm::ObjectPtr p, FromWire(call.request.data()));
  return store_->Free(p);
}

Status ObjectService::Read(const RpcCall& call, std::vector<std::byte>& reply) {
  auto req = DecodeExact<wire::ReadRequest>(call.request);
  if (!req) return WrongSize("OBJ_READ", sizeof(wire::ReadRequest), call.request.size());
  if (req->reserved != 0) return Status::Protocol("OBJ_READ reserved field must be 0");
  FARMEM_ASSIGN_OR_RETURN(corm::ObjectPtr p, FromWire(&req->ptr));
  const size_t header = sizeof(wire::PtrReply);
  const size_t room = max_rpc_bytes_ > header ? max_rpc_bytes_ - header : 0;
  const size_t want =
      std::min<size_t>({req->max_bytes, store_->classes().at(p.size_class).payload_capacity, room});
  // The payload goes straight behind the reply header; the header is filled in afterwards with
  // the corrected pointer.
  reply.resize(header + want);
  auto* out = reinterpret_cast<uint8_t*>(reply.data() + header);
  FARMEM_ASSIGN_OR_RETURN(size_t n, store_->Read(p, std::span<uint8_t>(out, want)));
  reply.resize(header + n);
  std::vector<std::byte> head;
  AppendPtrReply(p, head);
  std::memcpy(reply.data(), head.data(), header);
  return Status::OK();
}

Status ObjectService::Write(const RpcCall& call, std::vector<std::byte>& reply) {
  if (call.request.size() < sizeof(wire::PtrRequest)) {
    return WrongSize("OBJ_WRITE", sizeof(wire::PtrRequest), call.request.size(),
                     " or more (pointer + object bytes)");
  }
  FARMEM_ASSIGN_OR_RETURN(corm::ObjectPtr p, FromWire(call.request.data()));
  const auto data = call.request.subspan(sizeof(wire::PtrRequest));
  FARMEM_RETURN_IF_ERROR(store_->Write(
      p, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(data.data()), data.size())));
  AppendPtrReply(p, reply);
  return Status::OK();
}

Status ObjectService::Locate(const RpcCall& call, std::vector<std::byte>& reply) {
  if (call.request.size() != sizeof(wire::PtrRequest)) {
    return WrongSize("OBJ_LOCATE", sizeof(wire::PtrRequest), call.request.size());
  }
  FARMEM_ASSIGN_OR_RETURN(corm::ObjectPtr p, FromWire(call.request.data()));
  FARMEM_ASSIGN_OR_RETURN(corm::ObjectPtr q, store_->Locate(p, store_->options().correction));
  AppendPtrReply(q, reply);
  return Status::OK();
}

Status ObjectService::Release(const RpcCall& call, std::vector<std::byte>& reply) {
  if (call.request.size() != sizeof(wire::PtrRequest)) {
    return WrongSize("OBJ_RELEASE", sizeof(wire::PtrRequest), call.request.size());
  }
  FARMEM_ASSIGN_OR_RETURN(corm::ObjectPtr p, FromWire(call.request.data()));
  FARMEM_ASSIGN_OR_RETURN(corm::ObjectPtr q, store_->ReleasePtr(p));
  AppendPtrReply(q, reply);
  return Status::OK();
}

Status ObjectService::Compact(const RpcCall& call, std::vector<std::byte>& reply) {
  auto req = DecodeExact<wire::CompactRequest>(call.request);
  if (!req) return WrongSize("OBJ_COMPACT", sizeof(wire::CompactRequest), call.request.size());
  if (req->reserved[0] != 0 || req->reserved[1] != 0 || req->reserved[2] != 0) {
    return Status::Protocol("OBJ_COMPACT reserved fields must be 0");
  }
  // Paced rounds can be long: answer after at most kCompactRpcBudget of merging (the client's
  // RPC timeout is 5 s by default) and say so; the caller asks again for the rest.
  const auto deadline = std::chrono::steady_clock::now() + kCompactRpcBudget;
  Result<uint32_t> merges = Status::Internal("unset");
  if (req->size_class == wire::kAllClasses) {
    merges = compactor_->CompactAll(deadline);
  } else {
    const size_t classes = store_->classes().count();
    if (req->size_class >= classes) {
      return Status::InvalidArgument("size class " + std::to_string(req->size_class) +
                                     " does not exist (the store has " + std::to_string(classes) +
                                     " classes)");
    }
    merges = compactor_->CompactClass(req->size_class, deadline);
  }
  if (!merges.ok()) return merges.status();
  const bool partial = std::chrono::steady_clock::now() >= deadline;
  const nlohmann::json j = {{"merges", *merges},
                            {"partial", partial},
                            {"compaction", CompactionJson(compactor_->stats())}};
  const std::string text = j.dump();
  const auto* b = reinterpret_cast<const std::byte*>(text.data());
  reply.assign(b, b + text.size());
  return Status::OK();
}

nlohmann::json ObjectService::Stats() const {
  using nlohmann::json;
  const ObjectsConfig& c = config_;
  json j;
  j["enabled"] = true;
  j["config"] = {{"block_size", c.block_size},
                 {"max_block_size", c.max_block_size},
                 {"min_slots_per_block", c.min_slots_per_block},
                 {"id_bits", c.id_bits},
                 {"hybrid", c.hybrid},
                 {"workers", c.workers},
                 {"worker_selection", SelectionName(c.worker_selection)},
                 {"correction", CorrectionName(c.correction)},
                 {"reserve_bytes", c.reserve_bytes},
                 {"max_physical_bytes", c.max_physical_bytes},
                 {"compaction",
                  {{"threshold", c.compaction.threshold},
                   {"interval_ms", c.compaction.interval_ms},
                   {"max_merges_per_round", c.compaction.max_merges_per_round},
                   {"max_merges_per_second", c.compaction.max_merges_per_second}}}};
  j["region"] = {{"name", region_.name}, {"length", region_.length}};

  corm::Store& store = *store_;
  const corm::SizeClasses& classes = store.classes();
  uint64_t live = 0, blocks = 0, slot_bytes = 0;
  json list = json::array();
  const corm::CompactionStats comp = compactor_->stats();
  for (uint32_t i = 0; i < classes.count(); ++i) {
    const corm::ClassStats cs = store.Stats(i);
    live += cs.live_objects;
    blocks += cs.blocks;
    slot_bytes += cs.live_objects * cs.slot_size;
    const corm::ClassMergeStats cm =
        i < comp.classes.size() ? comp.classes[i] : corm::ClassMergeStats{};
    // Only classes in use: a 1 MiB-block store has ~90 classes, most of them empty.
    if (cs.blocks == 0 && cm.attempts == 0) continue;
    list.push_back({{"class", i},
                    {"slot_size", cs.slot_size},
                    {"payload_capacity", classes.at(i).payload_capacity},
                    {"blocks", cs.blocks},
                    {"live", cs.live_objects},
                    {"capacity_slots", cs.capacity_slots},
                    {"fragmentation", cs.fragmentation},
                    {"merge_attempts", cm.attempts},
                    {"merges", cm.merges},
                    {"merge_collisions", cm.collisions},
                    {"merge_redraws", cm.redraw_merges},
                    {"ids_redrawn", cm.redraws},
                    {"merge_success_rate", cm.success_rate()}});
  }
  const corm::BlockAllocatorStats bs = store.blocks().Stats();
  j["num_classes"] = classes.count();
  j["max_object_size"] = classes.max_payload();
  j["live_objects"] = live;
  // Owned by a client session (freed when it ends) vs persistent (docs/sessions.md).
  const corm::StoreStats ss = store.Stats();
  j["owned_objects"] = ss.owned_objects;
  j["persistent_objects"] = ss.persistent_objects;
  j["live_blocks"] = blocks;
  j["live_slot_bytes"] = slot_bytes;
  j["physical_bytes_held"] = bs.physical_bytes_held;
  // Heap memory outside the blocks (docs/objects.md, "Metadata"): what grows with the objects,
  // and the tables fixed at start (sized by the reservation and the session-ID space).
  const corm::MetadataStats& md = ss.metadata;
  j["metadata_bytes"] = md.total();
  j["metadata"] = {{"block_structs", md.block_structs},
                   {"per_slot", md.per_slot},
                   {"id_tables", md.id_tables},
                   {"owner_lists", md.owner_lists},
                   {"per_vblock", md.per_vblock},
                   {"per_owner", md.per_owner},
                   {"arena_slack", md.arena_slack},
                   {"dynamic", md.dynamic()},
                   {"total", md.total()}};
  j["physical_blocks_in_use"] = bs.physical_blocks_in_use;
  j["physical_blocks_free"] = bs.physical_blocks_free;
  j["virtual_blocks_in_use"] = bs.virtual_blocks_in_use;
  j["memfd_pools"] = bs.pools;
  j["memfd_bytes"] = bs.pool_bytes_total;
  j["remaps"] = bs.remaps;
  j["punches"] = bs.punches;
  j["process_rss_bytes"] = ProcessRssBytes();
  j["classes"] = std::move(list);
  j["compaction"] = CompactionJson(comp);
  return j;
}

}  // namespace farmem

namespace farmem {

const ServiceDescriptor& ObjectsServiceDescriptor() {
  static const ServiceDescriptor d{
      "objects",
      "CoRM object store: OBJ_* RPCs, one read-only region 'objects', compaction",
      [](FlagSet& flags, ServerConfig& c) {
        // Config file: these keys flat, or nested as {"objects": {"block-size": ...,
        // "compaction": {"threshold": ...}}}.
        ObjectsConfig& o = c.objects;
        flags.add("objects-enabled", &o.enabled,
                  "serve the CoRM object store (true | false; same as leaving 'objects' out of "
                  "--services)");
        flags.add("objects-block-size", &o.block_size,
                  "base block of the object region in bytes (unit of addresses and remaps; every "
                  "class's block is a multiple): power of two, 4096..1048576");
        flags.add("objects-max-block-size", &o.max_block_size,
                  "largest block of a class of many slots, bytes: power of two, "
                  "--objects-block-size..1048576 (0 = max(65536, --objects-block-size))");
        flags.add("objects-min-slots-per-block", &o.min_slots_per_block,
                  "slots a class's block should hold at least (larger blocks, up to "
                  "--objects-max-block-size, for classes of large objects): 1..65536");
        flags.add("objects-id-bits", &o.id_bits, "object ID bits per block: 0 | 8 | 12 | 16");
        flags.add("objects-hybrid", &o.hybrid,
                  "classes with more slots than IDs become offset-only (true) or use only "
                  "2^id_bits slots (false)");
        flags.add("objects-workers", &o.workers, "object thread allocators (0 = --workers)");
        flags.add_choice(
            "objects-worker-selection", &o.worker_selection,
            {{"connection", WorkerSelection::kByConnection}, {"random", WorkerSelection::kRandom}},
            "allocator per allocation");
        flags.add_choice("objects-correction", &o.correction,
                         {{"owner", Correction::kAskOwner}, {"scan", Correction::kScan}},
                         "pointer correction on the RPC path");
        flags.add_mib("objects-reserve-mib", &o.reserve_bytes,
                      "virtual range of the object region in MiB (0 = --memory-mib)");
        flags.add_mib("objects-max-physical-mib", &o.max_physical_bytes,
                      "physical memory the object store may hold in MiB (0 = --memory-mib)");
        flags.add("objects-compaction-threshold", &o.compaction.threshold,
                  "compact a size class when its fragmentation exceeds this (0..1)");
        flags.add("objects-compaction-interval-ms", &o.compaction.interval_ms,
                  "compaction leader period (0 = no leader thread)");
        flags.add("objects-compaction-max-merges-per-round", &o.compaction.max_merges_per_round,
                  "bound on block merges per compaction round");
        flags.add("objects-compaction-max-merges-per-second", &o.compaction.max_merges_per_second,
                  "pace of compaction rounds, merges per second (0 = unpaced; allocation "
                  "failures are never paced)");
      },
      [](ServerConfig& c) { return ValidateObjectsConfig(c); },
      [](const ServerConfig& c, ServiceEnv& env) -> Result<std::unique_ptr<Service>> {
        FARMEM_ASSIGN_OR_RETURN(std::unique_ptr<ObjectService> s,
                                ObjectService::Create(c, env.node, env.sessions));
        return std::unique_ptr<Service>(std::move(s));
      },
  };
  return d;
}

}  // namespace farmem
