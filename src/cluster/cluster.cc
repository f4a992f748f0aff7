// Cluster: namespacing, validation, membership (lease, keepalive, re-join after an outage) and
// watches on a ClusterBackend. Threads: any caller; a keepalive thread while joined; watch()
// callbacks on the backend's watch threads, watch_members() callbacks on one thread of its own.
#include "farmem/cluster.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>

#include "cluster/backend.h"
#include "cluster/cluster_url.h"
#include "cluster/member_codec.h"
#include "common/log.h"

namespace farmem {

using cluster::BackendEvent;
using cluster::BackendKv;
using cluster::Clock;
using cluster::MemberRecord;
using cluster::MemberState;
using std::chrono::milliseconds;

namespace {

// Strict UTF-8 (RFC 3629): no overlong forms, no surrogates, nothing above U+10FFFF.
bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    size_t n;
    uint32_t cp;
    uint32_t min;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3, cp = c & 0x07, min = 0x10000;
    } else {
      return false;  // a continuation byte first, or 0xF8..0xFF
    }
    if (s.size() - i - 1 < n) return false;
    for (size_t k = 1; k <= n; ++k) {
      auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

Status ValidateValue(std::string_view value) {
  if (value.size() > kClusterMaxValueBytes) {
    return Status::InvalidArgument("value of " + std::to_string(value.size()) +
                                   " bytes exceeds the limit of " +
                                   std::to_string(kClusterMaxValueBytes));
  }
  return Status::OK();
}

// A watch prefix or list prefix: "" (everything) or what a key may be.
Status ValidatePrefix(std::string_view prefix) {
  return prefix.empty() ? Status::OK() : ValidateClusterKey(prefix);
}

Status ValidateMemberName(std::string_view name) {
  if (cluster::IsValidName(name)) return Status::OK();
  return Status::InvalidArgument("member name '" + std::string(name) +
                                 "' is not [A-Za-z0-9_.-]{1,64}");
}

ClusterKeyValue ToPublic(const BackendKv& kv, size_t strip) {
  ClusterKeyValue out;
  out.key = kv.key.substr(std::min(strip, kv.key.size()));
  out.value = kv.value;
  out.create_revision = kv.create_revision;
  out.mod_revision = kv.mod_revision;
  out.bound_to_lease = kv.lease != 0;
  return out;
}

int64_t UnixMs() {
  return std::chrono::duration_cast<milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// What a user-facing watch handle and the callbacks share. The callbacks hold only the gate, so
// there is no cycle (state -> backend watch -> callback -> state).
struct WatchGate {
  std::atomic<bool> cancelled{false};
  // The thread running a user callback now (default id: none). Callbacks of one watch never
  // overlap, so one slot is enough.
  std::atomic<std::thread::id> callback_thread{};

  bool InCallback() const { return callback_thread.load() == std::this_thread::get_id(); }

  // Runs `f` as a user callback unless the watch was cancelled.
  template <typename F>
  void Call(F&& f) {
    if (cancelled.load()) return;
    callback_thread.store(std::this_thread::get_id());
    f();
    callback_thread.store(std::thread::id{});
  }
};

// Outlives the Cluster if the user keeps the handle: cancel() after the Cluster is gone is a no-op.
struct WatchShared {
  std::shared_ptr<WatchGate> gate = std::make_shared<WatchGate>();
  std::mutex mu;  // held for the whole of an outside cancel, so a second canceller waits too
  std::unique_ptr<ClusterWatch> backend_watch;
  // watch_members only: our own delivery thread and how to make it stop (set before it starts).
  std::thread delivery_thread;
  std::function<void()> stop_delivery;

  ~WatchShared() {
    if (stop_delivery) stop_delivery();
    if (!delivery_thread.joinable()) return;
    if (delivery_thread.get_id() == std::this_thread::get_id()) {
      delivery_thread.detach();  // destroyed from its own callback: it ends on its own
    } else {
      delivery_thread.join();
    }
  }

  void Cancel() {
    gate->cancelled.store(true);  // from here no user callback starts
    if (stop_delivery) stop_delivery();
    if (gate->InCallback()) {
      // From inside our own callback: the backend must not wait for it, and an outside canceller
      // may hold mu while it waits for this very callback, so never block on mu here. The
      // backend's cancel from its own callback thread returns at once; from our delivery thread
      // it waits only for a queue push.
      std::unique_lock l(mu, std::try_to_lock);
      if (l.owns_lock() && backend_watch) backend_watch->cancel();
      return;
    }
    std::lock_guard l(mu);
    if (backend_watch) {
      backend_watch->cancel();  // waits for a running callback
      backend_watch.reset();
    }
    if (delivery_thread.joinable()) delivery_thread.join();
  }
};

class WatchHandle final : public ClusterWatch {
 public:
  explicit WatchHandle(std::shared_ptr<WatchShared> shared) : shared_(std::move(shared)) {}
  ~WatchHandle() override { shared_->Cancel(); }
  void cancel() override { shared_->Cancel(); }

 private:
  std::shared_ptr<WatchShared> shared_;
};

}  // namespace

Status ValidateClusterKey(std::string_view key) {
  if (key.empty()) return Status::InvalidArgument("key is empty");
  if (key.size() > kClusterMaxKeyBytes) {
    return Status::InvalidArgument("key of " + std::to_string(key.size()) +
                                   " bytes exceeds the limit of " +
                                   std::to_string(kClusterMaxKeyBytes));
  }
  if (key.find('\0') != std::string_view::npos) return Status::InvalidArgument("key contains NUL");
  if (!IsValidUtf8(key)) return Status::InvalidArgument("key is not valid UTF-8");
  return Status::OK();
}

struct Cluster::Impl {
  ClusterOptions options;
  std::unique_ptr<cluster::ClusterBackend> backend;
  std::string root;            // "/farmem/<cluster>/"
  std::string cluster_key;     // root + "cluster"
  std::string members_prefix;  // root + "members/"
  std::string meta_prefix;     // root + "meta/"

  std::atomic<uint64_t> calls{0};
  std::atomic<uint64_t> failures{0};
  std::atomic<uint64_t> keepalives{0};
  std::atomic<uint64_t> keepalive_failures{0};
  std::atomic<uint64_t> rejoins{0};
  std::atomic<uint64_t> watches_opened{0};

  // join/leave one at a time (they talk to the store; mu is never held across a backend call).
  std::mutex membership_mu;

  mutable std::mutex mu;  // everything below
  bool joined = false;
  ClusterMember self;
  int64_t lease = 0;
  // Keys put with bind_to_lease (relative key -> value): written again after a re-join.
  std::map<std::string, std::string, std::less<>> bound_keys;
  bool keepalive_stop = false;
  std::condition_variable keepalive_cv;
  std::thread keepalive_thread;
  std::vector<std::weak_ptr<WatchShared>> watches;

  Clock::time_point Deadline() const { return Clock::now() + options.call_timeout; }

  // Counts a call and, if the store failed it, a failure (NotFound, FailedPrecondition and
  // InvalidArgument are answers, not failures).
  void Count(const Status& st) {
    calls.fetch_add(1);
    if (!st.ok() && st.code() != Code::kNotFound && st.code() != Code::kFailedPrecondition &&
        st.code() != Code::kInvalidArgument) {
      failures.fetch_add(1);
    }
  }
  template <typename T>
  Result<T> Count(Result<T> r) {
    Count(r.ok() ? Status::OK() : r.status());
    return r;
  }

  // Under mu. (std::map::erase by a string_view is C++23.)
  void ForgetBoundKeyLocked(std::string_view key) {
    auto it = bound_keys.find(key);
    if (it != bound_keys.end()) bound_keys.erase(it);
  }

  std::string MemberKey(std::string_view name) const { return members_prefix + std::string(name); }

  milliseconds KeepaliveInterval() const {
    return std::clamp(options.lease_ttl / 3, milliseconds(10), milliseconds(60000));
  }
  // Between attempts while the store is unreachable: as often as renewals, but at most every 1 s
  // apart so a long TTL still notices the store's return promptly.
  milliseconds RetryInterval() const { return std::min(KeepaliveInterval(), milliseconds(1000)); }
  // A renewal that takes longer than this is as good as lost: the lease would be in danger.
  Clock::time_point KeepaliveDeadline() const {
    return Clock::now() +
           std::min(options.call_timeout, std::max(options.lease_ttl / 2, milliseconds(50)));
  }

  void KeepaliveLoop();
  bool Rejoin(int64_t lease_id);
  void StopKeepalive();
  Result<int64_t> PutImpl(std::string_view key, std::string_view value,
                          std::optional<int64_t> expected, const ClusterPutOptions& opts);
  std::shared_ptr<WatchShared> NewWatch();
};

void Cluster::Impl::KeepaliveLoop() {
  bool need_rejoin = false;
  milliseconds wait = KeepaliveInterval();
  std::unique_lock l(mu);
  while (true) {
    keepalive_cv.wait_for(l, wait, [&] { return keepalive_stop; });
    if (keepalive_stop) return;
    int64_t id = lease;
    l.unlock();
    bool ok;
    if (need_rejoin) {
      ok = Rejoin(id);
      need_rejoin = !ok;
    } else {
      auto r = backend->lease_keepalive(id, KeepaliveDeadline());
      ok = r.ok();
      if (ok) {
        keepalives.fetch_add(1);
      } else {
        keepalive_failures.fetch_add(1);
        if (r.status().code() == Code::kNotFound) {
          // The lease ran out while the store was unreachable (or someone revoked it): our member
          // key and bound keys are gone; come back with a new lease.
          FARMEM_LOG_WARN("cluster {}: lease of member '{}' is gone; re-joining",
                          options.cluster_name, self.name);
          ok = Rejoin(id);
          need_rejoin = !ok;
        } else {
          FARMEM_LOG_DEBUG("cluster {}: keepalive failed: {}", options.cluster_name,
                           r.status().ToString());
        }
      }
    }
    l.lock();
    wait = ok ? KeepaliveInterval() : RetryInterval();
  }
}

// Grants a new lease (unless `old_lease` was already replaced by an earlier partial attempt whose
// lease still lives), writes the member key and every bound key again. False: try again later.
bool Cluster::Impl::Rejoin(int64_t old_lease) {
  int64_t id = old_lease;
  if (!backend->lease_time_left(id, KeepaliveDeadline()).ok()) {
    auto granted = backend->lease_grant(options.lease_ttl, Deadline());
    if (!granted.ok()) return false;
    id = *granted;
  }
  std::map<std::string, std::string, std::less<>> keys;
  ClusterMember me;
  {
    std::lock_guard l(mu);
    lease = id;
    keys = bound_keys;
    me = self;
  }
  // Only where the name is free or ours (an earlier partial attempt): never over another member.
  std::string key = MemberKey(me.name);
  auto cur = backend->get(key, Deadline());
  std::optional<int64_t> expected;
  if (cur.ok()) {
    if (cur->lease != id) {
      FARMEM_LOG_WARN("cluster {}: cannot re-join as '{}': the name is held by another lease",
                      options.cluster_name, me.name);
      return false;
    }
    expected = cur->mod_revision;
  } else if (cur.status().code() == Code::kNotFound) {
    expected = 0;
  } else {
    return false;
  }
  if (!backend->put(key, cluster::EncodeMember(me, MemberState::kUp), id, expected, Deadline())
           .ok()) {
    return false;
  }
  for (const auto& [k, v] : keys) {
    {
      // Removed (or rewritten unbound) since the snapshot: do not bring it back.
      std::lock_guard l(mu);
      auto it = bound_keys.find(k);
      if (it == bound_keys.end() || it->second != v) continue;
    }
    if (!backend->put(meta_prefix + k, v, id, std::nullopt, Deadline()).ok()) return false;
  }
  rejoins.fetch_add(1);
  FARMEM_LOG_INFO("cluster {}: member '{}' re-joined with lease {:x}", options.cluster_name,
                  me.name, id);
  return true;
}

void Cluster::Impl::StopKeepalive() {
  std::thread t;
  {
    std::lock_guard l(mu);
    keepalive_stop = true;
    t = std::move(keepalive_thread);
  }
  keepalive_cv.notify_all();
  if (t.joinable()) t.join();
}

Result<int64_t> Cluster::Impl::PutImpl(std::string_view key, std::string_view value,
                                       std::optional<int64_t> expected,
                                       const ClusterPutOptions& opts) {
  FARMEM_RETURN_IF_ERROR(ValidateClusterKey(key));
  FARMEM_RETURN_IF_ERROR(ValidateValue(value));
  std::string abs = meta_prefix + std::string(key);
  if (!opts.bind_to_lease) {
    auto r = Count(backend->put(abs, value, 0, expected, Deadline()));
    if (r.ok()) {
      std::lock_guard l(mu);
      ForgetBoundKeyLocked(key);  // no longer bound: a re-join must not rewrite it
    }
    return r;
  }
  // Bound: if the keepalive thread replaces the lease while we write, write again with the new
  // one (our write may have gone with the old lease, after the re-join's snapshot of bound keys).
  for (int attempt = 0; attempt < 3; ++attempt) {
    int64_t id;
    {
      std::lock_guard l(mu);
      if (!joined) {
        return Status::FailedPrecondition("bind_to_lease needs a membership: join() first");
      }
      id = lease;
    }
    auto r =
        Count(backend->put(abs, value, id, attempt == 0 ? expected : std::nullopt, Deadline()));
    std::lock_guard l(mu);
    if (!r.ok()) {
      if (r.status().code() == Code::kNotFound && lease != id) continue;
      return r;
    }
    bound_keys[std::string(key)] = std::string(value);
    if (lease == id) return r;
  }
  return Status::Unavailable("the membership lease kept changing while writing '" +
                             std::string(key) + "'");
}

std::shared_ptr<WatchShared> Cluster::Impl::NewWatch() {
  auto w = std::make_shared<WatchShared>();
  std::lock_guard l(mu);
  std::erase_if(watches, [](const auto& p) { return p.expired(); });
  watches.push_back(w);
  watches_opened.fetch_add(1);
  return w;
}

Cluster::Cluster(ClusterOptions options, std::unique_ptr<Impl> impl)
    : options_(std::move(options)), impl_(std::move(impl)) {}

Cluster::~Cluster() {
  if (!impl_) return;
  Status st = leave();
  if (!st.ok()) {
    FARMEM_LOG_WARN("cluster {}: leave at close: {}", options_.cluster_name, st.ToString());
  }
  std::vector<std::shared_ptr<WatchShared>> live;
  {
    std::lock_guard l(impl_->mu);
    for (auto& w : impl_->watches) {
      if (auto s = w.lock()) live.push_back(std::move(s));
    }
    impl_->watches.clear();
  }
  for (auto& w : live) w->Cancel();
}

Result<std::unique_ptr<Cluster>> Cluster::Open(const ClusterOptions& options) {
  if (!cluster::IsValidName(options.cluster_name)) {
    return Status::InvalidArgument("cluster name '" + options.cluster_name +
                                   "' is not [A-Za-z0-9_.-]{1,64}");
  }
  if (options.lease_ttl <= milliseconds(0) || options.call_timeout <= milliseconds(0)) {
    return Status::InvalidArgument("lease_ttl and call_timeout must be positive");
  }
  FARMEM_ASSIGN_OR_RETURN(auto backend, cluster::OpenBackendForUrl(options.url, options));
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->backend = std::move(backend);
  impl->root = "/farmem/" + options.cluster_name + "/";
  impl->cluster_key = impl->root + "cluster";
  impl->members_prefix = impl->root + "members/";
  impl->meta_prefix = impl->root + "meta/";
  auto rev = impl->backend->revision(impl->Deadline());
  if (!rev.ok()) {
    return Status::Unavailable("cluster store at " + options.url + " unreachable within " +
                               std::to_string(options.call_timeout.count()) +
                               " ms: " + rev.status().ToString());
  }
  auto existing = impl->backend->get(impl->cluster_key, impl->Deadline());
  if (!existing.ok() && existing.status().code() != Code::kNotFound) {
    return existing.status().WithContext("opening cluster '" + options.cluster_name + "' at " +
                                         options.url);
  }
  if (!existing.ok()) {
    if (options.create_if_missing) {
      auto created = impl->backend->put(impl->cluster_key, cluster::EncodeClusterRecord(UnixMs()),
                                        0, 0, impl->Deadline());
      // FailedPrecondition: someone else created it at the same time; as good.
      if (!created.ok() && created.status().code() != Code::kFailedPrecondition) {
        return created.status().WithContext("creating cluster '" + options.cluster_name + "'");
      }
    } else {
      std::string names;
      auto all = impl->backend->range("/farmem/", impl->Deadline());
      if (all.ok()) {
        for (const auto& kv : all->kvs) {
          std::string_view k = kv.key;
          k.remove_prefix(8);  // "/farmem/"
          size_t slash = k.find('/');
          if (slash != std::string_view::npos && k.substr(slash) == "/cluster") {
            if (!names.empty()) names += ", ";
            names += std::string(k.substr(0, slash));
          }
        }
      }
      if (names.empty()) names = all.ok() ? "none" : "unknown (" + all.status().ToString() + ")";
      return Status::NotFound("no cluster '" + options.cluster_name + "' at " + options.url +
                              "; clusters there: " + names);
    }
  }
  return std::unique_ptr<Cluster>(new Cluster(options, std::move(impl)));
}

Status Cluster::join(const ClusterMember& self) {
  Impl& d = *impl_;
  FARMEM_RETURN_IF_ERROR(ValidateMemberName(self.name));
  std::string value = cluster::EncodeMember(self, MemberState::kUp);
  if (value.size() > kClusterMaxValueBytes) return ValidateValue(value);
  std::lock_guard m(d.membership_mu);
  {
    std::lock_guard l(d.mu);
    if (d.joined) {
      return Status::FailedPrecondition("already joined as '" + d.self.name + "': leave() first");
    }
  }
  auto lease = d.Count(d.backend->lease_grant(d.options.lease_ttl, d.Deadline()));
  if (!lease.ok()) return lease.status().WithContext("join: granting the membership lease");
  std::string key = d.MemberKey(self.name);
  auto put = d.Count(d.backend->put(key, value, *lease, 0, d.Deadline()));
  if (!put.ok()) {
    (void)d.backend->lease_revoke(*lease, d.Deadline());
    if (put.status().code() == Code::kFailedPrecondition) {
      std::string from = "?";
      auto cur = d.backend->get(key, d.Deadline());
      if (cur.ok()) {
        auto rec = cluster::DecodeMember(cur->value);
        if (rec.ok()) from = rec->member.address.empty() ? "(no address)" : rec->member.address;
      }
      return Status::FailedPrecondition("member '" + self.name + "' already joined from " + from);
    }
    return put.status().WithContext("join: writing the member key");
  }
  std::lock_guard l(d.mu);
  d.joined = true;
  d.self = self;
  d.self.lease_left = milliseconds(-1);
  d.self.revision = 0;
  d.lease = *lease;
  d.bound_keys.clear();
  d.keepalive_stop = false;
  d.keepalive_thread = std::thread([&d] { d.KeepaliveLoop(); });
  return Status::OK();
}

Status Cluster::leave() {
  Impl& d = *impl_;
  std::lock_guard m(d.membership_mu);
  ClusterMember me;
  int64_t id;
  {
    std::lock_guard l(d.mu);
    if (!d.joined) return Status::OK();
    me = d.self;
  }
  // No renewal or re-join may race the goodbye.
  d.StopKeepalive();
  {
    std::lock_guard l(d.mu);
    id = d.lease;
    d.joined = false;
    d.lease = 0;
    d.bound_keys.clear();
  }
  // Whatever fails below, the membership is over here: with no keepalive the lease ends within
  // its TTL and watchers see kExpire instead of kLeave.
  Status st;
  auto marked =
      d.Count(d.backend->put(d.MemberKey(me.name), cluster::EncodeMember(me, MemberState::kLeaving),
                             id, std::nullopt, d.Deadline()));
  if (!marked.ok() && marked.status().code() != Code::kNotFound) {
    st = marked.status().WithContext("leave: marking '" + me.name + "' as leaving");
  }
  Status revoked = d.backend->lease_revoke(id, d.Deadline());
  d.Count(revoked);
  if (!revoked.ok() && revoked.code() != Code::kNotFound && st.ok()) {
    st = revoked.WithContext("leave: revoking the membership lease");
  }
  return st;
}

bool Cluster::joined() const {
  std::lock_guard l(impl_->mu);
  return impl_->joined;
}

Result<std::vector<ClusterMember>> Cluster::members() {
  Impl& d = *impl_;
  auto range = d.Count(d.backend->range(d.members_prefix, d.Deadline()));
  if (!range.ok()) return range.status();
  std::vector<ClusterMember> out;
  for (const auto& kv : range->kvs) {
    auto rec = cluster::DecodeMember(kv.value);
    if (!rec.ok() || rec->state != MemberState::kUp) continue;
    ClusterMember m = std::move(rec->member);
    m.name = kv.key.substr(d.members_prefix.size());  // the key is the authority on the name
    m.revision = kv.mod_revision;
    m.lease_left = milliseconds(-1);
    if (kv.lease != 0) {
      auto left = d.backend->lease_time_left(kv.lease, d.Deadline());
      if (left.ok()) m.lease_left = *left;
    }
    out.push_back(std::move(m));
  }
  std::sort(out.begin(), out.end(),
            [](const ClusterMember& a, const ClusterMember& b) { return a.name < b.name; });
  return out;
}

namespace {

// The membership view of one watch_members: name -> last known record, turned into join /
// leave / expire events. The backend's callback only queues (so cancelling from a user callback
// never waits on a backend callback that waits on us); our delivery thread translates and calls
// the user, snapshot first, one event at a time.
struct MemberTracker {
  std::string members_prefix;
  ClusterMemberCallback on_event;
  ClusterWatchErrorCallback on_error;
  std::shared_ptr<WatchGate> gate;
  std::vector<ClusterMemberEvent> snapshot;  // the kJoin of every member up at the start
  std::map<std::string, MemberRecord, std::less<>> known;  // delivery thread only

  std::mutex mu;  // guards the queue
  std::condition_variable cv;
  std::deque<BackendEvent> queue;
  std::optional<Status> error;
  bool stop = false;

  void Push(const std::vector<BackendEvent>& events) {
    {
      std::lock_guard l(mu);
      queue.insert(queue.end(), events.begin(), events.end());
    }
    cv.notify_all();
  }
  void PushError(const Status& st) {
    {
      std::lock_guard l(mu);
      if (!error) error = st;
    }
    cv.notify_all();
  }
  void Stop() {
    {
      std::lock_guard l(mu);
      stop = true;
    }
    cv.notify_all();
  }

  void Run() {
    for (const auto& ev : snapshot) gate->Call([&] { on_event(ev); });
    snapshot.clear();
    std::unique_lock l(mu);
    while (true) {
      cv.wait_for(l, std::chrono::milliseconds(200),
                  [&] { return stop || !queue.empty() || error.has_value(); });
      if (stop || gate->cancelled.load()) return;
      std::deque<BackendEvent> batch;
      batch.swap(queue);
      std::optional<Status> err = error;
      l.unlock();
      for (const auto& e : batch) Translate(e);
      if (err) {
        // The backend reports an error after its last events (all in this batch) and stops.
        if (on_error) gate->Call([&] { on_error(*err); });
        return;
      }
      l.lock();
    }
  }

  void Translate(const BackendEvent& e) {
    std::string_view name = std::string_view(e.kv.key).substr(members_prefix.size());
    if (name.empty() || name.find('/') != std::string_view::npos) return;
    auto it = known.find(name);
    ClusterMemberEvent out;
    out.revision = e.kv.mod_revision;
    if (e.is_delete) {
      if (it == known.end()) return;
      bool was_up = it->second.state == MemberState::kUp;
      out.member = std::move(it->second.member);
      known.erase(it);
      if (!was_up) return;  // it said goodbye: kLeave went out then
      out.type = ClusterMemberEvent::Type::kExpire;
    } else {
      auto rec = cluster::DecodeMember(e.kv.value);
      if (!rec.ok()) return;  // not a member record: nothing we can report
      rec->member.name = std::string(name);
      rec->member.revision = e.kv.mod_revision;
      bool was_up = it != known.end() && it->second.state == MemberState::kUp;
      MemberState now = rec->state;
      out.member = rec->member;
      known[std::string(name)] = std::move(*rec);
      if (now == MemberState::kUp) {
        if (was_up) return;  // rewritten while up (e.g. a re-join over its own key)
        out.type = ClusterMemberEvent::Type::kJoin;
      } else {
        if (!was_up) return;
        out.type = ClusterMemberEvent::Type::kLeave;
      }
    }
    gate->Call([&] { on_event(out); });
  }
};

}  // namespace

Result<std::unique_ptr<ClusterWatch>> Cluster::watch_members(ClusterMemberCallback on_event,
                                                             ClusterWatchErrorCallback on_error) {
  Impl& d = *impl_;
  if (!on_event) return Status::InvalidArgument("watch_members without a callback");
  auto range = d.Count(d.backend->range(d.members_prefix, d.Deadline()));
  if (!range.ok()) return range.status();
  auto shared = d.NewWatch();
  auto tracker = std::make_shared<MemberTracker>();
  tracker->members_prefix = d.members_prefix;
  tracker->on_event = std::move(on_event);
  tracker->on_error = std::move(on_error);
  tracker->gate = shared->gate;
  for (const auto& kv : range->kvs) {
    std::string name = kv.key.substr(d.members_prefix.size());
    if (name.empty() || name.find('/') != std::string::npos) continue;
    auto rec = cluster::DecodeMember(kv.value);
    if (!rec.ok()) continue;
    rec->member.name = name;
    rec->member.revision = kv.mod_revision;
    if (rec->state == MemberState::kUp) {
      ClusterMemberEvent ev;
      ev.type = ClusterMemberEvent::Type::kJoin;
      ev.member = rec->member;
      ev.revision = kv.mod_revision;
      tracker->snapshot.push_back(std::move(ev));
    }
    tracker->known[name] = std::move(*rec);
  }
  // From the revision after the snapshot: nothing between the two is missed or repeated.
  auto bw = d.Count(d.backend->watch(
      d.members_prefix, range->revision + 1,
      [tracker](const std::vector<BackendEvent>& events) { tracker->Push(events); },
      [tracker](const Status& st) { tracker->PushError(st); }));
  if (!bw.ok()) return bw.status();
  std::lock_guard l(shared->mu);  // a callback that cancels finds the handle complete
  shared->backend_watch = std::move(*bw);
  shared->stop_delivery = [tracker] { tracker->Stop(); };
  // The user's callbacks run on this thread of ours, never on the caller's (which may hold locks
  // the callback takes).
  shared->delivery_thread = std::thread([tracker] { tracker->Run(); });
  return std::unique_ptr<ClusterWatch>(std::make_unique<WatchHandle>(std::move(shared)));
}

Result<ClusterKeyValue> Cluster::get(std::string_view key) {
  Impl& d = *impl_;
  FARMEM_RETURN_IF_ERROR(ValidateClusterKey(key));
  auto r = d.Count(d.backend->get(d.meta_prefix + std::string(key), d.Deadline()));
  if (!r.ok()) return r.status();
  return ToPublic(*r, d.meta_prefix.size());
}

Result<int64_t> Cluster::put(std::string_view key, std::string_view value,
                             const ClusterPutOptions& options) {
  return impl_->PutImpl(key, value, std::nullopt, options);
}

Result<int64_t> Cluster::put_if(std::string_view key, std::string_view value,
                                int64_t expected_revision, const ClusterPutOptions& options) {
  if (expected_revision < 0) {
    return Status::InvalidArgument("expected_revision " + std::to_string(expected_revision) +
                                   " is negative");
  }
  return impl_->PutImpl(key, value, expected_revision, options);
}

Status Cluster::remove(std::string_view key) {
  Impl& d = *impl_;
  FARMEM_RETURN_IF_ERROR(ValidateClusterKey(key));
  auto r = d.Count(d.backend->remove(d.meta_prefix + std::string(key), d.Deadline()));
  if (r.ok() || r.status().code() == Code::kNotFound) {
    std::lock_guard l(d.mu);
    d.ForgetBoundKeyLocked(key);
  }
  return r.ok() ? Status::OK() : r.status();
}

Result<int64_t> Cluster::commit(const std::vector<ClusterCompare>& compares,
                                const std::vector<ClusterOp>& ops) {
  Impl& d = *impl_;
  // etcd's default --max-txn-ops is 128; stay well inside it.
  if (ops.empty() || ops.size() > 64 || compares.size() > 64)
    return Status::InvalidArgument("commit: 1..64 ops and at most 64 compares");
  std::vector<cluster::BackendCompare> cmp;
  for (const ClusterCompare& c : compares) {
    FARMEM_RETURN_IF_ERROR(ValidateClusterKey(c.key));
    if (c.value) FARMEM_RETURN_IF_ERROR(ValidateValue(*c.value));
    cmp.push_back({d.meta_prefix + c.key, c.value});
  }
  std::vector<cluster::BackendOp> bops;
  std::set<std::string_view> seen;
  for (const ClusterOp& op : ops) {
    FARMEM_RETURN_IF_ERROR(ValidateClusterKey(op.key));
    if (op.type == ClusterOp::Type::kPut) FARMEM_RETURN_IF_ERROR(ValidateValue(op.value));
    // etcd refuses a txn that names a key twice ("duplicate key given in txn request").
    if (!seen.insert(op.key).second)
      return Status::InvalidArgument("commit: key '" + op.key + "' given twice");
    bops.push_back({op.type == ClusterOp::Type::kRemove, d.meta_prefix + op.key, op.value});
  }
  auto r = d.Count(d.backend->txn(cmp, bops, d.Deadline()));
  if (r.ok()) {
    std::lock_guard l(d.mu);
    for (const ClusterOp& op : ops) d.ForgetBoundKeyLocked(op.key);  // unbound now
  }
  return r;
}

Result<std::vector<ClusterKeyValue>> Cluster::list(std::string_view prefix) {
  Impl& d = *impl_;
  FARMEM_RETURN_IF_ERROR(ValidatePrefix(prefix));
  auto r = d.Count(d.backend->range(d.meta_prefix + std::string(prefix), d.Deadline()));
  if (!r.ok()) return r.status();
  std::vector<ClusterKeyValue> out;
  out.reserve(r->kvs.size());
  for (const auto& kv : r->kvs) out.push_back(ToPublic(kv, d.meta_prefix.size()));
  std::sort(out.begin(), out.end(),
            [](const ClusterKeyValue& a, const ClusterKeyValue& b) { return a.key < b.key; });
  return out;
}

Result<std::unique_ptr<ClusterWatch>> Cluster::watch(std::string_view prefix, int64_t from_revision,
                                                     ClusterWatchCallback on_event,
                                                     ClusterWatchErrorCallback on_error) {
  Impl& d = *impl_;
  FARMEM_RETURN_IF_ERROR(ValidatePrefix(prefix));
  if (!on_event) return Status::InvalidArgument("watch without a callback");
  if (from_revision < 0) {
    return Status::InvalidArgument("from_revision " + std::to_string(from_revision) +
                                   " is negative");
  }
  auto shared = d.NewWatch();
  auto gate = shared->gate;
  size_t strip = d.meta_prefix.size();
  auto cb = [gate, strip, on_event = std::move(on_event)](const std::vector<BackendEvent>& evs) {
    for (const auto& e : evs) {
      ClusterWatchEvent out;
      out.type = e.is_delete ? ClusterWatchEvent::Type::kDelete : ClusterWatchEvent::Type::kPut;
      out.kv = ToPublic(e.kv, strip);
      if (e.is_delete) {
        out.kv.value.clear();
        out.kv.create_revision = 0;
        out.kv.bound_to_lease = false;
      }
      gate->Call([&] { on_event(out); });
    }
  };
  ClusterWatchErrorCallback err;
  if (on_error) {
    err = [gate, on_error = std::move(on_error)](const Status& st) {
      gate->Call([&] { on_error(st); });
    };
  }
  std::lock_guard l(shared->mu);  // a callback that cancels waits for the handle to be set
  auto bw = d.Count(d.backend->watch(d.meta_prefix + std::string(prefix), from_revision,
                                     std::move(cb), std::move(err)));
  if (!bw.ok()) return bw.status();
  shared->backend_watch = std::move(*bw);
  return std::unique_ptr<ClusterWatch>(std::make_unique<WatchHandle>(std::move(shared)));
}

Result<int64_t> Cluster::revision() {
  Impl& d = *impl_;
  return d.Count(d.backend->revision(d.Deadline()));
}

std::string Cluster::stats_json() const {
  const Impl& d = *impl_;
  bool joined;
  {
    std::lock_guard l(d.mu);
    joined = d.joined;
  }
  nlohmann::json j = {{"backend", std::string(d.backend->kind())},
                      {"cluster", d.options.cluster_name},
                      {"calls", d.calls.load()},
                      {"failures", d.failures.load()},
                      {"keepalives", d.keepalives.load()},
                      {"keepalive_failures", d.keepalive_failures.load()},
                      {"rejoins", d.rejoins.load()},
                      {"watches", d.watches_opened.load()},
                      {"joined", joined}};
  return j.dump();
}

}  // namespace farmem
