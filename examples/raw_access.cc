// Example: raw one-sided access to remote memory with farmem, built against an installed farmem.
// Starts an embedded memory server on loopback, connects a client node, allocates a range with
// RawClient and writes, reads, compare-and-swaps and fetch-and-adds it one-sidedly, then frees it.
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <farmem/client.h>
#include <farmem/node.h>
#include <farmem/server.h>

namespace {

// Exits the program with status 1 if `st` is an error.
void Check(const farmem::Status& st, const char* what) {
  if (!st.ok()) {
    std::fprintf(stderr, "raw_access: %s failed: %s\n", what, st.ToString().c_str());
    std::exit(1);
  }
}

void Expect(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "raw_access: check failed: %s\n", what);
    std::exit(1);
  }
}

}  // namespace

int main() {
  // 1. A memory server in this process, with the default configuration (loopback, native TCP).
  auto server = farmem::MemoryServer::Create(farmem::ServerConfig{});
  Check(server.status(), "MemoryServer::Create");
  Check((*server)->start(), "MemoryServer::start");
  const std::string address = (*server)->node().bootstrap_address();
  std::printf("server listening at %s\n", address.c_str());

  // 2. A client node (same defaults: loopback, native TCP, the default cluster token).
  farmem::NodeConfig nc;
  nc.name = "raw-access-example";
  auto node = farmem::Node::Create(nc);
  Check(node.status(), "Node::Create");
  Check((*node)->start(), "Node::start");

  // 3. Connect (bootstrap handshake) and allocate 4 KiB of remote memory.
  auto client = farmem::RawClient::Connect(**node, address);
  Check(client.status(), "RawClient::Connect");
  auto alloc = (*client)->alloc_raw(4096);
  Check(alloc.status(), "alloc_raw");
  const farmem::RemoteRef ref = alloc->ref;
  std::printf("allocated %" PRIu64 " bytes at key %#" PRIx64 " offset %" PRIu64 "\n", alloc->length,
              ref.key, ref.offset);

  // 4. One-sided access through a coroutine scheduler (block_on runs one operation to the end).
  auto sched = (*node)->make_scheduler();
  Check(sched.status(), "make_scheduler");
  farmem::Scheduler& s = **sched;

  std::vector<uint64_t> data(512);
  for (size_t i = 0; i < data.size(); ++i) data[i] = i * 3 + 1;
  Check(s.block_on(s.write(ref, data.data(), data.size() * 8, /*delivery_complete=*/true)),
        "write");
  std::vector<uint64_t> back(data.size(), 0);
  Check(s.block_on(s.read(ref, back.data(), back.size() * 8)), "read");
  Expect(back == data, "read returns what was written");
  std::printf("write + read of 4096 bytes: ok\n");

  auto cas = s.block_on(s.compare_swap(ref, /*expected=*/1, /*desired=*/100));
  Check(cas.status(), "compare_swap");
  Expect(*cas == 1, "CAS sees the old value 1");
  auto cas2 = s.block_on(s.compare_swap(ref, /*expected=*/1, /*desired=*/200));
  Check(cas2.status(), "compare_swap");
  Expect(*cas2 == 100, "second CAS fails: the word is 100");
  std::printf("CAS 1 -> 100: ok (old %" PRIu64 "); CAS 1 -> 200: not swapped (word %" PRIu64 ")\n",
              *cas, *cas2);

  farmem::RemoteRef counter = ref;
  counter.offset += 8;  // data[1] == 4
  uint64_t last = 0;
  for (int i = 0; i < 5; ++i) {
    auto faa = s.block_on(s.fetch_add(counter, 10));
    Check(faa.status(), "fetch_add");
    last = *faa;
  }
  uint64_t final_value = 0;
  Check(s.block_on(s.read(counter, &final_value, sizeof(final_value))), "read counter");
  Expect(last == 44 && final_value == 54, "5 x FAA(+10) on 4 gives 54");
  std::printf("5 x FAA +10: counter 4 -> %" PRIu64 ": ok\n", final_value);

  // 5. The server's STAT document, as JSON text.
  auto stats = (*client)->stats_json();
  Check(stats.status(), "stats_json");
  std::printf("STAT: %zu bytes of JSON\n", stats->size());

  // 6. Free the range; a second free is rejected.
  Check((*client)->free_raw(ref), "free_raw");
  Expect(!(*client)->free_raw(ref).ok(), "a double free is rejected");
  std::printf("free: ok; double free rejected\n");

  // Tear down in reverse: the scheduler and the client before the node they use.
  sched->reset();
  client->reset();
  (*node)->stop();
  (*server)->stop();
  std::printf("raw_access: all checks passed\n");
  return 0;
}
