// EtcdHttp: the libcurl side of the etcd backend — POSTs JSON to etcd's v3 gateway over a small
// pool of reused connections, with a deadline per call and fail-over between endpoints.
// Thread-safe: any thread calling the backend (and the watch threads' liveness probes) use it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "farmem/status.h"

namespace farmem::cluster {

// How to reach etcd over HTTP(S); shared by the unary calls and the watch streams.
struct EtcdHttpConfig {
  std::vector<std::string> endpoints;  // "host:port" (IPv6 as "[v6]:port")
  bool tls = false;
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
};

struct EtcdHttpResponse {
  long status = 0;  // HTTP status
  std::string body;
  std::string endpoint;  // which endpoint answered (for messages)
};

// "http(s)://endpoint/path".
std::string EtcdUrl(const EtcdHttpConfig& config, std::string_view endpoint, std::string_view path);

// Applies the TLS options of `config` to a curl easy handle (a void* so curl.h stays out of here).
void EtcdApplyTls(const EtcdHttpConfig& config, void* curl);

// curl_global_init once per process (it is not thread-safe, so everything calls this first).
void EtcdCurlGlobalInit();

class EtcdHttp {
 public:
  explicit EtcdHttp(EtcdHttpConfig config);
  ~EtcdHttp();
  EtcdHttp(const EtcdHttp&) = delete;
  EtcdHttp& operator=(const EtcdHttp&) = delete;

  const EtcdHttpConfig& config() const { return config_; }

  // POSTs `body` to `path` ("/v3/kv/range"). Starts at the endpoint that answered last and moves
  // to the next one while an endpoint cannot be connected to (the request was then never sent, so
  // trying it elsewhere is safe). Returns the response whatever its HTTP status; a transport
  // failure is Unavailable (refused, reset) or TimedOut (deadline), naming the endpoint.
  // `auth_token` non-empty is sent as "Authorization: <token>".
  Result<EtcdHttpResponse> Post(std::string_view path, const std::string& body,
                                const std::string& auth_token,
                                std::chrono::steady_clock::time_point deadline);

  // The endpoint index calls start at (a watch starts there too).
  size_t preferred() const { return preferred_.load(std::memory_order_relaxed); }

 private:
  void* Acquire();
  void Release(void* curl);

  const EtcdHttpConfig config_;
  std::atomic<size_t> preferred_{0};
  std::mutex mu_;
  std::vector<void*> idle_;  // CURL* easy handles, each keeping its connection alive
};

}  // namespace farmem::cluster
