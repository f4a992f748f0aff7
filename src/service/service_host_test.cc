// Tests of ServiceHost: a service may register only inside its opcode range, names and ranges
// are unique, every call is counted in STAT and /metrics, STAT is served by the host itself, and
// services start in order and stop in reverse.
#include "service/service_host.h"

#include <gtest/gtest.h>

#include "node/node_test_util.h"

namespace farmem {
namespace {

// A service whose methods, range and log of start/stop the test chooses.
class FakeService final : public Service {
 public:
  FakeService(std::string name, OpcodeRange range, std::vector<uint16_t> opcodes,
              std::vector<std::string>* log = nullptr)
      : name_(std::move(name)), range_(range), opcodes_(std::move(opcodes)), log_(log) {}

  std::string_view name() const override { return name_; }
  OpcodeRange opcodes() const override { return range_; }
  std::vector<ServiceMethod> methods() override {
    std::vector<ServiceMethod> out;
    for (uint16_t op : opcodes_) {
      out.push_back({op, name_ + "_" + std::to_string(op), RpcExecution::kWorker,
                     [op](const RpcCall& call, std::vector<std::byte>& reply) -> Status {
                       if (call.request.size() == 1) return Status::InvalidArgument("odd");
                       reply.assign(call.request.begin(), call.request.end());
                       reply.push_back(static_cast<std::byte>(op));
                       return Status::OK();
                     }});
    }
    return out;
  }
  Status start() override {
    if (log_) log_->push_back("start " + name_);
    return Status::OK();
  }
  void stop() override {
    if (log_) log_->push_back("stop " + name_);
  }
  void stats(nlohmann::json& doc) const override { doc[name_] = {{"answer", 42}}; }
  void metrics(MetricsWriter& w) const override {
    w.gauge("farmem_" + name_ + "_answer", "The answer.", 42);
  }

 private:
  std::string name_;
  OpcodeRange range_;
  std::vector<uint16_t> opcodes_;
  std::vector<std::string>* log_;
};

std::unique_ptr<Node> MakeNode() {
  auto n = Node::Create(node::testing::MakeConfig("tcp", "host-test"));
  EXPECT_TRUE(n.ok()) << n.status().ToString();
  return n.ok() ? std::move(*n) : nullptr;
}

TEST(ServiceHostTest, RefusesAnOpcodeOutsideTheServiceRange) {
  auto node = MakeNode();
  ServiceHost host(*node);
  ASSERT_TRUE(host.add(std::make_unique<FakeService>("a", kTierOpcodes,
                                                     std::vector<uint16_t>{kTxOpcodes.first}))
                  .ok());
  Status st = host.register_methods();
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("outside its range"), std::string_view::npos) << st.ToString();
}

TEST(ServiceHostTest, RefusesDuplicateNamesOverlappingRangesAndReservedRanges) {
  auto node = MakeNode();
  ServiceHost host(*node);
  ASSERT_TRUE(
      host.add(std::make_unique<FakeService>("a", kTierOpcodes, std::vector<uint16_t>{})).ok());
  EXPECT_EQ(
      host.add(std::make_unique<FakeService>("a", kTxOpcodes, std::vector<uint16_t>{})).code(),
      Code::kInvalidArgument);
  EXPECT_EQ(
      host.add(std::make_unique<FakeService>("b", OpcodeRange{120, 130}, std::vector<uint16_t>{}))
          .code(),
      Code::kInvalidArgument);
  EXPECT_EQ(
      host.add(std::make_unique<FakeService>("c", kServerOpcodes, std::vector<uint16_t>{})).code(),
      Code::kInvalidArgument);
  EXPECT_EQ(
      host.add(std::make_unique<FakeService>("d", kNodeOpcodes, std::vector<uint16_t>{})).code(),
      Code::kInvalidArgument);
}

TEST(ServiceHostTest, StartsInOrderStopsInReverse) {
  auto node = MakeNode();
  std::vector<std::string> log;
  {
    ServiceHost host(*node);
    ASSERT_TRUE(
        host.add(std::make_unique<FakeService>("a", kTierOpcodes, std::vector<uint16_t>{}, &log))
            .ok());
    ASSERT_TRUE(
        host.add(std::make_unique<FakeService>("b", kTxOpcodes, std::vector<uint16_t>{}, &log))
            .ok());
    ASSERT_TRUE(host.start().ok());
    host.stop();
    host.stop();  // idempotent
  }
  EXPECT_EQ(log, (std::vector<std::string>{"start a", "start b", "stop b", "stop a"}));
}

TEST(ServiceHostTest, CountsCallsAndServesStatAndMetricsFromTheServices) {
  auto node = MakeNode();
  ServiceHost host(*node);
  const uint16_t op = kTierOpcodes.first + 3;
  ASSERT_TRUE(
      host.add(std::make_unique<FakeService>("tier", kTierOpcodes, std::vector<uint16_t>{op}))
          .ok());
  ASSERT_TRUE(host.register_methods().ok());
  ASSERT_TRUE(host.start().ok());
  ASSERT_TRUE(node->start().ok());
  host.set_running(true);

  auto client = MakeNode();
  ASSERT_TRUE(client->start().ok());
  auto peer = client->connect(node->bootstrap_address());
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  auto sched = client->make_scheduler();
  ASSERT_TRUE(sched.ok());
  std::vector<std::byte> reply(1 << 16);
  auto call = [&](uint16_t opcode, std::vector<std::byte> req) {
    return (*sched)->block_on((*sched)->rpc(peer->id, RpcImm(opcode), req, reply));
  };
  auto ok = call(op, {std::byte{7}, std::byte{8}});
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->length, 3u);
  EXPECT_EQ(reply[2], static_cast<std::byte>(op));
  EXPECT_EQ(call(op, {std::byte{1}}).status().code(), Code::kInvalidArgument);

  auto stat = call(kOpStat, {});
  ASSERT_TRUE(stat.ok()) << stat.status().ToString();
  const auto j =
      nlohmann::json::parse(std::string(reinterpret_cast<const char*>(reply.data()), stat->length));
  EXPECT_EQ(j["services"], nlohmann::json({"tier"}));
  EXPECT_EQ(j["tier"]["answer"], 42);
  const std::string name = "tier_" + std::to_string(op);
  EXPECT_EQ(j["rpc"][name]["calls"], 2);
  EXPECT_EQ(j["rpc"][name]["errors"], 1);
  EXPECT_EQ(j["rpc"][name]["service"], "tier");
  EXPECT_EQ(j["rpc"]["stat"]["calls"], 1);
  EXPECT_EQ(j["node"], "host-test");
  EXPECT_FALSE(j["bootstrap"].get<std::string>().empty());

  const std::string text = host.metrics();
  EXPECT_NE(text.find("farmem_rpc_calls_total{service=\"tier\",op=\"" + name + "\"} 2\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("farmem_rpc_errors_total{service=\"tier\",op=\"" + name + "\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("farmem_tier_answer 42\n"), std::string::npos);
  node->stop();
  host.stop();
}

// Sections for parts of the process that are not services (farmemd's "cluster"): added, replaced
// and removed at any time, filled on every STAT.
TEST(ServiceHostTest, StatSectionsOutsideTheServices) {
  auto node = MakeNode();
  ServiceHost host(*node);
  EXPECT_FALSE(host.stats().contains("cluster"));
  int calls = 0;
  host.set_stats_section("cluster", [&calls] { return nlohmann::json{{"n", ++calls}}; });
  EXPECT_EQ(host.stats()["cluster"]["n"], 1);
  EXPECT_EQ(host.stats()["cluster"]["n"], 2);
  host.set_stats_section("cluster", [] { return nlohmann::json("replaced"); });
  EXPECT_EQ(host.stats()["cluster"], "replaced");
  host.set_stats_section("cluster", nullptr);
  EXPECT_FALSE(host.stats().contains("cluster"));
}

}  // namespace
}  // namespace farmem
