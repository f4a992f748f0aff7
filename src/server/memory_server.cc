// MemoryServer: composes farmemd from the built services (server/built_services.h) on one Node
// through a ServiceHost. Teardown order matters: the node (and with it every peer's access) stops
// before the services unmap their memory.
#include "farmem/server.h"

#include <atomic>
#include <set>

#include "common/log.h"
#include "server/built_services.h"
#include "service/service_host.h"

namespace farmem {
namespace {

const ServiceDescriptor* FindService(std::string_view name) {
  for (const ServiceDescriptor* d : BuiltServices()) {
    if (d->name == name) return d;
  }
  return nullptr;
}

std::string BuiltNames() {
  std::string names;
  for (const ServiceDescriptor* d : BuiltServices()) names += (names.empty() ? "" : ", ") + d->name;
  return names;
}

// The services `config` selects, in order: its list (or every built one, minus those whose
// `configured` says `config` does not ask for them), minus the object store when
// objects.enabled is false. Listed by name without their configuration (a tier file, tx
// tables), their validation refuses them.
std::vector<const ServiceDescriptor*> Selected(const ServerConfig& config) {
  std::vector<const ServiceDescriptor*> out;
  if (config.services.empty()) {
    for (const ServiceDescriptor* d : BuiltServices()) {
      if (!d->configured || d->configured(config)) out.push_back(d);
    }
  } else {
    for (const std::string& name : config.services) {
      if (const ServiceDescriptor* d = FindService(name)) out.push_back(d);
    }
  }
  if (!config.objects.enabled) {
    std::erase_if(out, [](const ServiceDescriptor* d) { return d->name == "objects"; });
  }
  return out;
}

}  // namespace

Status ValidateServerConfig(const ServerConfig& config) {
  std::set<std::string> seen;
  for (const std::string& name : config.services) {
    if (FindService(name) == nullptr) {
      return Status::InvalidArgument("unknown service '" + name + "' (built: " + BuiltNames() +
                                     ")");
    }
    if (!seen.insert(name).second) {
      return Status::InvalidArgument("service '" + name + "' listed twice");
    }
  }
  if (config.sessions.max_sessions < 1 || config.sessions.max_sessions > kMaxSessionsLimit) {
    return Status::InvalidArgument("--max-sessions must be 1..65535, got " +
                                   std::to_string(config.sessions.max_sessions));
  }
  if (config.sessions.ttl_max_seconds < 1 || config.sessions.ttl_max_seconds > 3600) {
    return Status::InvalidArgument("--session-ttl-max must be 1..3600 seconds, got " +
                                   std::to_string(config.sessions.ttl_max_seconds));
  }
  ServerConfig copy = config;
  for (const ServiceDescriptor* d : Selected(config)) {
    FARMEM_RETURN_IF_ERROR(d->validate(copy));
  }
  return Status::OK();
}

struct MemoryServer::Impl {
  ServerConfig config;
  // Declared first so it is destroyed last: services hold references to it.
  std::unique_ptr<Node> node;
  std::unique_ptr<ServiceHost> host;
  std::atomic<bool> started{false};

  ~Impl() {
    if (node) node->stop();  // no peer reaches service memory from here on
    if (host) host->stop();
    host.reset();  // services unmap their memory
  }
};

MemoryServer::MemoryServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MemoryServer::~MemoryServer() {
  stop();
}

Result<std::unique_ptr<MemoryServer>> MemoryServer::Create(const ServerConfig& config) {
  FARMEM_RETURN_IF_ERROR(ValidateServerConfig(config).WithContext("memory server config"));
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  FARMEM_ASSIGN_OR_RETURN(impl->node, Node::Create(config.node));
  SessionOptions so;
  so.max_sessions = config.sessions.max_sessions;
  so.ttl_max = std::chrono::seconds(config.sessions.ttl_max_seconds);
  impl->host = std::make_unique<ServiceHost>(*impl->node, so);
  ServiceEnv env{*impl->node, impl->host->sessions()};
  for (const ServiceDescriptor* d : Selected(config)) {
    auto service = d->create(config, env);
    if (!service.ok()) {
      return service.status().WithContext("memory server config: service '" + d->name + "'");
    }
    FARMEM_RETURN_IF_ERROR(impl->host->add(std::move(*service)));
  }
  return std::unique_ptr<MemoryServer>(new MemoryServer(std::move(impl)));
}

Status MemoryServer::start() {
  Impl* impl = impl_.get();
  if (impl->started.load()) return Status::OK();
  FARMEM_RETURN_IF_ERROR(impl->host->register_methods());
  FARMEM_RETURN_IF_ERROR(impl->host->start());
  if (Status st = impl->node->start(); !st.ok()) {
    impl->host->stop();
    return st;
  }
  impl->host->set_running(true);
  impl->started.store(true);
  std::string names;
  for (const std::string& n : services()) names += (names.empty() ? "" : ",") + n;
  FARMEM_LOG_INFO("memory server '{}' started: bootstrap {} transport {} services {}",
                  impl->config.node.name, impl->node->bootstrap_address(),
                  impl->node->transport().name(), names.empty() ? "(none)" : names);
  return Status::OK();
}

void MemoryServer::stop() {
  if (impl_ && impl_->node) {
    impl_->node->stop();
    impl_->host->set_running(false);
    impl_->host->stop();
    impl_->started.store(false);
  }
}

std::string MemoryServer::stats_json() const {
  return impl_->host->stats().dump();
}

void MemoryServer::set_stats_section(std::string key, std::function<std::string()> json_text) {
  if (!json_text) {
    impl_->host->set_stats_section(std::move(key), nullptr);
    return;
  }
  impl_->host->set_stats_section(std::move(key), [fn = std::move(json_text)] {
    std::string text = fn();
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    return j.is_discarded() ? nlohmann::json(text) : j;
  });
}

std::string MemoryServer::metrics_text() const {
  return impl_->host->metrics();
}

size_t MemoryServer::end_member_sessions(std::string_view member) {
  return impl_->host->sessions().end_member(member);
}

std::vector<std::string> MemoryServer::services() const {
  std::vector<std::string> out;
  for (const auto& s : impl_->host->services()) out.emplace_back(s->name());
  return out;
}

Node& MemoryServer::node() {
  return *impl_->node;
}

const ServerConfig& MemoryServer::config() const {
  return impl_->config;
}

}  // namespace farmem
