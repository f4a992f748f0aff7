// Control-plane URL parsing and backend selection (see cluster_url.h). No state; any thread.
#include "cluster/cluster_url.h"

#include "common/net/host_port.h"

namespace farmem::cluster {

namespace {

constexpr std::string_view kAcceptedForms =
    "accepted: memory://NAME (NAME [A-Za-z0-9_.-]{1,64}), etcd://host:port[,host:port...], "
    "etcds://host:port[,host:port...]";

Status BadUrl(std::string_view url, std::string_view why) {
  return Status::InvalidArgument("cluster URL '" + std::string(url) + "': " + std::string(why) +
                                 "; " + std::string(kAcceptedForms));
}

}  // namespace

bool IsValidName(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == '-';
    if (!ok) return false;
  }
  return true;
}

Result<ClusterUrl> ParseClusterUrl(std::string_view url) {
  ClusterUrl out;
  std::string_view rest;
  if (url.starts_with("memory://")) {
    rest = url.substr(9);
    if (!IsValidName(rest)) return BadUrl(url, "bad memory store name");
    out.kind = ClusterUrl::Kind::kMemory;
    out.memory_name = std::string(rest);
    return out;
  }
  if (url.starts_with("etcd://")) {
    rest = url.substr(7);
  } else if (url.starts_with("etcds://")) {
    rest = url.substr(8);
    out.tls = true;
  } else {
    return BadUrl(url, "unknown scheme");
  }
  out.kind = ClusterUrl::Kind::kEtcd;
  if (rest.empty()) return BadUrl(url, "no endpoint");
  while (true) {
    size_t comma = rest.find(',');
    std::string_view ep = rest.substr(0, comma);
    if (ep.empty()) return BadUrl(url, "empty endpoint");
    if (ep.find('/') != std::string_view::npos || ep.find('@') != std::string_view::npos) {
      return BadUrl(url, "endpoint '" + std::string(ep) + "' is not host:port");
    }
    auto hp = net::ParseHostPort(ep, net::PortZero::kRefused);
    if (!hp.ok() || hp->first.empty()) {
      return BadUrl(url, "endpoint '" + std::string(ep) + "' is not host:port");
    }
    out.endpoints.emplace_back(ep);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return out;
}

Result<std::unique_ptr<ClusterBackend>> OpenBackendForUrl(std::string_view url,
                                                          const ClusterOptions& options) {
  FARMEM_ASSIGN_OR_RETURN(ClusterUrl parsed, ParseClusterUrl(url));
  if (parsed.kind == ClusterUrl::Kind::kMemory)
    return OpenMemoryBackend(parsed.memory_name, options);
  bool tls = parsed.tls || !options.tls_ca_file.empty() || !options.tls_cert_file.empty() ||
             !options.tls_key_file.empty();
  return OpenEtcdBackend(parsed.endpoints, tls, options);
}

}  // namespace farmem::cluster
