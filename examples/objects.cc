// Example: the farmem object store (CoRM) from a program built against an installed farmem.
// Starts an embedded memory server on loopback, then allocates, writes and reads objects through
// ObjectClient — by RPC (read) and one-sidedly (direct_read) — and frees them.
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <farmem/node.h>
#include <farmem/objects.h>
#include <farmem/server.h>

namespace {

void Check(const farmem::Status& st, const char* what) {
  if (!st.ok()) {
    std::fprintf(stderr, "objects: %s failed: %s\n", what, st.ToString().c_str());
    std::exit(1);
  }
}

void Expect(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "objects: check failed: %s\n", what);
    std::exit(1);
  }
}

std::vector<std::byte> Value(size_t size, int seed) {
  std::vector<std::byte> v(size);
  for (size_t i = 0; i < size; ++i) v[i] = static_cast<std::byte>((seed * 31 + i) & 0xff);
  return v;
}

}  // namespace

int main() {
  auto server = farmem::MemoryServer::Create(farmem::ServerConfig{});
  Check(server.status(), "MemoryServer::Create");
  Check((*server)->start(), "MemoryServer::start");
  const std::string address = (*server)->node().bootstrap_address();
  std::printf("server listening at %s\n", address.c_str());

  farmem::NodeConfig nc;
  nc.name = "objects-example";
  auto node = farmem::Node::Create(nc);
  Check(node.status(), "Node::Create");
  Check((*node)->start(), "Node::start");

  const std::vector<std::string> servers{address};
  auto connected = farmem::ObjectClient::Connect(**node, servers);
  Check(connected.status(), "ObjectClient::Connect");
  farmem::ObjectClient& client = **connected;
  const farmem::ObjectServerInfo& info = client.server_info(0);
  std::printf("connected: %zu size classes, objects up to %u bytes\n", info.classes.size(),
              info.max_object_size());

  // Allocate and write a few objects of different sizes.
  const std::vector<size_t> sizes{8, 100, 1000, 3000};
  std::vector<farmem::Ptr> ptrs;
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto p = client.alloc(sizes[i]);
    Check(p.status(), "alloc");
    Check(client.write(*p, Value(sizes[i], static_cast<int>(i))), "write");
    ptrs.push_back(*p);
    std::printf("object %zu: %zu bytes, class %u, offset %#llx\n", i, sizes[i],
                unsigned{p->size_class}, static_cast<unsigned long long>(p->offset));
  }

  // Read each back through the server (RPC) and one-sidedly (no server CPU involved).
  for (size_t i = 0; i < ptrs.size(); ++i) {
    std::vector<std::byte> out(sizes[i]);
    auto n = client.read(ptrs[i], out);
    Check(n.status(), "read");
    Expect(*n == sizes[i] && out == Value(sizes[i], static_cast<int>(i)), "read returns the data");
    std::vector<std::byte> direct(sizes[i]);
    auto d = client.direct_read(ptrs[i], direct);
    Check(d.status(), "direct_read");
    Expect(*d == sizes[i] && direct == out, "direct_read returns the data");
  }
  const farmem::ObjectClientStats st = client.stats();
  std::printf("read + direct_read of %zu objects: ok (%llu one-sided reads)\n", ptrs.size(),
              static_cast<unsigned long long>(st.direct_reads));

  // Free them; reading a freed object is an error, not stale data.
  farmem::Ptr stale = ptrs[0];
  for (farmem::Ptr& p : ptrs) Check(client.free(p), "free");
  std::vector<std::byte> out(8);
  auto gone = client.read(stale, out);
  Expect(!gone.ok(), "a freed object cannot be read");
  std::printf("free: ok; reading a freed object says: %s\n", gone.status().ToString().c_str());

  connected->reset();
  (*node)->stop();
  (*server)->stop();
  std::printf("objects: all checks passed\n");
  return 0;
}
