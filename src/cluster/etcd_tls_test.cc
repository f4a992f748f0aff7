// Tests of the etcd backend over TLS against a real etcd (EtcdProcess::StartTls) with a throwaway
// PKI made by /usr/bin/openssl: server TLS (trusted / untrusted / wrong host), mutual TLS,
// fail-over past an endpoint whose certificate is not trusted, and Cluster::Open with an etcds://
// URL.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cluster/backend.h"
#include "cluster/cluster_test_util.h"
#include "cluster/testing/etcd_process.h"
#include "farmem/cluster.h"

namespace farmem::cluster {
namespace {

using std::chrono::milliseconds;
using testing::EtcdAvailable;
using testing::EtcdProcess;
using testing::EtcdTls;
using testing::Soon;

constexpr const char* kOpenssl = "/usr/bin/openssl";

// Runs argv to completion with stdout+stderr appended to `log`; Internal unless it exits 0.
Status Run(const std::vector<std::string>& args, const std::string& log) {
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_APPEND,
                                   0644);
  posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
  pid_t pid = -1;
  int rc = ::posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return Status::FromErrno("posix_spawn " + args[0], rc);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return Status::Internal(args[0] + " " + args[1] + " failed; see " + log);
  }
  return Status::OK();
}

// A throwaway PKI (P-256 keys, valid for two days): two unrelated CAs, a server certificate for
// IP:127.0.0.1 from each, and a client certificate from each.
struct Pki {
  std::string dir;
  std::string ca, other_ca;                         // CA certificates
  std::string server_cert, server_key;              // signed by ca
  std::string other_server_cert, other_server_key;  // signed by other_ca (an impostor)
  std::string client_cert, client_key;              // signed by ca
  std::string other_client_cert, other_client_key;  // signed by other_ca

  Status Make(const std::string& where) {
    dir = where;
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return Status::Internal("mkdir " + dir + ": " + ec.message());
    FARMEM_RETURN_IF_ERROR(MakeCa("ca"));
    FARMEM_RETURN_IF_ERROR(MakeCa("other_ca"));
    const std::string server_ext =
        "subjectAltName=IP:127.0.0.1\n"
        "basicConstraints=CA:FALSE\n"
        // clientAuth too: etcd's own gateway dials its gRPC port with the server certificate,
        // which --client-cert-auth checks like any client's.
        "extendedKeyUsage=serverAuth,clientAuth\n";
    const std::string client_ext = "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n";
    FARMEM_RETURN_IF_ERROR(MakeCert("server", "ca", "127.0.0.1", server_ext));
    FARMEM_RETURN_IF_ERROR(MakeCert("other_server", "other_ca", "127.0.0.1", server_ext));
    FARMEM_RETURN_IF_ERROR(MakeCert("client", "ca", "farmem-client", client_ext));
    FARMEM_RETURN_IF_ERROR(MakeCert("other_client", "other_ca", "farmem-client", client_ext));
    ca = Crt("ca");
    other_ca = Crt("other_ca");
    server_cert = Crt("server");
    server_key = Key("server");
    other_server_cert = Crt("other_server");
    other_server_key = Key("other_server");
    client_cert = Crt("client");
    client_key = Key("client");
    other_client_cert = Crt("other_client");
    other_client_key = Key("other_client");
    return Status::OK();
  }

 private:
  std::string Crt(const std::string& name) const { return dir + "/" + name + ".crt"; }
  std::string Key(const std::string& name) const { return dir + "/" + name + ".key"; }
  std::string Log() const { return dir + "/openssl.log"; }

  Status MakeCa(const std::string& name) {
    return Run({kOpenssl, "req", "-x509", "-newkey", "ec", "-pkeyopt",
                "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", Key(name), "-out", Crt(name),
                "-days", "2", "-subj", "/CN=farmem-test-" + name},
               Log());
  }

  Status MakeCert(const std::string& name, const std::string& ca_name, const std::string& cn,
                  const std::string& ext) {
    const std::string csr = dir + "/" + name + ".csr";
    const std::string ext_file = dir + "/" + name + ".ext";
    std::ofstream(ext_file) << ext;
    FARMEM_RETURN_IF_ERROR(
        Run({kOpenssl, "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", Key(name), "-out", csr, "-subj", "/CN=" + cn},
            Log()));
    return Run({kOpenssl, "x509", "-req", "-in", csr, "-CA", Crt(ca_name), "-CAkey", Key(ca_name),
                "-CAcreateserial", "-out", Crt(name), "-days", "2", "-extfile", ext_file},
               Log());
  }
};

class EtcdTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!EtcdAvailable()) GTEST_SKIP() << testing::EtcdBinary() << " not installed";
    if (::access(kOpenssl, X_OK) != 0) GTEST_SKIP() << kOpenssl << " not installed";
    Status s = etcd_.Prepare();
    ASSERT_TRUE(s.ok()) << s.ToString();
    s = pki_.Make(etcd_.dir() + "/pki");
    ASSERT_TRUE(s.ok()) << s.ToString();
  }

  // etcd with the server certificate signed by pki_.ca; with `mutual`, clients must present a
  // certificate signed by pki_.ca too.
  void StartEtcd(EtcdProcess& etcd, bool mutual) {
    EtcdTls tls;
    tls.cert_file = pki_.server_cert;
    tls.key_file = pki_.server_key;
    tls.ca_file = pki_.ca;
    if (mutual) {
      tls.client_cert_auth = true;
      tls.trusted_ca_file = pki_.ca;
      tls.client_cert_file = pki_.client_cert;
      tls.client_key_file = pki_.client_key;
    }
    Status s = etcd.StartTls(tls);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }

  static std::unique_ptr<ClusterBackend> Open(std::vector<std::string> endpoints,
                                              const ClusterOptions& options, bool tls = true) {
    auto b = OpenEtcdBackend(endpoints, tls, options);
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    return b.ok() ? std::move(b).value() : nullptr;
  }

  // put, get, range and a watch all work through `b`; the value is really in etcd (etcdctl).
  void ExpectWorks(ClusterBackend& b, const std::string& prefix) {
    testing::WatchCollector c;
    auto w = b.watch(prefix, 0, c.Events(), c.Errors());
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    auto p = b.put(prefix + "k", "v1", 0, std::nullopt, Soon());
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    auto g = b.get(prefix + "k", Soon());
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_EQ(g->value, "v1");
    EXPECT_EQ(g->mod_revision, *p);
    auto r = b.range(prefix, Soon());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->kvs.size(), 1u);
    ASSERT_TRUE(b.put(prefix + "k", "v2", 0, std::nullopt, Soon()).ok());
    ASSERT_TRUE(c.WaitEvents(2)) << "watch over TLS delivered " << c.Count() << " of 2 events";
    {
      std::lock_guard<std::mutex> lock(c.mu);
      EXPECT_EQ(c.events[0].kv.value, "v1");
      EXPECT_EQ(c.events[1].kv.value, "v2");
      EXPECT_TRUE(c.errors.empty());
    }
    std::string out;
    ASSERT_TRUE(etcd_.Etcdctl({"get", "--print-value-only", prefix + "k"}, &out).ok()) << out;
    EXPECT_EQ(out, "v2\n");
  }

  // Every unary call fails with Unavailable well within call_timeout, saying why (`mention`, and
  // not `not_mention`), and a watch delivers nothing, reports no error (the store may come back)
  // and cancels at once.
  void ExpectFailsCleanly(ClusterBackend& b, const std::string& mention,
                          const std::string& not_mention = "") {
    // Long enough that four handshakes fit in it under TSan (2.7 s measured there for the four;
    // a 2 s budget failed a CI run), short enough that calls waiting for their deadline instead
    // of failing at the handshake (40 s for the four) are told apart.
    const milliseconds call_timeout(10000);
    auto t0 = Clock::now();
    auto g = b.get("/tls/k", Clock::now() + call_timeout);
    auto p = b.put("/tls/k", "x", 0, std::nullopt, Clock::now() + call_timeout);
    auto r = b.revision(Clock::now() + call_timeout);
    auto l = b.lease_grant(milliseconds(5000), Clock::now() + call_timeout);
    auto took = Clock::now() - t0;
    for (const Status& s : {g.status(), p.status(), r.status(), l.status()}) {
      EXPECT_EQ(s.code(), Code::kUnavailable) << s.ToString();
      EXPECT_NE(s.message().find(mention), std::string::npos) << s.ToString();
      if (!not_mention.empty()) {
        EXPECT_EQ(s.message().find(not_mention), std::string::npos) << s.ToString();
      }
    }
    // Four calls, each of which fails in the handshake rather than at its deadline.
    EXPECT_LT(took, call_timeout) << "took " << (took / milliseconds(1)) << " ms";

    testing::WatchCollector c;
    auto w = b.watch("/tls/", 1, c.Events(), c.Errors());
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    std::this_thread::sleep_for(milliseconds(300));
    auto c0 = Clock::now();
    (*w)->cancel();
    EXPECT_LT(Clock::now() - c0, milliseconds(1000));
    std::lock_guard<std::mutex> lock(c.mu);
    EXPECT_TRUE(c.events.empty());
    EXPECT_TRUE(c.errors.empty());
  }

  EtcdProcess etcd_;
  Pki pki_;
};

// ---- server TLS -------------------------------------------------------------------------------

TEST_F(EtcdTlsTest, ServerTlsWithTheCaWorks) {
  StartEtcd(etcd_, /*mutual=*/false);
  ClusterOptions o;
  o.tls_ca_file = pki_.ca;
  auto b = Open({etcd_.endpoint()}, o);
  ASSERT_NE(b, nullptr);
  ExpectWorks(*b, "/tls/");
  // tls_ca_file alone asks for TLS (no etcds:// needed), and so does an https:// endpoint.
  auto implied = Open({etcd_.endpoint()}, o, /*tls=*/false);
  auto ir = implied->revision(Soon());
  EXPECT_TRUE(ir.ok()) << ir.status().ToString();
  auto https = Open({"https://" + etcd_.endpoint()}, o, /*tls=*/false);
  auto hr = https->revision(Soon());
  EXPECT_TRUE(hr.ok()) << hr.status().ToString();
}

TEST_F(EtcdTlsTest, ServerTlsUntrustedFailsCleanly) {
  StartEtcd(etcd_, /*mutual=*/false);
  // A CA that did not sign the server's certificate.
  ClusterOptions other;
  other.tls_ca_file = pki_.other_ca;
  auto b = Open({etcd_.endpoint()}, other);
  ASSERT_NE(b, nullptr);
  ExpectFailsCleanly(*b, "certificate");
  // No CA at all: the system's trust store does not know the throwaway CA either.
  auto system = Open({etcd_.endpoint()}, ClusterOptions{});
  ExpectFailsCleanly(*system, "certificate");
  // The right CA but the wrong name: the certificate is for IP:127.0.0.1, not "localhost".
  ClusterOptions right;
  right.tls_ca_file = pki_.ca;
  auto wrong_host = Open({"localhost:" + std::to_string(etcd_.client_port())}, right);
  ExpectFailsCleanly(*wrong_host, "certificate");
  // Plain HTTP to the TLS port.
  auto plain = Open({etcd_.endpoint()}, ClusterOptions{}, /*tls=*/false);
  auto pr = plain->revision(Soon());
  EXPECT_EQ(pr.status().code(), Code::kUnavailable) << pr.status().ToString();
  // None of that disturbed etcd or a good client.
  auto good = Open({etcd_.endpoint()}, right);
  auto gr = good->revision(Soon());
  EXPECT_TRUE(gr.ok()) << gr.status().ToString();
}

// A TLS handshake that fails sends nothing, so the call moves on to the next endpoint, like for a
// refused connection (the first etcd here presents a certificate of another CA).
TEST_F(EtcdTlsTest, FailsOverPastAnEndpointWithAnUntrustedCertificate) {
  EtcdProcess impostor;
  EtcdTls tls;
  tls.cert_file = pki_.other_server_cert;
  tls.key_file = pki_.other_server_key;
  ASSERT_TRUE(impostor.StartTls(tls).ok());
  StartEtcd(etcd_, /*mutual=*/false);
  ClusterOptions o;
  o.tls_ca_file = pki_.ca;
  auto b = Open({impostor.endpoint(), etcd_.endpoint()}, o);
  ASSERT_NE(b, nullptr);
  auto p = b->put("/tls/failover", "v", 0, std::nullopt, Soon());
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  std::string out;
  ASSERT_TRUE(etcd_.Etcdctl({"get", "--print-value-only", "/tls/failover"}, &out).ok()) << out;
  EXPECT_EQ(out, "v\n");
  // Only the impostor: the error names its certificate.
  auto only = Open({impostor.endpoint()}, o)->get("/tls/failover", Soon());
  EXPECT_EQ(only.status().code(), Code::kUnavailable);
  EXPECT_NE(only.status().message().find("certificate"), std::string::npos)
      << only.status().ToString();
}

// ---- mutual TLS -------------------------------------------------------------------------------

TEST_F(EtcdTlsTest, MutualTlsWithAClientCertificateWorks) {
  StartEtcd(etcd_, /*mutual=*/true);
  ClusterOptions o;
  o.tls_ca_file = pki_.ca;
  o.tls_cert_file = pki_.client_cert;
  o.tls_key_file = pki_.client_key;
  auto b = Open({etcd_.endpoint()}, o);
  ASSERT_NE(b, nullptr);
  ExpectWorks(*b, "/mtls/");
}

TEST_F(EtcdTlsTest, MutualTlsWithoutAnAcceptedClientCertificateFailsCleanly) {
  StartEtcd(etcd_, /*mutual=*/true);
  // No client certificate: etcd drops the connection after the handshake (with TLS 1.3 the client
  // learns it only when it sends or reads), so curl reports a send/receive failure ("alert bad
  // certificate", "connection reset", depending on timing) — never a problem with the server's
  // certificate, which the client trusts.
  ClusterOptions none;
  none.tls_ca_file = pki_.ca;
  auto b = Open({etcd_.endpoint()}, none);
  ASSERT_NE(b, nullptr);
  ExpectFailsCleanly(*b, "etcd 127.0.0.1:", "SSL certificate problem");
  // A client certificate from a CA etcd does not trust.
  ClusterOptions other = none;
  other.tls_cert_file = pki_.other_client_cert;
  other.tls_key_file = pki_.other_client_key;
  auto ob = Open({etcd_.endpoint()}, other);
  ExpectFailsCleanly(*ob, "etcd 127.0.0.1:", "SSL certificate problem");
  // A certificate without its key is refused by curl before anything is sent.
  ClusterOptions no_key = none;
  no_key.tls_cert_file = pki_.client_cert;
  auto nk = Open({etcd_.endpoint()}, no_key)->revision(Soon());
  EXPECT_EQ(nk.status().code(), Code::kUnavailable) << nk.status().ToString();
  // The accepted one still works afterwards.
  ClusterOptions good = none;
  good.tls_cert_file = pki_.client_cert;
  good.tls_key_file = pki_.client_key;
  auto gr = Open({etcd_.endpoint()}, good)->revision(Soon());
  EXPECT_TRUE(gr.ok()) << gr.status().ToString();
}

// ---- public API -------------------------------------------------------------------------------

TEST_F(EtcdTlsTest, ClusterOpenWithEtcdsUrlJoinsAndListsMembers) {
  StartEtcd(etcd_, /*mutual=*/false);
  ASSERT_EQ(etcd_.url().rfind("etcds://127.0.0.1:", 0), 0u) << etcd_.url();
  ClusterOptions o;
  o.url = etcd_.url();
  o.cluster_name = "tls";
  o.create_if_missing = true;
  o.tls_ca_file = pki_.ca;
  auto c = Cluster::Open(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ClusterMember self;
  self.name = "node-a";
  self.address = "127.0.0.1:7000";
  self.roles = {"memory"};
  self.capacity_bytes = 1 << 20;
  Status j = (*c)->join(self);
  ASSERT_TRUE(j.ok()) << j.ToString();
  // A second client (over its own TLS connections) sees the member and its metadata.
  auto c2 = Cluster::Open(o);
  ASSERT_TRUE(c2.ok()) << c2.status().ToString();
  auto members = (*c2)->members();
  ASSERT_TRUE(members.ok()) << members.status().ToString();
  ASSERT_EQ(members->size(), 1u);
  EXPECT_EQ((*members)[0].name, "node-a");
  EXPECT_EQ((*members)[0].address, "127.0.0.1:7000");
  EXPECT_GT((*members)[0].lease_left.count(), 0);
  ASSERT_TRUE((*c)->put("where/x", "node-a").ok());
  auto g = (*c2)->get("where/x");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->value, "node-a");
  ASSERT_TRUE((*c)->leave().ok());
  EXPECT_TRUE((*c2)->members()->empty());

  // The etcds:// URL without a CA that trusts the server: Open says so, within call_timeout.
  ClusterOptions untrusted = o;
  untrusted.tls_ca_file = pki_.other_ca;
  auto t0 = Clock::now();
  auto bad = Cluster::Open(untrusted);
  EXPECT_LT(Clock::now() - t0, untrusted.call_timeout);
  EXPECT_EQ(bad.status().code(), Code::kUnavailable) << bad.status().ToString();
  EXPECT_NE(bad.status().message().find("certificate"), std::string::npos)
      << bad.status().ToString();
}

}  // namespace
}  // namespace farmem::cluster
