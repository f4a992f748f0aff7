// The etcd:// ClusterBackend: etcd v3 through its JSON gRPC-gateway over libcurl (docs/cluster.md
// says why not gRPC). Unary calls run on the caller's thread (pooled connections, EtcdHttp); each
// watch owns one thread holding a streaming POST /v3/watch, which resumes after the last revision
// it delivered whenever the stream breaks.
#include <curl/curl.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "cluster/backend.h"
#include "cluster/etcd_http.h"
#include "cluster/etcd_json.h"
#include "common/net/host_port.h"

namespace farmem::cluster {

namespace {

using etcdjson::Json;
using std::chrono::milliseconds;

// Watch reconnect backoff: fast enough to catch a restarted etcd quickly, capped so a dead one
// is not hammered.
constexpr milliseconds kBackoffMin{50};
constexpr milliseconds kBackoffMax{1000};
// A watch stream idle this long gets a liveness probe (a hung etcd keeps its socket open and
// just stops talking); the probe must answer within kProbeTimeout or the stream is re-opened.
constexpr milliseconds kIdleProbe{2000};
constexpr milliseconds kProbeTimeout{1000};
// How often the watch thread looks at its stop flag when nothing arrives (cancel also wakes it).
constexpr int kPollMs = 100;
// A stream message larger than this is not something etcd sends: treat the stream as broken.
constexpr size_t kMaxStreamBuffer = size_t{64} << 20;

std::string Printable(std::string_view key) {
  std::string out;
  for (unsigned char c : key.substr(0, 200)) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

// What every call shares: the HTTP pool and the auth token. Held by shared_ptr so a watch thread
// (possibly detached when cancelled from its own callback) can outlive the backend object.
class Core {
 public:
  Core(EtcdHttpConfig config, ClusterOptions options)
      : http_(std::move(config)), options_(std::move(options)) {}

  EtcdHttp& http() { return http_; }
  const ClusterOptions& options() const { return options_; }
  bool uses_auth() const { return !options_.user.empty(); }

  // The current token, authenticating first if there is none ("" without auth).
  Result<std::string> Token(Clock::time_point deadline) {
    if (!uses_auth()) return std::string();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!token_.empty()) return token_;
    }
    Json req = {{"name", options_.user}, {"password", options_.password}};
    FARMEM_ASSIGN_OR_RETURN(Json resp, Send("/v3/auth/authenticate", req.dump(), "", deadline,
                                            "authenticate as " + options_.user));
    FARMEM_ASSIGN_OR_RETURN(std::string token, etcdjson::String(resp, "token"));
    if (token.empty()) return Status::Protocol("etcd authenticate: no token in the answer");
    std::lock_guard<std::mutex> lock(mu_);
    token_ = token;
    return token;
  }

  // Forgets `token` (expired, or lost by an etcd restart) unless another thread replaced it.
  void DropToken(const std::string& token) {
    std::lock_guard<std::mutex> lock(mu_);
    if (token_ == token) token_.clear();
  }

  // One gateway call: JSON in, JSON out, errors mapped; re-authenticates once when etcd rejects
  // the token.
  Result<Json> Call(std::string_view path, const Json& body, Clock::time_point deadline,
                    const std::string& what) {
    std::string payload = body.dump();
    for (int attempt = 0;; ++attempt) {
      FARMEM_ASSIGN_OR_RETURN(std::string token, Token(deadline));
      auto r = Send(path, payload, token, deadline, what);
      if (!r.ok() && attempt == 0 && uses_auth() && IsTokenError(r.status())) {
        DropToken(token);
        continue;
      }
      return r;
    }
  }

  static bool IsTokenError(const Status& s) {
    return (s.code() == Code::kPermissionDenied || s.code() == Code::kInvalidArgument) &&
           etcdjson::IsAuthTokenError(s.message());
  }

 private:
  Result<Json> Send(std::string_view path, const std::string& payload, const std::string& token,
                    Clock::time_point deadline, const std::string& what) {
    FARMEM_ASSIGN_OR_RETURN(EtcdHttpResponse resp, http_.Post(path, payload, token, deadline));
    std::string where = what + " at " + resp.endpoint;
    auto j = etcdjson::Parse(resp.body, where);
    if (!j.ok()) {
      if (resp.status != 200) {
        return Status::Protocol("etcd " + where + ": HTTP " + std::to_string(resp.status) + ": " +
                                resp.body.substr(0, 200));
      }
      return j.status();
    }
    FARMEM_RETURN_IF_ERROR(etcdjson::ErrorOf(*j, resp.status, where));
    return j;
  }

  EtcdHttp http_;
  const ClusterOptions options_;
  std::mutex mu_;
  std::string token_;
};

// ---- watch ----------------------------------------------------------------------------------

// The state a watch thread works on; shared with the handle so the handle can stop it.
struct WatchState {
  std::shared_ptr<Core> core;
  std::string prefix;
  std::string key_b64;
  std::string range_end_b64;
  int64_t next_rev = 0;  // the first revision not delivered yet (0: not known yet)
  BackendWatchCallback on_events;
  ClusterWatchErrorCallback on_error;

  std::atomic<bool> stop{false};
  std::mutex mu;
  std::condition_variable cv;  // wakes the backoff sleep on cancel
  CURLM* multi = nullptr;      // lives as long as the state; curl_multi_wakeup is thread-safe

  // Stream bytes not yet parsed into whole messages (only the watch thread touches these).
  std::string buf;
  size_t scan = 0;  // how far `buf` was scanned for the end of the first message
  int depth = 0;    // JSON nesting at `scan`
  bool in_string = false;
  bool escaped = false;
  bool got_bytes = false;  // set by the write callback, read by the loop

  ~WatchState() {
    if (multi != nullptr) curl_multi_cleanup(multi);
  }

  void ResetParser() {
    buf.clear();
    scan = 0;
    depth = 0;
    in_string = false;
    escaped = false;
  }

  // Splits whole top-level JSON objects off the front of `buf`. The gateway ends each with a
  // newline, but a message may arrive in pieces or several in one write, so this scans for the
  // closing brace (outside strings) instead of trusting the framing.
  bool NextMessage(std::string* out) {
    while (scan < buf.size()) {
      char c = buf[scan++];
      if (in_string) {
        if (escaped) {
          escaped = false;
        } else if (c == '\\') {
          escaped = true;
        } else if (c == '"') {
          in_string = false;
        }
        continue;
      }
      if (c == '"') {
        in_string = true;
      } else if (c == '{' || c == '[') {
        ++depth;
      } else if (c == '}' || c == ']') {
        if (--depth <= 0) {
          // Skip any leading whitespace/garbage before the object: Parse rejects garbage.
          *out = buf.substr(0, scan);
          buf.erase(0, scan);
          scan = 0;
          depth = 0;
          return true;
        }
      }
    }
    return false;
  }

  void Fail(const Status& s) {
    if (stop.exchange(true)) return;
    if (on_error) on_error(s);
  }

  void Sleep(milliseconds d) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, d, [&] { return stop.load(); });
  }

  void Run();
  // kContinue: keep reading; kReconnect: abandon this stream and resume from next_rev; kStop: the
  // watch is over (cancelled, or on_error was called).
  enum class Outcome { kContinue, kReconnect, kStop };
  Outcome Stream(size_t endpoint_index, bool* created);
  Outcome Handle(const std::string& text, const std::string& endpoint, bool* created,
                 const std::string& token);
};

size_t WatchWrite(char* data, size_t size, size_t n, void* user) {
  auto* st = static_cast<WatchState*>(user);
  if (st->stop.load(std::memory_order_relaxed)) return 0;  // abort the transfer
  if (st->buf.size() + size * n > kMaxStreamBuffer) return 0;
  st->buf.append(data, size * n);
  st->got_bytes = true;
  return size * n;
}

size_t DiscardWrite(char*, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append("x");  // only "something came" matters
  return size * n;
}

void WatchState::Run() {
  const size_t n = core->http().config().endpoints.size();
  size_t endpoint = core->http().preferred() % n;
  milliseconds backoff = kBackoffMin;
  while (!stop.load()) {
    bool created = false;
    Outcome o = Stream(endpoint, &created);
    if (o == Outcome::kStop || stop.load()) break;
    // A stream that got going resets the backoff: the next break is a new incident.
    if (created) backoff = kBackoffMin;
    // Rotate: the endpoint that just failed is the least likely to answer next.
    endpoint = (endpoint + 1) % n;
    Sleep(backoff);
    backoff = std::min(backoff * 2, kBackoffMax);
  }
}

WatchState::Outcome WatchState::Stream(size_t endpoint_index, bool* created) {
  const std::string& endpoint = core->http().config().endpoints[endpoint_index];
  auto token = core->Token(Clock::now() + core->options().call_timeout);
  if (!token.ok()) {
    if (token.status().code() == Code::kPermissionDenied) {
      Fail(token.status().WithContext("etcd watch of " + Printable(prefix)));
      return Outcome::kStop;
    }
    return Outcome::kReconnect;
  }
  Json create = {{"key", key_b64}, {"range_end", range_end_b64}};
  if (next_rev > 0) create["start_revision"] = std::to_string(next_rev);
  std::string body = Json{{"create_request", create}}.dump();
  std::string url = EtcdUrl(core->http().config(), endpoint, "/v3/watch");
  std::string probe_url = EtcdUrl(core->http().config(), endpoint, "/v3/maintenance/status");

  curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  std::string auth = "Authorization: " + *token;
  if (!token->empty()) headers = curl_slist_append(headers, auth.c_str());
  CURL* easy = curl_easy_init();
  if (easy == nullptr) {
    curl_slist_free_all(headers);
    return Outcome::kReconnect;
  }
  ResetParser();
  curl_easy_setopt(easy, CURLOPT_URL, url.c_str());
  curl_easy_setopt(easy, CURLOPT_POST, 1L);
  curl_easy_setopt(easy, CURLOPT_POSTFIELDS, body.data());
  curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  curl_easy_setopt(easy, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, WatchWrite);
  curl_easy_setopt(easy, CURLOPT_WRITEDATA, this);
  curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(core->options().call_timeout.count()));
  curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(easy, CURLOPT_TCP_KEEPALIVE, 1L);
  EtcdApplyTls(core->http().config(), easy);
  curl_multi_add_handle(multi, easy);

  CURL* probe = nullptr;
  std::string probe_body;
  auto last_activity = Clock::now();
  Outcome outcome = Outcome::kReconnect;
  bool done = false;
  while (!done && !stop.load()) {
    int running = 0;
    if (curl_multi_perform(multi, &running) != CURLM_OK) break;
    if (got_bytes) {
      got_bytes = false;
      last_activity = Clock::now();
    }
    std::string text;
    while (!done && NextMessage(&text)) {
      Outcome o = Handle(text, endpoint, created, *token);
      if (o == Outcome::kStop || stop.load()) {
        outcome = Outcome::kStop;
        done = true;
      } else if (o == Outcome::kReconnect) {
        done = true;
      }
    }
    if (done) break;
    int queued = 0;
    while (CURLMsg* m = curl_multi_info_read(multi, &queued)) {
      if (m->msg != CURLMSG_DONE) continue;
      if (m->easy_handle == easy) {
        done = true;  // the stream ended: etcd went away, or the connection broke
      } else if (m->easy_handle == probe) {
        long status = 0;
        curl_easy_getinfo(probe, CURLINFO_RESPONSE_CODE, &status);
        bool alive = m->data.result == CURLE_OK && status == 200 && !probe_body.empty();
        curl_multi_remove_handle(multi, probe);
        curl_easy_cleanup(probe);
        probe = nullptr;
        if (alive) {
          last_activity = Clock::now();
        } else {
          done = true;  // etcd does not answer: re-open the stream (elsewhere if possible)
        }
      }
    }
    if (done) break;
    if (probe == nullptr && Clock::now() - last_activity > kIdleProbe) {
      probe_body.clear();
      probe = curl_easy_init();
      if (probe != nullptr) {
        curl_easy_setopt(probe, CURLOPT_URL, probe_url.c_str());
        curl_easy_setopt(probe, CURLOPT_POST, 1L);
        curl_easy_setopt(probe, CURLOPT_POSTFIELDS, "{}");
        curl_easy_setopt(probe, CURLOPT_WRITEFUNCTION, DiscardWrite);
        curl_easy_setopt(probe, CURLOPT_WRITEDATA, &probe_body);
        curl_easy_setopt(probe, CURLOPT_TIMEOUT_MS, static_cast<long>(kProbeTimeout.count()));
        curl_easy_setopt(probe, CURLOPT_NOSIGNAL, 1L);
        EtcdApplyTls(core->http().config(), probe);
        curl_multi_add_handle(multi, probe);
      }
    }
    curl_multi_poll(multi, nullptr, 0, kPollMs, nullptr);
  }
  if (probe != nullptr) {
    curl_multi_remove_handle(multi, probe);
    curl_easy_cleanup(probe);
  }
  curl_multi_remove_handle(multi, easy);
  curl_easy_cleanup(easy);
  curl_slist_free_all(headers);
  if (stop.load()) return Outcome::kStop;
  return outcome;
}

// One message of the stream. Anything unexpected in it abandons the stream (kReconnect) rather
// than the watch: the resume from next_rev neither repeats nor skips a revision.
WatchState::Outcome WatchState::Handle(const std::string& text, const std::string& endpoint,
                                       bool* created, const std::string& token) {
  const std::string where = "watch of " + Printable(prefix) + " at " + endpoint;
  auto j = etcdjson::Parse(text, where);
  if (!j.ok()) return Outcome::kReconnect;  // a garbled stream: resume from what was delivered
  Status err = etcdjson::ErrorOf(*j, 200, where);
  if (!err.ok()) {
    if (Core::IsTokenError(err)) {
      core->DropToken(token);
      return Outcome::kReconnect;
    }
    if (err.code() == Code::kPermissionDenied) {
      Fail(err);
      return Outcome::kStop;
    }
    return Outcome::kReconnect;
  }
  auto it = j->find("result");
  if (it == j->end() || !it->is_object()) return Outcome::kReconnect;
  const Json& r = *it;
  auto compact = etcdjson::Int64(r, "compact_revision");
  auto canceled = etcdjson::Bool(r, "canceled");
  auto is_created = etcdjson::Bool(r, "created");
  auto reason = etcdjson::String(r, "cancel_reason");
  if (!compact.ok() || !canceled.ok() || !is_created.ok() || !reason.ok()) {
    return Outcome::kReconnect;
  }
  if (*compact > 0) {
    Fail(Status::FailedPrecondition("etcd " + where + ": revision " + std::to_string(next_rev) +
                                    " was compacted (etcd compacted up to revision " +
                                    std::to_string(*compact) +
                                    "); re-read the current state and watch from there"));
    return Outcome::kStop;
  }
  if (*canceled) {
    if (etcdjson::IsAuthTokenError(*reason)) {
      core->DropToken(token);
      return Outcome::kReconnect;
    }
    Code code = reason->find("permission denied") != std::string::npos ? Code::kPermissionDenied
                                                                       : Code::kUnavailable;
    Fail(Status(code, "etcd " + where + " was cancelled by etcd: " + *reason));
    return Outcome::kStop;
  }
  if (*is_created) {
    *created = true;
    if (next_rev == 0) {
      auto rev = etcdjson::HeaderRevision(r);
      if (!rev.ok() || *rev <= 0) return Outcome::kReconnect;
      next_rev = *rev + 1;
    }
  }
  auto ev = r.find("events");
  if (ev == r.end() || ev->is_null()) return Outcome::kContinue;
  if (!ev->is_array()) return Outcome::kReconnect;
  // Parse everything first: a bad event must not leave half a revision delivered.
  std::vector<BackendEvent> events;
  events.reserve(ev->size());
  for (const Json& e : *ev) {
    if (!e.is_object()) return Outcome::kReconnect;
    auto type = etcdjson::String(e, "type");
    auto kvit = e.find("kv");
    if (!type.ok() || kvit == e.end()) return Outcome::kReconnect;
    auto kv = etcdjson::ParseKv(*kvit);
    if (!kv.ok()) return Outcome::kReconnect;
    BackendEvent be;
    if (*type == "DELETE") {
      be.is_delete = true;
    } else if (!type->empty() && *type != "PUT") {
      return Outcome::kReconnect;
    }
    be.kv = std::move(kv).value();
    if (!events.empty() && be.kv.mod_revision < events.back().kv.mod_revision) {
      return Outcome::kReconnect;  // out of order: not etcd's behaviour; do not deliver it
    }
    events.push_back(std::move(be));
  }
  // One callback per revision: after each, next_rev moves past it, so a break anywhere resumes
  // exactly at the first revision not yet seen by the caller.
  size_t i = 0;
  while (i < events.size()) {
    int64_t rev = events[i].kv.mod_revision;
    size_t j2 = i;
    while (j2 < events.size() && events[j2].kv.mod_revision == rev) ++j2;
    if (rev >= next_rev) {  // older ones were delivered before a reconnect
      if (stop.load()) return Outcome::kStop;
      std::vector<BackendEvent> batch(std::make_move_iterator(events.begin() + i),
                                      std::make_move_iterator(events.begin() + j2));
      on_events(batch);
      next_rev = rev + 1;
    }
    i = j2;
  }
  return Outcome::kContinue;
}

class EtcdWatch : public ClusterWatch {
 public:
  explicit EtcdWatch(std::shared_ptr<WatchState> st) : st_(std::move(st)) {
    thread_ = std::thread([st = st_] { st->Run(); });
  }
  ~EtcdWatch() override { cancel(); }

  void cancel() override {
    {
      std::lock_guard<std::mutex> lock(st_->mu);
      st_->stop.store(true);
    }
    st_->cv.notify_all();
    curl_multi_wakeup(st_->multi);
    if (!thread_.joinable()) return;
    if (thread_.get_id() == std::this_thread::get_id()) {
      // Cancelled from its own callback: the thread returns once the callback does; it holds
      // the state, so it can run on after this handle is gone.
      thread_.detach();
    } else {
      thread_.join();
    }
  }

 private:
  std::shared_ptr<WatchState> st_;
  std::thread thread_;
};

// ---- backend ----------------------------------------------------------------------------------

class EtcdBackend : public ClusterBackend {
 public:
  explicit EtcdBackend(std::shared_ptr<Core> core) : core_(std::move(core)) {}

  std::string_view kind() const override { return "etcd"; }

  Result<BackendKv> get(std::string_view key, Clock::time_point deadline) override {
    Json req = {{"key", etcdjson::Base64Encode(key)}};
    FARMEM_ASSIGN_OR_RETURN(Json resp,
                            core_->Call("/v3/kv/range", req, deadline, "get " + Printable(key)));
    FARMEM_ASSIGN_OR_RETURN(auto kvs, etcdjson::ParseKvs(resp));
    for (auto& kv : kvs) {
      if (kv.key == key) return std::move(kv);
    }
    return Status::NotFound("etcd: no key " + Printable(key));
  }

  Result<BackendRange> range(std::string_view prefix, Clock::time_point deadline) override {
    // An empty prefix means every key: etcd spells that key "\0", range_end "\0".
    std::string key = prefix.empty() ? std::string(1, '\0') : std::string(prefix);
    Json req = {{"key", etcdjson::Base64Encode(key)},
                {"range_end", etcdjson::Base64Encode(etcdjson::PrefixRangeEnd(prefix))}};
    FARMEM_ASSIGN_OR_RETURN(
        Json resp, core_->Call("/v3/kv/range", req, deadline, "range " + Printable(prefix)));
    BackendRange out;
    FARMEM_ASSIGN_OR_RETURN(out.kvs, etcdjson::ParseKvs(resp));
    FARMEM_ASSIGN_OR_RETURN(out.revision, etcdjson::HeaderRevision(resp));
    // etcd sorts by key already; a reply that does not is not trusted to be complete either.
    if (!std::is_sorted(out.kvs.begin(), out.kvs.end(),
                        [](const BackendKv& a, const BackendKv& b) { return a.key < b.key; })) {
      std::sort(out.kvs.begin(), out.kvs.end(),
                [](const BackendKv& a, const BackendKv& b) { return a.key < b.key; });
    }
    return out;
  }

  Result<int64_t> put(std::string_view key, std::string_view value, int64_t lease,
                      std::optional<int64_t> expected_mod_revision,
                      Clock::time_point deadline) override {
    const std::string what = "put " + Printable(key);
    Json put = {{"key", etcdjson::Base64Encode(key)}, {"value", etcdjson::Base64Encode(value)}};
    if (lease != 0) put["lease"] = std::to_string(lease);
    if (!expected_mod_revision) {
      FARMEM_ASSIGN_OR_RETURN(Json resp, core_->Call("/v3/kv/put", put, deadline, what));
      return Revision(resp, what);
    }
    Json cmp = {{"key", etcdjson::Base64Encode(key)}, {"result", "EQUAL"}};
    if (*expected_mod_revision == 0) {
      // Absent <=> create_revision 0 (a deleted key's create_revision is 0 again).
      cmp["target"] = "CREATE";
      cmp["create_revision"] = "0";
    } else {
      cmp["target"] = "MOD";
      cmp["mod_revision"] = std::to_string(*expected_mod_revision);
    }
    Json txn = {
        {"compare", Json::array({cmp})},
        {"success", Json::array({Json{{"request_put", put}}})},
        // On failure read the key back, so the error can say what it found.
        {"failure",
         Json::array({Json{{"request_range", Json{{"key", etcdjson::Base64Encode(key)}}}}})}};
    FARMEM_ASSIGN_OR_RETURN(Json resp, core_->Call("/v3/kv/txn", txn, deadline, what));
    FARMEM_ASSIGN_OR_RETURN(bool ok, etcdjson::Bool(resp, "succeeded"));
    if (ok) return Revision(resp, what);
    int64_t found = 0;
    auto rs = resp.find("responses");
    if (rs != resp.end() && rs->is_array() && !rs->empty() && (*rs)[0].is_object()) {
      auto rr = (*rs)[0].find("response_range");
      if (rr != (*rs)[0].end()) {
        auto kvs = etcdjson::ParseKvs(*rr);
        if (kvs.ok() && !kvs->empty()) found = (*kvs)[0].mod_revision;
      }
    }
    std::string now = found == 0 ? "absent" : "at mod_revision " + std::to_string(found);
    std::string want = *expected_mod_revision == 0
                           ? "absent"
                           : "at mod_revision " + std::to_string(*expected_mod_revision);
    return Status::FailedPrecondition("etcd " + what + ": key is " + now + ", expected " + want +
                                      "; nothing written");
  }

  Result<int64_t> remove(std::string_view key, Clock::time_point deadline) override {
    const std::string what = "remove " + Printable(key);
    Json req = {{"key", etcdjson::Base64Encode(key)}};
    FARMEM_ASSIGN_OR_RETURN(Json resp, core_->Call("/v3/kv/deleterange", req, deadline, what));
    FARMEM_ASSIGN_OR_RETURN(int64_t deleted, etcdjson::Int64(resp, "deleted"));
    if (deleted == 0) return Status::NotFound("etcd: no key " + Printable(key));
    return Revision(resp, what);
  }

  Result<int64_t> txn(const std::vector<BackendCompare>& compares,
                      const std::vector<BackendOp>& ops, Clock::time_point deadline) override {
    const std::string what = "txn of " + std::to_string(ops.size()) + " op(s)" +
                             (ops.empty() ? "" : " (" + Printable(ops.front().key) + ", ...)");
    Json cmp = Json::array();
    for (const BackendCompare& c : compares) {
      Json j = {{"key", etcdjson::Base64Encode(c.key)}, {"result", "EQUAL"}};
      if (c.value) {
        j["target"] = "VALUE";
        j["value"] = etcdjson::Base64Encode(*c.value);
      } else {
        // Absent <=> create_revision 0 (as in put_if).
        j["target"] = "CREATE";
        j["create_revision"] = "0";
      }
      cmp.push_back(std::move(j));
    }
    Json success = Json::array();
    for (const BackendOp& op : ops) {
      if (op.remove)
        success.push_back(
            Json{{"request_delete_range", Json{{"key", etcdjson::Base64Encode(op.key)}}}});
      else
        success.push_back(Json{{"request_put", Json{{"key", etcdjson::Base64Encode(op.key)},
                                                    {"value", etcdjson::Base64Encode(op.value)}}}});
    }
    Json req = {{"compare", cmp}, {"success", success}, {"failure", Json::array()}};
    FARMEM_ASSIGN_OR_RETURN(Json resp, core_->Call("/v3/kv/txn", req, deadline, what));
    FARMEM_ASSIGN_OR_RETURN(bool ok, etcdjson::Bool(resp, "succeeded"));
    if (!ok)
      return Status::FailedPrecondition("etcd " + what + ": a compare failed; nothing written");
    return Revision(resp, what);
  }

  Result<int64_t> revision(Clock::time_point deadline) override {
    // maintenance/status: answers without any key permission, so a restricted user can ask too.
    FARMEM_ASSIGN_OR_RETURN(
        Json resp, core_->Call("/v3/maintenance/status", Json::object(), deadline, "revision"));
    return Revision(resp, "revision");
  }

  Result<int64_t> lease_grant(milliseconds ttl, Clock::time_point deadline) override {
    int64_t secs = std::max<int64_t>(1, (ttl.count() + 999) / 1000);
    Json req = {{"TTL", std::to_string(secs)}};
    FARMEM_ASSIGN_OR_RETURN(Json resp,
                            core_->Call("/v3/lease/grant", req, deadline, "lease grant"));
    FARMEM_ASSIGN_OR_RETURN(std::string error, etcdjson::String(resp, "error"));
    if (!error.empty()) return Status::Unavailable("etcd lease grant: " + error);
    FARMEM_ASSIGN_OR_RETURN(int64_t id, etcdjson::Int64(resp, "ID"));
    if (id == 0) return Status::Protocol("etcd lease grant: no lease ID in the answer");
    return id;
  }

  Result<milliseconds> lease_keepalive(int64_t lease, Clock::time_point deadline) override {
    const std::string what = "lease keepalive " + std::to_string(lease);
    Json req = {{"ID", std::to_string(lease)}};
    FARMEM_ASSIGN_OR_RETURN(Json resp, core_->Call("/v3/lease/keepalive", req, deadline, what));
    // A stream endpoint: the answer is wrapped in "result".
    auto it = resp.find("result");
    if (it == resp.end() || !it->is_object()) {
      return Status::Protocol("etcd " + what + ": no result in the answer");
    }
    FARMEM_ASSIGN_OR_RETURN(int64_t ttl, etcdjson::Int64(*it, "TTL"));
    if (ttl <= 0)
      return Status::NotFound("etcd " + what + ": lease not found (expired or revoked)");
    return milliseconds(ttl * 1000);
  }

  Result<milliseconds> lease_time_left(int64_t lease, Clock::time_point deadline) override {
    const std::string what = "lease time-to-live " + std::to_string(lease);
    Json req = {{"ID", std::to_string(lease)}};
    FARMEM_ASSIGN_OR_RETURN(Json resp, core_->Call("/v3/lease/timetolive", req, deadline, what));
    FARMEM_ASSIGN_OR_RETURN(int64_t ttl, etcdjson::Int64(resp, "TTL"));
    if (ttl < 0) return Status::NotFound("etcd " + what + ": lease not found (expired or revoked)");
    return milliseconds(ttl * 1000);
  }

  Status lease_revoke(int64_t lease, Clock::time_point deadline) override {
    Json req = {{"ID", std::to_string(lease)}};
    auto r =
        core_->Call("/v3/lease/revoke", req, deadline, "lease revoke " + std::to_string(lease));
    return r.ok() ? Status::OK() : r.status();
  }

  Result<std::unique_ptr<ClusterWatch>> watch(std::string_view prefix, int64_t from_revision,
                                              BackendWatchCallback on_events,
                                              ClusterWatchErrorCallback on_error) override {
    if (!on_events) return Status::InvalidArgument("etcd watch: no callback");
    auto st = std::make_shared<WatchState>();
    st->core = core_;
    st->prefix = std::string(prefix);
    st->key_b64 = etcdjson::Base64Encode(prefix.empty() ? std::string(1, '\0') : st->prefix);
    st->range_end_b64 = etcdjson::Base64Encode(etcdjson::PrefixRangeEnd(prefix));
    st->on_events = std::move(on_events);
    st->on_error = std::move(on_error);
    st->multi = curl_multi_init();
    if (st->multi == nullptr) return Status::ResourceExhausted("etcd watch: curl_multi_init");
    st->next_rev = from_revision;
    if (from_revision <= 0) {
      // Pin "now" before returning, so a stream that breaks before etcd confirms it still resumes
      // at the right place. If etcd is unreachable, the first stream's header pins it instead.
      auto rev = revision(Clock::now() + core_->options().call_timeout);
      st->next_rev = rev.ok() ? *rev + 1 : 0;
    }
    return std::unique_ptr<ClusterWatch>(std::make_unique<EtcdWatch>(std::move(st)));
  }

 private:
  static Result<int64_t> Revision(const Json& resp, const std::string& what) {
    FARMEM_ASSIGN_OR_RETURN(int64_t rev, etcdjson::HeaderRevision(resp));
    if (rev <= 0) return Status::Protocol("etcd " + what + ": no revision in the answer");
    return rev;
  }

  std::shared_ptr<Core> core_;
};

}  // namespace

Result<std::unique_ptr<ClusterBackend>> OpenEtcdBackend(const std::vector<std::string>& endpoints,
                                                        bool tls, const ClusterOptions& options) {
  EtcdHttpConfig config;
  config.tls = tls || !options.tls_ca_file.empty() || !options.tls_cert_file.empty() ||
               !options.tls_key_file.empty();
  for (std::string e : endpoints) {
    // Tolerate a scheme on an endpoint; https:// asks for TLS like etcds:// does.
    if (e.rfind("http://", 0) == 0) {
      e.erase(0, 7);
    } else if (e.rfind("https://", 0) == 0) {
      e.erase(0, 8);
      config.tls = true;
    }
    while (!e.empty() && e.back() == '/') e.pop_back();
    auto hp = net::ParseHostPort(e, net::PortZero::kRefused);
    if (!hp.ok()) return hp.status().WithContext("etcd endpoint '" + e + "'");
    config.endpoints.push_back(e);
  }
  if (config.endpoints.empty()) return Status::InvalidArgument("etcd: no endpoint in the URL");
  if (options.user.empty() && !options.password.empty()) {
    return Status::InvalidArgument("etcd: a password without a user");
  }
  config.ca_file = options.tls_ca_file;
  config.cert_file = options.tls_cert_file;
  config.key_file = options.tls_key_file;
  auto core = std::make_shared<Core>(std::move(config), options);
  return std::unique_ptr<ClusterBackend>(std::make_unique<EtcdBackend>(std::move(core)));
}

}  // namespace farmem::cluster
