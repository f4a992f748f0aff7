// Node: a process's presence in a farmem cluster (see include/farmem/node.h, docs/node.md).
// Glues together the transport, the exported-region registry, the RPC dispatcher (rpc_dispatcher.h)
// and the bootstrap listener/handshake (bootstrap.h).
#include "farmem/node.h"

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "common/log.h"
#include "common/net/host_port.h"
#include "node/bootstrap.h"
#include "node/rpc_dispatcher.h"

namespace farmem {
namespace {

// RPCs waiting for a worker before new ones are refused with ResourceExhausted.
constexpr size_t kRpcQueueCapacity = 4096;
constexpr int kMaxRpcWorkers = 256;
constexpr size_t kMaxRegionName = 256;

// Compares without an early exit so the time taken does not reveal how much of a guess matched.
bool TokenEquals(std::string_view a, std::string_view b) {
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned>(x ^ y);
  }
  return diff == 0;
}

bool PrintableAscii(std::string_view s) {
  for (char c : s) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

class NodeImpl final : public Node {
 public:
  NodeImpl(const NodeConfig& config, std::unique_ptr<Transport> transport)
      : config_(config),
        transport_(std::move(transport)),
        dispatcher_(kRpcQueueCapacity, config.transport.max_rpc_bytes) {
    // Node-internal handlers; registration cannot fail on a fresh dispatcher.
    Status st = dispatcher_.Register(
        kOpListRegions, [this](const RpcCall&, std::vector<std::byte>& reply) -> Status {
          std::vector<std::byte> encoded = node::EncodeRegionList(exported_regions());
          reply.swap(encoded);
          return Status::OK();
        });
    if (!st.ok()) FARMEM_LOG_ERROR("node: registering kOpListRegions: {}", st.ToString());
  }

  ~NodeImpl() override { stop(); }

  Status start() override {
    std::lock_guard life(lifecycle_mu_);
    {
      std::lock_guard lock(state_mu_);
      if (state_ == State::kRunning) return Status::OK();
      if (state_ == State::kStopped) {
        return Status::Unavailable("node '" + config_.name + "' was stopped; create a new node");
      }
    }
    transport_->set_rpc_handler(
        [this](std::unique_ptr<IncomingRpc> rpc) { dispatcher_.Submit(std::move(rpc)); });
    Status st = dispatcher_.Start(config_.rpc_workers);
    if (st.ok()) st = transport_->start();
    if (st.ok()) {
      bootstrap_ = std::make_unique<node::BootstrapServer>(
          [this](const node::HelloMsg& hello, std::string_view peer) {
            return OnHello(hello, peer);
          },
          config_.bootstrap_limits.handshake_timeout, config_.bootstrap_limits);
      // Published for bootstrap_stats(), which must not take lifecycle_mu_ (STAT handlers call it
      // while stop() holds that lock and waits for them). The server lives as long as the node.
      bootstrap_view_.store(bootstrap_.get(), std::memory_order_release);
      st = bootstrap_->Start(config_.bootstrap_host, config_.bootstrap_port);
    }
    if (!st.ok()) {
      {
        std::lock_guard lock(state_mu_);
        state_ = State::kStopped;
      }
      Teardown();
      return st.WithContext("starting node '" + config_.name + "'");
    }
    {
      std::lock_guard lock(state_mu_);
      state_ = State::kRunning;
      bootstrap_address_ = bootstrap_->address();
    }
    FARMEM_LOG_INFO("node '{}' started: bootstrap {}, transport {} at {}, {} rpc worker(s)",
                    config_.name, bootstrap_->address(), transport_->name(),
                    transport_->local_address(), config_.rpc_workers);
    return Status::OK();
  }

  // Must not be called from an RPC handler (it waits for the handlers to finish).
  void stop() override {
    std::lock_guard life(lifecycle_mu_);
    {
      std::lock_guard lock(state_mu_);
      if (state_ == State::kStopped) return;
      if (state_ == State::kRunning) FARMEM_LOG_INFO("node '{}' stopping", config_.name);
      // Flipped first so connect() calls from running handlers fail fast instead of waiting.
      state_ = State::kStopped;
    }
    Teardown();
  }

  const NodeConfig& config() const override { return config_; }

  BootstrapStats bootstrap_stats() const override {
    const node::BootstrapServer* b = bootstrap_view_.load(std::memory_order_acquire);
    return b != nullptr ? b->stats() : BootstrapStats{};
  }

  std::string bootstrap_address() const override {
    std::lock_guard lock(state_mu_);
    return bootstrap_address_;
  }

  Transport& transport() override { return *transport_; }

  Result<RegionInfo> export_region(std::string_view name, void* addr, size_t len,
                                   Access access) override {
    if (name.empty() || name.size() > kMaxRegionName) {
      return Status::InvalidArgument("region name must be 1.." + std::to_string(kMaxRegionName) +
                                     " bytes");
    }
    if (addr == nullptr || len == 0) {
      return Status::InvalidArgument("export_region needs a non-null address and length > 0");
    }
    {
      std::lock_guard lock(regions_mu_);
      if (regions_.count(name) != 0) {
        return Status::InvalidArgument("region '" + std::string(name) + "' already exported");
      }
    }
    // Registration may be slow (pinning); do it outside the lock and re-check the name after.
    FARMEM_ASSIGN_OR_RETURN(MemoryRegion mr, transport_->register_memory(addr, len, access));
    RegionInfo info{std::string(name), mr.key, static_cast<uint64_t>(len)};
    {
      std::lock_guard lock(regions_mu_);
      if (regions_.emplace(info.name, Exported{info, mr}).second) return info;
    }
    Status undo = transport_->deregister_memory(mr.key);
    (void)undo;  // the region was never published; a failed deregister leaves only a dead key
    return Status::InvalidArgument("region '" + std::string(name) + "' already exported");
  }

  Status unexport_region(std::string_view name) override {
    Exported gone;
    {
      std::lock_guard lock(regions_mu_);
      auto it = regions_.find(name);
      if (it == regions_.end()) {
        return Status::NotFound("no exported region named '" + std::string(name) + "'");
      }
      gone = it->second;
      regions_.erase(it);
    }
    return transport_->deregister_memory(gone.mr.key);
  }

  std::vector<RegionInfo> exported_regions() const override {
    std::lock_guard lock(regions_mu_);
    std::vector<RegionInfo> out;
    out.reserve(regions_.size());
    for (const auto& [_, e] : regions_) out.push_back(e.info);
    return out;
  }

  Status register_rpc(uint16_t opcode, RpcFunction fn, RpcExecution execution) override {
    if (opcode < kFirstUserOpcode) {
      return Status::InvalidArgument("opcode " + std::to_string(opcode) +
                                     " is reserved for the node (user opcodes start at " +
                                     std::to_string(kFirstUserOpcode) + ")");
    }
    return dispatcher_.Register(opcode, std::move(fn), execution);
  }

  Result<PeerInfo> connect(std::string_view bootstrap_address) override {
    {
      std::lock_guard lock(state_mu_);
      if (state_ != State::kRunning) {
        return Status::Unavailable("node '" + config_.name + "' is not running");
      }
    }
    FARMEM_ASSIGN_OR_RETURN(auto hp,
                            net::ParseHostPort(bootstrap_address, net::PortZero::kRefused));
    node::HelloMsg hello{config_.transport.cluster_token, config_.name, transport_->local_address(),
                         transport_->name()};
    auto welcome = node::Handshake(hp.first, hp.second, hello, config_.transport.connect_timeout);
    if (!welcome.ok()) {
      FARMEM_LOG_WARN("node '{}': connect to {} failed: {}", config_.name, bootstrap_address,
                      welcome.status().ToString());
      return welcome.status();
    }
    if (welcome->backend != transport_->name()) {
      return Status::InvalidArgument("peer '" + welcome->name + "' at " +
                                     std::string(bootstrap_address) + " uses transport '" +
                                     welcome->backend + "' but this node uses '" +
                                     transport_->name() + "'");
    }
    auto id = transport_->add_peer(welcome->transport_address);
    if (!id.ok()) {
      return id.status().WithContext("adding peer '" + welcome->name + "' (" +
                                     welcome->transport_address + ")");
    }
    PeerInfo info;
    info.id = *id;
    info.name = std::move(welcome->name);
    info.bootstrap_address = std::string(bootstrap_address);
    info.transport_address = std::move(welcome->transport_address);
    info.regions = std::move(welcome->regions);
    FARMEM_LOG_INFO("node '{}': connected to peer '{}' at {} (peer id {}, {} region(s))",
                    config_.name, info.name, info.bootstrap_address, info.id, info.regions.size());
    return info;
  }

  Result<std::unique_ptr<Scheduler>> make_scheduler() override {
    FARMEM_ASSIGN_OR_RETURN(std::unique_ptr<Context> ctx, transport_->create_context());
    return std::make_unique<Scheduler>(std::move(ctx));
  }

 private:
  enum class State { kCreated, kRunning, kStopped };
  struct Exported {
    RegionInfo info;
    MemoryRegion mr;
  };

  // Runs on the bootstrap thread for every well-formed HELLO.
  Result<node::WelcomeMsg> OnHello(const node::HelloMsg& hello, std::string_view peer) {
    if (!TokenEquals(hello.token, config_.transport.cluster_token)) {
      FARMEM_LOG_WARN("node '{}': rejected peer '{}' from {}: wrong cluster token", config_.name,
                      hello.name, peer);
      return Status::PermissionDenied("wrong cluster token");
    }
    if (hello.backend != transport_->name()) {
      FARMEM_LOG_WARN("node '{}': rejected peer '{}' from {}: it uses transport '{}', we use '{}'",
                      config_.name, hello.name, peer, hello.backend, transport_->name());
      return Status::InvalidArgument("transport mismatch: peer uses '" + hello.backend +
                                     "' but node '" + config_.name + "' uses '" +
                                     transport_->name() + "'");
    }
    FARMEM_LOG_INFO("node '{}': peer '{}' connected from {} (transport address {})", config_.name,
                    hello.name, peer, hello.transport_address);
    node::WelcomeMsg w;
    w.name = config_.name;
    w.transport_address = transport_->local_address();
    w.backend = transport_->name();
    w.regions = exported_regions();
    return w;
  }

  // Order: no new handshakes, then let running handlers answer while the transport is still up,
  // then stop the transport (which fails anything still in flight). Caller holds lifecycle_mu_ but
  // not state_mu_, so handlers finishing meanwhile may still query the node.
  void Teardown() {
    if (bootstrap_) bootstrap_->Stop();
    dispatcher_.Stop();
    transport_->stop();
  }

  const NodeConfig config_;
  std::unique_ptr<Transport> transport_;  // declared first: outlives the dispatcher's RPCs
  node::RpcDispatcher dispatcher_;
  std::mutex lifecycle_mu_;  // serializes start()/stop(); guards bootstrap_
  std::unique_ptr<node::BootstrapServer> bootstrap_;
  std::atomic<const node::BootstrapServer*> bootstrap_view_{nullptr};  // bootstrap_, lock-free
  mutable std::mutex state_mu_;                                        // held briefly only
  State state_ = State::kCreated;
  std::string bootstrap_address_;
  mutable std::mutex regions_mu_;
  std::map<std::string, Exported, std::less<>> regions_;
};

}  // namespace

Result<std::unique_ptr<Node>> Node::Create(const NodeConfig& config) {
  InitLogging();
  if (config.rpc_workers < 1 || config.rpc_workers > kMaxRpcWorkers) {
    return Status::InvalidArgument("rpc_workers must be in 1.." + std::to_string(kMaxRpcWorkers));
  }
  if (config.name.empty() || config.name.size() > node::kMaxFieldBytes) {
    return Status::InvalidArgument("node name must be 1.." + std::to_string(node::kMaxFieldBytes) +
                                   " bytes");
  }
  if (config.transport.cluster_token.size() > node::kMaxFieldBytes ||
      !PrintableAscii(config.transport.cluster_token)) {
    return Status::InvalidArgument("cluster_token must be printable ASCII of at most " +
                                   std::to_string(node::kMaxFieldBytes) + " bytes");
  }
  if (config.bootstrap_host.empty()) {
    return Status::InvalidArgument("bootstrap_host must not be empty");
  }
  const BootstrapLimits& lim = config.bootstrap_limits;
  if (lim.handshake_timeout.count() <= 0 || lim.max_open_handshakes == 0 ||
      lim.max_open_handshakes_per_address == 0 || lim.accept_backoff_min.count() <= 0 ||
      lim.accept_backoff_max < lim.accept_backoff_min) {
    return Status::InvalidArgument(
        "bootstrap_limits: timeout and limits must be positive, accept_backoff_min <= max");
  }
  FARMEM_ASSIGN_OR_RETURN(std::unique_ptr<Transport> transport,
                          Transport::Create(config.transport));
  return std::unique_ptr<Node>(std::make_unique<NodeImpl>(config, std::move(transport)));
}

Result<std::vector<RegionInfo>> DecodeRegionList(std::span<const std::byte> reply) {
  return node::DecodeRegionList(reply);
}

}  // namespace farmem
