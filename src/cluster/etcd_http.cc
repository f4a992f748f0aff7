// EtcdHttp: unary JSON POSTs to etcd's v3 gateway over pooled libcurl easy handles (each keeps
// its keep-alive connection, so a get/put costs one round trip). Called from any thread.
#include "cluster/etcd_http.h"

#include <curl/curl.h>

#include <algorithm>
#include <mutex>

namespace farmem::cluster {

namespace {

// Idle handles kept; more concurrent callers get a fresh handle that is closed after use.
constexpr size_t kMaxIdleHandles = 16;

size_t AppendBody(char* data, size_t size, size_t n, void* user) {
  auto* body = static_cast<std::string*>(user);
  // A gateway answer is at most a few MiB (1 MiB values, base64'd); refuse absurd ones rather than
  // grow without bound on a broken or hostile peer. Returning a short count aborts the transfer.
  if (body->size() + size * n > (size_t{64} << 20)) return 0;
  body->append(data, size * n);
  return size * n;
}

// Nothing of the request was sent: trying another endpoint is safe. A failed TLS handshake
// (certificate not trusted, not TLS at all) counts: the request goes only after the handshake.
bool IsConnectFailure(CURLcode rc) {
  return rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST ||
         rc == CURLE_COULDNT_RESOLVE_PROXY || rc == CURLE_SSL_CONNECT_ERROR ||
         rc == CURLE_PEER_FAILED_VERIFICATION;
}

}  // namespace

void EtcdCurlGlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_ALL); });
}

std::string EtcdUrl(const EtcdHttpConfig& config, std::string_view endpoint,
                    std::string_view path) {
  std::string url = config.tls ? "https://" : "http://";
  url.append(endpoint);
  url.append(path);
  return url;
}

void EtcdApplyTls(const EtcdHttpConfig& config, void* handle) {
  CURL* curl = static_cast<CURL*>(handle);
  if (!config.tls) return;
  if (!config.ca_file.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, config.ca_file.c_str());
  if (!config.cert_file.empty()) curl_easy_setopt(curl, CURLOPT_SSLCERT, config.cert_file.c_str());
  if (!config.key_file.empty()) curl_easy_setopt(curl, CURLOPT_SSLKEY, config.key_file.c_str());
}

EtcdHttp::EtcdHttp(EtcdHttpConfig config) : config_(std::move(config)) {
  EtcdCurlGlobalInit();
}

EtcdHttp::~EtcdHttp() {
  for (void* h : idle_) curl_easy_cleanup(static_cast<CURL*>(h));
}

void* EtcdHttp::Acquire() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_.empty()) {
      void* h = idle_.back();
      idle_.pop_back();
      return h;
    }
  }
  return curl_easy_init();
}

void EtcdHttp::Release(void* h) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (idle_.size() < kMaxIdleHandles) {
      idle_.push_back(h);
      return;
    }
  }
  curl_easy_cleanup(static_cast<CURL*>(h));
}

Result<EtcdHttpResponse> EtcdHttp::Post(std::string_view path, const std::string& body,
                                        const std::string& auth_token,
                                        std::chrono::steady_clock::time_point deadline) {
  using namespace std::chrono;
  const size_t n = config_.endpoints.size();
  if (n == 0) return Status::InvalidArgument("etcd: no endpoint");
  CURL* curl = static_cast<CURL*>(Acquire());
  if (curl == nullptr) return Status::ResourceExhausted("etcd: curl_easy_init failed");
  curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  // No "Expect: 100-continue" round trip for large bodies (a 1 MiB put would wait for it).
  headers = curl_slist_append(headers, "Expect:");
  std::string auth_header;
  if (!auth_token.empty()) {
    auth_header = "Authorization: " + auth_token;
    headers = curl_slist_append(headers, auth_header.c_str());
  }
  Status last;
  char error[CURL_ERROR_SIZE];  // outlives every use of the handle below
  const size_t start = preferred_.load(std::memory_order_relaxed) % n;
  for (size_t i = 0; i < n; ++i) {
    const size_t idx = (start + i) % n;
    const std::string& endpoint = config_.endpoints[idx];
    auto left = duration_cast<milliseconds>(deadline - steady_clock::now()).count();
    if (left <= 0) {
      if (last.ok())
        last = Status::TimedOut("etcd " + endpoint + ": deadline passed before " +
                                std::string(path) + " was sent");
      break;
    }
    // Leave the endpoints after this one some of the budget for connecting (a blackholed address
    // would otherwise eat all of it); a refused loopback connect returns at once anyway.
    long connect_ms = static_cast<long>(std::max<int64_t>(left / static_cast<int64_t>(n - i), 100));
    connect_ms = std::min<long>(connect_ms, static_cast<long>(left));
    std::string url = EtcdUrl(config_, endpoint, path);
    EtcdHttpResponse resp;
    error[0] = '\0';
    // reset keeps the handle's open connections; only the options go.
    curl_easy_reset(curl);
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_POST, 1L);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, AppendBody);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &resp.body);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(left));
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, connect_ms);
    // Timeouts must not raise SIGALRM-based DNS timeouts in a multi-threaded process.
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_TCP_NODELAY, 1L);
    // The details ("SSL certificate problem: unable to get local issuer certificate") that
    // curl_easy_strerror's generic text lacks.
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
    EtcdApplyTls(config_, curl);
    CURLcode rc = curl_easy_perform(curl);
    if (rc == CURLE_OK) {
      curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &resp.status);
      resp.endpoint = endpoint;
      preferred_.store(idx, std::memory_order_relaxed);
      curl_slist_free_all(headers);
      curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, nullptr);  // `error` dies with this call
      Release(curl);
      return resp;
    }
    std::string what = "etcd " + endpoint + " " + std::string(path) + ": " + curl_easy_strerror(rc);
    if (error[0] != '\0') what += std::string(" (") + error + ")";
    curl_off_t connected_us = 0;
    curl_easy_getinfo(curl, CURLINFO_CONNECT_TIME_T, &connected_us);
    if (rc == CURLE_OPERATION_TIMEDOUT && connected_us == 0) {
      // The connect itself timed out (an unreachable address): nothing was sent, try the next.
      last = Status::Unavailable(what + " (connect)");
      continue;
    }
    if (rc == CURLE_OPERATION_TIMEDOUT) {
      // Connected, then no answer in time (a hung etcd): do not resend — the request may have
      // been applied. The next call starts at the next endpoint instead.
      preferred_.store((idx + 1) % n, std::memory_order_relaxed);
      last = Status::TimedOut(what);
      break;
    }
    last = Status::Unavailable(what);
    if (!IsConnectFailure(rc)) {
      // Sent (or partly sent) and then the connection failed: retrying elsewhere could apply it
      // twice, so report it; the next call starts at the next endpoint.
      preferred_.store((idx + 1) % n, std::memory_order_relaxed);
      break;
    }
  }
  curl_slist_free_all(headers);
  // A handle whose transfer failed may hold a half-dead connection: drop it rather than pool it.
  curl_easy_cleanup(curl);
  return last;
}

}  // namespace farmem::cluster
