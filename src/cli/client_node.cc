// Client-side node set-up shared by `farmem demo` and `farmem stat`: a started Node on an
// ephemeral loopback (or --data-host) port, with the cluster token and the server's backend.
#include <chrono>
#include <cstdlib>

#include "cli/commands.h"

namespace farmem::cli {

Result<std::unique_ptr<Node>> MakeClientNode(const ClientOptions& options,
                                             const std::string& name) {
  NodeConfig c;
  c.name = name;
  c.bootstrap_host = options.data_host;
  c.bootstrap_port = 0;
  c.rpc_workers = 1;
  c.transport.backend = options.backend;
  c.transport.provider = options.provider;
  c.transport.listen_host = options.data_host;
  c.transport.listen_port = 0;
  c.transport.cluster_token = options.token;
  if (options.op_timeout_ms > 0)
    c.transport.op_timeout = std::chrono::milliseconds(options.op_timeout_ms);
  FARMEM_ASSIGN_OR_RETURN(auto node, Node::Create(c));
  FARMEM_RETURN_IF_ERROR(node->start().WithContext("starting the client node"));
  return node;
}

}  // namespace farmem::cli
