// memory://NAME: the in-process ClusterBackend: revisioned keys, leases, event history and prefix
// watches, one store per NAME shared by the process. Threads: callers (under Store::mu), a
// lease-expiry timer per store, a delivery thread per watch.
#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "cluster/backend.h"
#include "cluster/memory_backend.h"

namespace farmem::cluster {

namespace {

using std::chrono::milliseconds;

// Events kept for watches that start in the past or fall behind (etcd keeps them until its
// compaction runs; this bound keeps a long-lived test process from growing without end).
constexpr size_t kHistoryLimit = 100000;
// A watch delivers at most about this many events per callback (whole revisions only).
constexpr size_t kBatchEvents = 1024;
// Every wait of a watch or the timer re-checks its state at least this often.
constexpr milliseconds kPollInterval{200};

struct Lease {
  milliseconds ttl{0};
  Clock::time_point expiry;
  std::set<std::string, std::less<>> keys;
};

class Store {
 public:
  explicit Store(std::string name) : name_(std::move(name)) {
    timer_ = std::thread([this] { TimerLoop(); });
  }
  ~Store() {
    {
      std::lock_guard l(mu);
      stopping_ = true;
    }
    timer_cv_.notify_all();
    timer_.join();
  }
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  const std::string& name() const { return name_; }

  std::mutex mu;
  // Watch threads wait on it for a new revision, the store coming back, or their cancel.
  std::condition_variable changed;

  // ---- all below under mu ----
  bool available = true;
  bool hang = false;
  int64_t revision = 1;  // like etcd: an empty store is at revision 1, the first write makes 2
  int64_t compact_revision = 0;  // events of revisions below this are gone
  std::map<std::string, BackendKv, std::less<>> kvs;
  std::map<int64_t, Lease> leases;
  int64_t next_lease = 0x6d656d0000000001;  // "mem..." — recognisable in logs, never 0
  std::deque<BackendEvent> history;         // ascending kv.mod_revision

  // Expires every lease whose time has come (the timer does it too; callers do it first so no
  // call sees a lease that is already past its expiry).
  void ExpireDueLocked(Clock::time_point now) {
    for (auto it = leases.begin(); it != leases.end();) {
      if (it->second.expiry <= now) {
        Lease lease = std::move(it->second);
        it = leases.erase(it);
        DeleteLeaseKeysLocked(lease);
      } else {
        ++it;
      }
    }
  }

  // All keys of one lease go in one revision, as in etcd.
  void DeleteLeaseKeysLocked(const Lease& lease) {
    if (lease.keys.empty()) return;
    int64_t rev = ++revision;
    for (const auto& key : lease.keys) {
      auto it = kvs.find(key);
      if (it == kvs.end()) continue;
      kvs.erase(it);
      AppendDeleteLocked(key, rev);
    }
    changed.notify_all();
  }

  void AppendDeleteLocked(std::string_view key, int64_t rev) {
    BackendEvent ev;
    ev.is_delete = true;
    ev.kv.key = std::string(key);
    ev.kv.mod_revision = rev;
    AppendLocked(std::move(ev));
  }

  void AppendLocked(BackendEvent ev) {
    history.push_back(std::move(ev));
    if (history.size() <= kHistoryLimit) return;
    // Drop whole revisions: a watch must never see half of one.
    int64_t dropped = history.front().kv.mod_revision;
    while (!history.empty() && history.front().kv.mod_revision == dropped) history.pop_front();
    compact_revision = std::max(compact_revision, dropped + 1);
  }

  void CompactLocked(int64_t rev) {
    while (!history.empty() && history.front().kv.mod_revision < rev) history.pop_front();
    compact_revision = std::max(compact_revision, rev);
  }

  void NotifyTimer() { timer_cv_.notify_all(); }

 private:
  void TimerLoop() {
    std::unique_lock l(mu);
    while (!stopping_) {
      auto now = Clock::now();
      ExpireDueLocked(now);
      auto wake = now + std::chrono::seconds(1);
      for (const auto& [id, lease] : leases) wake = std::min(wake, lease.expiry);
      timer_cv_.wait_until(l, wake);
    }
  }

  const std::string name_;
  std::condition_variable timer_cv_;
  bool stopping_ = false;  // under mu
  std::thread timer_;
};

// name -> store. Never destroyed: a backend may be released during static destruction.
struct Registry {
  std::mutex mu;
  std::map<std::string, std::weak_ptr<Store>, std::less<>> stores;
};

Registry& GetRegistry() {
  static Registry* r = new Registry;
  return *r;
}

std::shared_ptr<Store> FindStore(std::string_view name) {
  Registry& r = GetRegistry();
  std::lock_guard l(r.mu);
  auto it = r.stores.find(name);
  return it == r.stores.end() ? nullptr : it->second.lock();
}

std::shared_ptr<Store> FindOrCreateStore(std::string_view name) {
  Registry& r = GetRegistry();
  std::lock_guard l(r.mu);
  auto& slot = r.stores[std::string(name)];
  if (auto s = slot.lock()) return s;
  auto s = std::make_shared<Store>(std::string(name));
  slot = s;
  // Forget stores that are gone so a process cycling through names does not grow the map.
  std::erase_if(r.stores, [](const auto& kv) { return kv.second.expired(); });
  return s;
}

// One watch: its own thread pulls the events it has not delivered yet out of the store's history,
// so a slow callback delays only itself and an outage just pauses the pulling.
class MemoryWatch final : public ClusterWatch {
 public:
  struct State {
    std::shared_ptr<Store> store;
    std::string prefix;
    int64_t next_revision = 0;  // the first revision not delivered yet
    BackendWatchCallback on_events;
    ClusterWatchErrorCallback on_error;
    bool cancelled = false;  // under store->mu
    std::mutex join_mu;      // serialises cancel()s that join the thread
    std::thread thread;

    ~State() {
      // Only reached with the thread joined, or on the watch thread itself (its own last
      // reference), where joining is impossible: let it finish alone.
      if (thread.joinable()) thread.detach();
    }

    void Run(const std::shared_ptr<State>& self) {
      (void)self;  // keeps this state alive while the thread runs
      while (true) {
        std::vector<BackendEvent> batch;
        Status error;
        {
          std::unique_lock l(store->mu);
          store->changed.wait_for(l, kPollInterval, [&] {
            return cancelled || (store->available && store->revision >= next_revision);
          });
          if (cancelled) return;
          if (!store->available || store->revision < next_revision) continue;
          if (next_revision < store->compact_revision) {
            error = Status::FailedPrecondition(
                "watch of '" + prefix + "' on memory://" + store->name() + ": revision " +
                std::to_string(next_revision) +
                " is no longer available: required revision has been compacted (oldest kept: " +
                std::to_string(store->compact_revision) + ")");
          } else {
            Collect(batch);
          }
        }
        if (!error.ok()) {
          if (on_error) on_error(error);
          return;
        }
        if (!batch.empty()) on_events(batch);
      }
    }

    // Under store->mu: the events from next_revision on that match the prefix.
    void Collect(std::vector<BackendEvent>& batch) {
      auto& h = store->history;
      auto it = std::lower_bound(
          h.begin(), h.end(), next_revision,
          [](const BackendEvent& e, int64_t rev) { return e.kv.mod_revision < rev; });
      int64_t last = 0;
      for (; it != h.end(); ++it) {
        int64_t rev = it->kv.mod_revision;
        if (batch.size() >= kBatchEvents && rev != last) {
          next_revision = rev;
          return;
        }
        last = rev;
        if (it->kv.key.starts_with(prefix)) batch.push_back(*it);
      }
      next_revision = store->revision + 1;
    }
  };

  explicit MemoryWatch(std::shared_ptr<State> state) : state_(std::move(state)) {}
  ~MemoryWatch() override { cancel(); }

  void cancel() override {
    {
      std::lock_guard l(state_->store->mu);
      state_->cancelled = true;
    }
    state_->store->changed.notify_all();
    // From inside a callback: the thread stops when the callback returns (nothing to wait for).
    if (std::this_thread::get_id() == state_->thread.get_id()) return;
    std::lock_guard j(state_->join_mu);
    if (state_->thread.joinable()) state_->thread.join();
  }

 private:
  std::shared_ptr<State> state_;
};

class MemoryBackend final : public ClusterBackend {
 public:
  explicit MemoryBackend(std::shared_ptr<Store> store) : store_(std::move(store)) {}

  std::string_view kind() const override { return "memory"; }

  Result<BackendKv> get(std::string_view key, Clock::time_point deadline) override {
    auto l = Enter(deadline);
    if (!l.owns_lock()) return Unreachable();
    auto it = store_->kvs.find(key);
    if (it == store_->kvs.end())
      return Status::NotFound("key '" + std::string(key) + "' not found");
    return it->second;
  }

  Result<BackendRange> range(std::string_view prefix, Clock::time_point deadline) override {
    auto l = Enter(deadline);
    if (!l.owns_lock()) return Unreachable();
    BackendRange r;
    r.revision = store_->revision;
    for (auto it = store_->kvs.lower_bound(prefix);
         it != store_->kvs.end() && it->first.starts_with(prefix); ++it) {
      r.kvs.push_back(it->second);
    }
    return r;
  }

  Result<int64_t> put(std::string_view key, std::string_view value, int64_t lease,
                      std::optional<int64_t> expected_mod_revision,
                      Clock::time_point deadline) override {
    auto l = Enter(deadline);
    if (!l.owns_lock()) return Unreachable();
    Store& s = *store_;
    auto it = s.kvs.find(key);
    if (expected_mod_revision.has_value()) {
      int64_t have = it == s.kvs.end() ? 0 : it->second.mod_revision;
      if (have != *expected_mod_revision) {
        return Status::FailedPrecondition("key '" + std::string(key) + "' is at revision " +
                                          std::to_string(have) + ", not " +
                                          std::to_string(*expected_mod_revision));
      }
    }
    Lease* bound = nullptr;
    if (lease != 0) {
      auto li = s.leases.find(lease);
      if (li == s.leases.end()) {
        return Status::NotFound("lease " + std::to_string(lease) + " not found");
      }
      bound = &li->second;
    }
    int64_t rev = ++s.revision;
    if (it == s.kvs.end()) {
      BackendKv kv;
      kv.key = std::string(key);
      kv.create_revision = rev;
      it = s.kvs.emplace(kv.key, std::move(kv)).first;
    } else if (it->second.lease != 0 && it->second.lease != lease) {
      // Rebinding: the old lease's end must no longer delete this key.
      auto old = s.leases.find(it->second.lease);
      if (old != s.leases.end()) old->second.keys.erase(it->first);
    }
    it->second.value = std::string(value);
    it->second.mod_revision = rev;
    it->second.lease = lease;
    if (bound != nullptr) bound->keys.insert(it->first);
    BackendEvent ev;
    ev.kv = it->second;
    s.AppendLocked(std::move(ev));
    s.changed.notify_all();
    return rev;
  }

  Result<int64_t> remove(std::string_view key, Clock::time_point deadline) override {
    auto l = Enter(deadline);
    if (!l.owns_lock()) return Unreachable();
    Store& s = *store_;
    auto it = s.kvs.find(key);
    if (it == s.kvs.end()) return Status::NotFound("key '" + std::string(key) + "' not found");
    if (it->second.lease != 0) {
      auto li = s.leases.find(it->second.lease);
      if (li != s.leases.end()) li->second.keys.erase(it->first);
    }
    int64_t rev = ++s.revision;
    s.AppendDeleteLocked(it->first, rev);
    s.kvs.erase(it);
    s.changed.notify_all();
    return rev;
  }

  Result<int64_t> txn(const std::vector<BackendCompare>& compares,
                      const std::vector<BackendOp>& ops, Clock::time_point deadline) override {
    auto l = Enter(deadline);
    if (!l.owns_lock()) return Unreachable();
    Store& s = *store_;
    for (const BackendCompare& c : compares) {
      auto it = s.kvs.find(c.key);
      bool holds =
          c.value ? (it != s.kvs.end() && it->second.value == *c.value) : it == s.kvs.end();
      if (!holds)
        return Status::FailedPrecondition(
            "txn: key '" + c.key + "' is " + (it == s.kvs.end() ? "absent" : "present") +
            (c.value ? ", not the expected value" : "") + "; nothing written");
    }
    // Like etcd: the whole transaction is one revision (watchers see its events together).
    int64_t rev = ++s.revision;
    for (const BackendOp& op : ops) {
      auto it = s.kvs.find(op.key);
      if (it != s.kvs.end() && it->second.lease != 0) {
        auto li = s.leases.find(it->second.lease);
        if (li != s.leases.end()) li->second.keys.erase(it->first);
      }
      if (op.remove) {
        if (it == s.kvs.end()) continue;
        s.AppendDeleteLocked(it->first, rev);
        s.kvs.erase(it);
        continue;
      }
      if (it == s.kvs.end()) {
        BackendKv kv;
        kv.key = op.key;
        kv.create_revision = rev;
        it = s.kvs.emplace(kv.key, std::move(kv)).first;
      }
      it->second.value = op.value;
      it->second.mod_revision = rev;
      it->second.lease = 0;
      BackendEvent ev;
      ev.kv = it->second;
      s.AppendLocked(std::move(ev));
    }
    s.changed.notify_all();
    return rev;
  }

  Result<int64_t> revision(Clock::time_point deadline) override {
    auto l = Enter(deadline);
    if (!l.owns_lock()) return Unreachable();
    return store_->revision;
  }

  Result<int64_t> lease_grant(milliseconds ttl, Clock::time_point deadline) override {
    auto l = Enter(deadline);
    if (!l.owns_lock()) return Unreachable();
    ttl = std::max(ttl, milliseconds(1));
    int64_t id = store_->next_lease++;
    Lease& lease = store_->leases[id];
    lease.ttl = ttl;
    lease.expiry = Clock::now() + ttl;
    store_->NotifyTimer();  // it may be sleeping past this lease's expiry
    return id;
  }

  Result<milliseconds> lease_keepalive(int64_t lease, Clock::time_point deadline) override {
    auto l = Enter(deadline);
    if (!l.owns_lock()) return Unreachable();
    auto it = store_->leases.find(lease);
    if (it == store_->leases.end()) return LeaseGone(lease);
    it->second.expiry = Clock::now() + it->second.ttl;
    return it->second.ttl;
  }

  Result<milliseconds> lease_time_left(int64_t lease, Clock::time_point deadline) override {
    auto l = Enter(deadline);
    if (!l.owns_lock()) return Unreachable();
    auto it = store_->leases.find(lease);
    if (it == store_->leases.end()) return LeaseGone(lease);
    auto left = std::chrono::duration_cast<milliseconds>(it->second.expiry - Clock::now());
    return std::max(left, milliseconds(0));
  }

  Status lease_revoke(int64_t lease, Clock::time_point deadline) override {
    auto l = Enter(deadline);
    if (!l.owns_lock()) return Unreachable();
    auto it = store_->leases.find(lease);
    if (it == store_->leases.end()) return LeaseGone(lease);
    Lease gone = std::move(it->second);
    store_->leases.erase(it);
    store_->DeleteLeaseKeysLocked(gone);
    return Status::OK();
  }

  Result<std::unique_ptr<ClusterWatch>> watch(std::string_view prefix, int64_t from_revision,
                                              BackendWatchCallback on_events,
                                              ClusterWatchErrorCallback on_error) override {
    if (!on_events) return Status::InvalidArgument("watch without a callback");
    auto state = std::make_shared<MemoryWatch::State>();
    state->store = store_;
    state->prefix = std::string(prefix);
    state->on_events = std::move(on_events);
    state->on_error = std::move(on_error);
    {
      auto l = Enter(Clock::now());
      if (!l.owns_lock()) return Unreachable();
      state->next_revision = from_revision > 0 ? from_revision : store_->revision + 1;
    }
    state->thread = std::thread([state] { state->Run(state); });
    return std::unique_ptr<ClusterWatch>(std::make_unique<MemoryWatch>(state));
  }

 private:
  // Locks the store and expires due leases. Returns an unlocked lock if the store is
  // "unreachable" (after sleeping until the deadline if it is set to hang).
  std::unique_lock<std::mutex> Enter(Clock::time_point deadline) {
    std::unique_lock l(store_->mu);
    if (store_->available) {
      store_->ExpireDueLocked(Clock::now());
      return l;
    }
    bool hang = store_->hang;
    l.unlock();
    if (hang) std::this_thread::sleep_until(deadline);
    return l;
  }

  Status Unreachable() const {
    return Status::Unavailable("memory://" + store_->name() + " is unavailable (test outage)");
  }

  static Status LeaseGone(int64_t lease) {
    return Status::NotFound("lease " + std::to_string(lease) + " not found (expired or revoked)");
  }

  std::shared_ptr<Store> store_;
};

}  // namespace

Result<std::unique_ptr<ClusterBackend>> OpenMemoryBackend(std::string_view name,
                                                          const ClusterOptions& options) {
  (void)options;  // nothing to configure: no network, no TLS
  if (name.empty()) return Status::InvalidArgument("memory:// store name is empty");
  return std::unique_ptr<ClusterBackend>(std::make_unique<MemoryBackend>(FindOrCreateStore(name)));
}

void SetMemoryStoreAvailable(std::string_view name, bool available, bool hang) {
  auto s = FindStore(name);
  if (!s) return;
  {
    std::lock_guard l(s->mu);
    s->available = available;
    s->hang = hang;
  }
  s->changed.notify_all();
}

void CompactMemoryStore(std::string_view name, int64_t revision) {
  auto s = FindStore(name);
  if (!s) return;
  std::lock_guard l(s->mu);
  s->CompactLocked(revision);
}

}  // namespace farmem::cluster
