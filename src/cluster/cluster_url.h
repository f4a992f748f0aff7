// Parsing of control-plane URLs (memory://NAME, etcd://h:p[,h:p...], etcds://...) and the name
// rules shared by cluster and member names; opens the backend a URL names. Pure functions, any
// thread.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cluster/backend.h"
#include "farmem/cluster.h"
#include "farmem/status.h"

namespace farmem::cluster {

struct ClusterUrl {
  enum class Kind { kMemory, kEtcd };
  Kind kind = Kind::kMemory;
  std::string memory_name;             // kMemory
  std::vector<std::string> endpoints;  // kEtcd: "host:port", in the URL's order
  bool tls = false;                    // etcds://
};

// [A-Za-z0-9_.-]{1,64}: cluster names, member names and memory:// store names.
bool IsValidName(std::string_view name);

// InvalidArgument (naming the accepted forms) for anything but the three URL forms.
Result<ClusterUrl> ParseClusterUrl(std::string_view url);

// Opens the backend `url` names (OpenMemoryBackend or OpenEtcdBackend); TLS is on for etcds://
// or when any TLS file is set in `options`.
Result<std::unique_ptr<ClusterBackend>> OpenBackendForUrl(std::string_view url,
                                                          const ClusterOptions& options);

}  // namespace farmem::cluster
