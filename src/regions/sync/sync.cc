// RegionSync: named barriers, ticket mutexes and doorbells over one-sided FAA/CAS/read on 64-byte
// cells (sync_cell.h; docs/regions_sync.md). Each RegionSync owns one Scheduler and is used by one
// thread at a time; every wait polls with a 1 us -> 1 ms backoff and ends at its deadline.
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <string>

#include "farmem/regions.h"
#include "regions/sync/sync_cell.h"
#include "regions/sync/sync_faults.h"

namespace farmem {

namespace regions::sync::testing {
namespace {
std::atomic<int> g_fault{0};
}  // namespace
void SetSyncFault(SyncFault fault) {
  g_fault.store(static_cast<int>(fault), std::memory_order_relaxed);
}
SyncFault GetSyncFault() {
  return static_cast<SyncFault>(g_fault.load(std::memory_order_relaxed));
}
bool ParseSyncFault(std::string_view name, SyncFault* out) {
  if (name.empty())
    *out = SyncFault::kNone;
  else if (name == "barrier_early")
    *out = SyncFault::kBarrierEarly;
  else if (name == "mutex_skip")
    *out = SyncFault::kMutexSkip;
  else if (name == "bell_nowait")
    *out = SyncFault::kBellNoWait;
  else
    return false;
  return true;
}
}  // namespace regions::sync::testing

using namespace regions::sync;
using Clock = std::chrono::steady_clock;

namespace {

// A resolved name: its record and the RemoteRef of its cell's first word.
struct Handle {
  std::string name;
  NameRecord record;
  RemoteRef cell;
};

RemoteRef Word(const RemoteRef& cell, size_t offset) {
  RemoteRef r = cell;
  r.offset += offset;
  return r;
}

uint64_t Bit(uint64_t ticket) {
  return uint64_t{1} << (ticket % kMaxMutexWaiters);
}

}  // namespace

struct RegionSync::Impl {
  Node& node;
  Cluster& cluster;
  RawClient* raw;
  RegionSyncOptions options;
  std::unique_ptr<Scheduler> sched;
  std::map<std::string, PeerId> peers;    // farmemd address -> peer
  std::map<std::string, Handle> handles;  // name -> resolved cell
  std::map<std::string, uint64_t> held;   // mutex name -> the ticket this RegionSync holds
  // Bell name -> {cell nonce, value the last wait returned}: a name deleted and created again
  // (another cell) starts from 0 again.
  std::map<std::string, std::pair<uint64_t, uint64_t>> bell_seen;
  std::mt19937_64 rng{std::random_device{}() ^
                      static_cast<uint64_t>(Clock::now().time_since_epoch().count())};

  Impl(Node& n, Cluster& c, RawClient* r, RegionSyncOptions o)
      : node(n), cluster(c), raw(r), options(std::move(o)) {}

  std::string Key(std::string_view name) const { return options.prefix + std::string(name); }

  Result<PeerId> PeerFor(const std::string& address) {
    if (raw != nullptr && raw->server().bootstrap_address == address) return raw->server().id;
    auto it = peers.find(address);
    if (it != peers.end()) return it->second;
    auto info = node.connect(address);
    if (!info.ok()) {
      return Status(info.status().code(),
                    "regions sync: cannot reach the farmemd at " + address +
                        " holding the cell: " + std::string(info.status().message()));
    }
    peers[address] = info->id;
    return info->id;
  }

  // Looks the name up (cached) and checks its kind.
  Result<Handle> Resolve(std::string_view name, Kind kind) {
    FARMEM_RETURN_IF_ERROR(ValidateSyncName(name));
    auto it = handles.find(std::string(name));
    if (it == handles.end()) {
      auto kv = cluster.get(Key(name));
      if (!kv.ok()) {
        if (kv.status().code() == Code::kNotFound) {
          return Status::NotFound("regions sync: unknown name '" + std::string(name) +
                                  "' (never initialised, or deleted)");
        }
        return kv.status();
      }
      FARMEM_ASSIGN_OR_RETURN(NameRecord rec, DecodeNameRecord(kv->value));
      FARMEM_ASSIGN_OR_RETURN(PeerId peer, PeerFor(rec.address));
      Handle h{std::string(name), rec, RemoteRef{peer, rec.key, rec.offset}};
      it = handles.emplace(std::string(name), std::move(h)).first;
    }
    if (it->second.record.kind != kind) {
      return Status::FailedPrecondition("regions sync: '" + std::string(name) + "' is a " +
                                        std::string(KindName(it->second.record.kind)) + ", not a " +
                                        std::string(KindName(kind)));
    }
    return it->second;
  }

  // Reads the cell and checks it still is this name's (not deleted, not reused).
  Task<Result<Cell>> ReadCell(const Handle& h) {
    Cell c{};
    Status st = co_await sched->read(h.cell, &c, sizeof c);
    if (!st.ok()) co_return st;
    if (c.magic_kind != MagicKind(h.record.kind) || c.nonce != h.record.nonce) {
      handles.erase(h.name);
      co_return Status::NotFound("regions sync: '" + h.name + "' was deleted");
    }
    co_return c;
  }

  // Resolve + a first read of the cell. A cached handle whose cell is gone (the name was deleted,
  // perhaps created again) is looked up once more in the store before giving NotFound.
  Task<Result<Handle>> Fresh(const std::string& name, Kind kind, Cell* first) {
    const bool cached = handles.count(name) != 0;
    auto h = Resolve(name, kind);
    if (!h.ok()) co_return h.status();
    auto c = co_await ReadCell(*h);
    if (!c.ok() && c.status().code() == Code::kNotFound && cached) {
      h = Resolve(name, kind);
      if (!h.ok()) co_return h.status();
      c = co_await ReadCell(*h);
    }
    if (!c.ok()) co_return c.status();
    *first = *c;
    co_return *h;
  }

  // Sleeps the next backoff step (never past the deadline); false once the deadline passed.
  Task<bool> Backoff(std::chrono::microseconds* step, Clock::time_point deadline) {
    const auto now = Clock::now();
    if (now >= deadline) co_return false;
    auto d = std::min<Clock::duration>(*step, deadline - now);
    co_await sched->sleep_for(d);
    *step = std::min(*step * 2, options.backoff_max);
    co_return true;
  }

  Task<Status> Init(std::string name, Kind kind, uint64_t parties) {
    Status st = ValidateSyncName(name);
    if (!st.ok()) co_return st;
    auto same = [&](const NameRecord& r) -> Status {
      if (r.kind != kind) {
        return Status::FailedPrecondition("regions sync: '" + name + "' exists as a " +
                                          std::string(KindName(r.kind)) + ", not a " +
                                          std::string(KindName(kind)));
      }
      if (r.parties != parties) {
        return Status::FailedPrecondition("regions sync: barrier '" + name +
                                          "' exists with n = " + std::to_string(r.parties) +
                                          ", not " + std::to_string(parties));
      }
      return Status::OK();
    };
    auto existing = cluster.get(Key(name));
    if (existing.ok()) {
      auto rec = DecodeNameRecord(existing->value);
      co_return rec.ok() ? same(*rec) : rec.status();
    }
    if (existing.status().code() != Code::kNotFound) co_return existing.status();
    if (raw == nullptr) {
      co_return Status::FailedPrecondition(
          "regions sync: creating a name needs a RawClient (RegionSync::Open's raw)");
    }
    auto alloc = co_await raw->alloc_raw(*sched, sizeof(Cell), Lifetime::kPersistent);
    if (!alloc.ok()) co_return alloc.status();
    NameRecord rec;
    rec.kind = kind;
    rec.parties = parties;
    rec.nonce = rng() | 1;  // never 0: a zeroed range never matches
    rec.key = alloc->ref.key;
    rec.offset = alloc->ref.offset;
    rec.address = raw->server().bootstrap_address;
    Cell c{};
    c.magic_kind = MagicKind(kind);
    c.nonce = rec.nonce;
    c.parties = parties;
    // The cell is complete in remote memory before the name points to it.
    st = co_await sched->write(alloc->ref, &c, sizeof c, /*delivery_complete=*/true);
    if (st.ok()) {
      auto put = cluster.put_if(Key(name), EncodeNameRecord(rec), 0);
      if (put.ok()) co_return Status::OK();
      st = put.status();
    }
    (void)co_await raw->free_raw(*sched, alloc->ref);
    if (st.code() != Code::kFailedPrecondition) co_return st;
    // Another process created the name first: agree with its cell.
    auto won = cluster.get(Key(name));
    if (!won.ok()) co_return won.status();
    auto wrec = DecodeNameRecord(won->value);
    co_return wrec.ok() ? same(*wrec) : wrec.status();
  }

  Task<Status> BarrierWait(std::string name, std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    Cell cell0{};
    auto h = co_await Fresh(name, Kind::kBarrier, &cell0);
    if (!h.ok()) co_return h.status();
    auto c = co_await sched->fetch_add(Word(h->cell, offsetof(Cell, counter)), 1);
    if (!c.ok()) co_return c.status();
    const uint64_t n = h->record.parties;
    const uint64_t target = (*c / n + 1) * n;
    if (testing::GetSyncFault() == testing::SyncFault::kBarrierEarly) co_return Status::OK();
    std::chrono::microseconds step = options.backoff_min;
    while (true) {
      auto cell = co_await ReadCell(*h);
      if (!cell.ok()) co_return cell.status();
      if (cell->counter >= target) co_return Status::OK();
      if (!co_await Backoff(&step, deadline)) {
        co_return Status::TimedOut("regions sync: barrier '" + name +
                                   "': " + std::to_string(target - cell->counter) + " of " +
                                   std::to_string(n) + " parties missing at the deadline");
      }
    }
  }

  // While serving == s and ticket s is marked abandoned, clear its mark (CAS: exactly one party
  // does) and advance serving past it; then the same for s + 1.
  Task<Status> PassAbandoned(const Handle& h, uint64_t s) {
    const RemoteRef abandoned = Word(h.cell, offsetof(Cell, abandoned));
    while (true) {
      auto cell = co_await ReadCell(h);
      if (!cell.ok()) co_return cell.status();
      if (cell->serving != s || (cell->abandoned & Bit(s)) == 0) co_return Status::OK();
      auto old =
          co_await sched->compare_swap(abandoned, cell->abandoned, cell->abandoned & ~Bit(s));
      if (!old.ok()) co_return old.status();
      if (*old != cell->abandoned) continue;  // the word changed: look again
      auto adv = co_await sched->fetch_add(Word(h.cell, offsetof(Cell, serving)), 1);
      if (!adv.ok()) co_return adv.status();
      s++;
    }
  }

  // A waiter of ticket t gives up: marks t abandoned, and passes it if it is being served.
  Task<Status> Abandon(const Handle& h, uint64_t t) {
    const RemoteRef abandoned = Word(h.cell, offsetof(Cell, abandoned));
    while (true) {
      auto cell = co_await ReadCell(h);
      if (!cell.ok()) co_return cell.status();
      if (t - cell->serving >= kMaxMutexWaiters || (cell->abandoned & Bit(t)) != 0) {
        co_return Status::Internal("regions sync: mutex '" + h.name + "' has more than " +
                                   std::to_string(kMaxMutexWaiters) +
                                   " waiters; its abandoned ticket cannot be marked (rdelete it)");
      }
      auto old = co_await sched->compare_swap(abandoned, cell->abandoned, cell->abandoned | Bit(t));
      if (!old.ok()) co_return old.status();
      if (*old == cell->abandoned) break;
    }
    co_return co_await PassAbandoned(h, t);
  }

  Task<Status> MutexLock(std::string name, std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    if (held.count(name) != 0) {
      co_return Status::FailedPrecondition("regions sync: mutex '" + name +
                                           "' is already held by this RegionSync");
    }
    Cell cell0{};
    auto h = co_await Fresh(name, Kind::kMutex, &cell0);
    if (!h.ok()) co_return h.status();
    const Cell* first = &cell0;
    if (first->counter - first->serving >= kMaxMutexWaiters - 1) {
      co_return Status::ResourceExhausted("regions sync: mutex '" + name + "' has " +
                                          std::to_string(kMaxMutexWaiters - 1) +
                                          " waiters already");
    }
    auto t = co_await sched->fetch_add(Word(h->cell, offsetof(Cell, counter)), 1);
    if (!t.ok()) co_return t.status();
    if (testing::GetSyncFault() == testing::SyncFault::kMutexSkip) {
      held[name] = *t;
      co_return Status::OK();
    }
    std::chrono::microseconds step = options.backoff_min;
    while (true) {
      auto cell = co_await ReadCell(*h);
      if (!cell.ok()) co_return cell.status();
      if (cell->serving == *t) {
        held[name] = *t;
        co_return Status::OK();
      }
      if (!co_await Backoff(&step, deadline)) {
        Status st = co_await Abandon(*h, *t);
        if (!st.ok()) co_return st;
        co_return Status::TimedOut("regions sync: mutex '" + name + "': not acquired in " +
                                   std::to_string(timeout.count()) + " ms (" +
                                   std::to_string(*t - cell->serving) + " tickets ahead)");
      }
    }
  }

  Task<Status> MutexUnlock(std::string name) {
    auto it = held.find(name);
    if (it == held.end()) {
      Status st = ValidateSyncName(name);
      if (!st.ok()) co_return st;
      co_return Status::FailedPrecondition("regions sync: mutex '" + name +
                                           "' is not held by this RegionSync");
    }
    const uint64_t t = it->second;
    held.erase(it);
    auto h = Resolve(name, Kind::kMutex);
    if (!h.ok()) co_return h.status();
    auto cell = co_await ReadCell(*h);
    if (!cell.ok()) co_return cell.status();
    if (testing::GetSyncFault() != testing::SyncFault::kMutexSkip && cell->serving != t) {
      co_return Status::Internal("regions sync: mutex '" + name + "' serves ticket " +
                                 std::to_string(cell->serving) + ", but this holder has " +
                                 std::to_string(t));
    }
    auto adv = co_await sched->fetch_add(Word(h->cell, offsetof(Cell, serving)), 1);
    if (!adv.ok()) co_return adv.status();
    co_return co_await PassAbandoned(*h, *adv + 1);
  }

  Task<Result<uint64_t>> BellRing(std::string name) {
    Cell cell0{};
    auto h = co_await Fresh(name, Kind::kBell, &cell0);
    if (!h.ok()) co_return h.status();
    auto v = co_await sched->fetch_add(Word(h->cell, offsetof(Cell, counter)), 1);
    if (!v.ok()) co_return v.status();
    co_return *v + 1;
  }

  Task<Result<uint64_t>> BellWait(std::string name, std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    Cell cell0{};
    auto h = co_await Fresh(name, Kind::kBell, &cell0);
    if (!h.ok()) co_return h.status();
    auto seen = bell_seen.find(name);
    const uint64_t last =
        seen != bell_seen.end() && seen->second.first == h->record.nonce ? seen->second.second : 0;
    const bool no_wait = testing::GetSyncFault() == testing::SyncFault::kBellNoWait;
    std::chrono::microseconds step = options.backoff_min;
    while (true) {
      auto cell = co_await ReadCell(*h);
      if (!cell.ok()) co_return cell.status();
      if (cell->counter != last || no_wait) {
        bell_seen[name] = {h->record.nonce, cell->counter};
        co_return cell->counter;
      }
      if (!co_await Backoff(&step, deadline)) {
        co_return Status::TimedOut("regions sync: bell '" + name + "' stayed at " +
                                   std::to_string(last) + " for " +
                                   std::to_string(timeout.count()) + " ms");
      }
    }
  }

  Task<Status> Delete(std::string name) {
    Status st = ValidateSyncName(name);
    if (!st.ok()) co_return st;
    handles.erase(name);
    held.erase(name);
    bell_seen.erase(name);
    auto kv = cluster.get(Key(name));
    if (!kv.ok()) {
      if (kv.status().code() == Code::kNotFound) {
        co_return Status::NotFound("regions sync: unknown name '" + name + "'");
      }
      co_return kv.status();
    }
    auto rec = DecodeNameRecord(kv->value);
    if (!rec.ok()) co_return rec.status();
    auto peer = PeerFor(rec->address);
    if (!peer.ok()) co_return peer.status();
    const RemoteRef cell{*peer, rec->key, rec->offset};
    // The magic word goes first (CAS: one deleter wins): every poll of a waiter checks it.
    auto old = co_await sched->compare_swap(cell, MagicKind(rec->kind), 0);
    if (!old.ok()) co_return old.status();
    if (*old != MagicKind(rec->kind)) {
      co_return Status::NotFound("regions sync: '" + name + "' is being deleted already");
    }
    st = cluster.remove(Key(name));
    if (!st.ok() && st.code() != Code::kNotFound) co_return st;
    // Freed only through a client of the farmemd that holds it; otherwise the 64 bytes stay
    // allocated (persistent) and unreachable (docs/regions_sync.md, "Deleting").
    if (raw != nullptr && raw->server().bootstrap_address == rec->address) {
      co_return co_await raw->free_raw(*sched, cell);
    }
    co_return Status::OK();
  }
};

Result<std::unique_ptr<RegionSync>> RegionSync::Open(Node& node, Cluster& cluster, RawClient* raw,
                                                     RegionSyncOptions options) {
  if (options.backoff_min.count() <= 0 || options.backoff_max < options.backoff_min) {
    return Status::InvalidArgument("regions sync: backoff needs 0 < backoff_min <= backoff_max");
  }
  auto impl = std::make_unique<Impl>(node, cluster, raw, std::move(options));
  FARMEM_ASSIGN_OR_RETURN(impl->sched, node.make_scheduler());
  return std::unique_ptr<RegionSync>(new RegionSync(std::move(impl)));
}

RegionSync::RegionSync(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RegionSync::~RegionSync() = default;

namespace {
Status CheckTimeout(std::chrono::milliseconds timeout) {
  if (timeout.count() < 0) return Status::InvalidArgument("regions sync: negative timeout");
  return Status::OK();
}
}  // namespace

Status RegionSync::rbarrier_init(std::string_view name, uint32_t n) {
  if (n == 0) return Status::InvalidArgument("regions sync: a barrier needs n >= 1");
  return impl_->sched->block_on(impl_->Init(std::string(name), Kind::kBarrier, n));
}
Status RegionSync::rbarrier_wait(std::string_view name, std::chrono::milliseconds timeout) {
  FARMEM_RETURN_IF_ERROR(CheckTimeout(timeout));
  return impl_->sched->block_on(impl_->BarrierWait(std::string(name), timeout));
}
Status RegionSync::rmutex_init(std::string_view name) {
  return impl_->sched->block_on(impl_->Init(std::string(name), Kind::kMutex, 0));
}
Status RegionSync::rmutex_lock(std::string_view name, std::chrono::milliseconds timeout) {
  FARMEM_RETURN_IF_ERROR(CheckTimeout(timeout));
  return impl_->sched->block_on(impl_->MutexLock(std::string(name), timeout));
}
Status RegionSync::rmutex_unlock(std::string_view name) {
  return impl_->sched->block_on(impl_->MutexUnlock(std::string(name)));
}
Status RegionSync::rbell_init(std::string_view name) {
  return impl_->sched->block_on(impl_->Init(std::string(name), Kind::kBell, 0));
}
Result<uint64_t> RegionSync::rbell_ring(std::string_view name) {
  return impl_->sched->block_on(impl_->BellRing(std::string(name)));
}
Result<uint64_t> RegionSync::rbell_wait(std::string_view name, std::chrono::milliseconds timeout) {
  FARMEM_RETURN_IF_ERROR(CheckTimeout(timeout));
  return impl_->sched->block_on(impl_->BellWait(std::string(name), timeout));
}
Status RegionSync::rdelete(std::string_view name) {
  return impl_->sched->block_on(impl_->Delete(std::string(name)));
}

}  // namespace farmem
