// `farmem bench tx-bank`: one client process of a bank workload on the tx table "bank" of running
// farmemds (partitioned over all of them): init inserts the accounts, run does transfers between
// random accounts and read-only audits of every account for --seconds (threads x coroutines, each
// thread with its own Scheduler), check reads the final total. Several run processes at once
// (tests/tx_netns_test.sh: one per network namespace) make distributed transactions contend.
#include "cli/tx_bank_cmd.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/log.h"
#include "farmem/tx.h"

namespace farmem::cli {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<std::byte> Word(uint64_t v) {
  std::vector<std::byte> out(8);
  std::memcpy(out.data(), &v, 8);
  return out;
}
uint64_t U64(std::span<const std::byte> b) {
  uint64_t v = 0;
  std::memcpy(&v, b.data(), 8);
  return v;
}

struct Counts {
  std::atomic<uint64_t> transfers{0}, audits{0}, bad_audits{0}, negative{0}, aborts{0}, errors{0};
};

// One audit: every account read in one read-only transaction, committed (validated); a committed
// audit must see exactly accounts x initial and no negative balance.
Task<Status> Audit(Tx& tx, uint16_t table, const TxBankOptions& o, Counts* c) {
  uint64_t sum = 0;
  bool negative = false;
  for (uint64_t a = 0; a < o.accounts; ++a) {
    const auto key = Word(a);
    Result<std::span<const std::byte>> r = co_await tx.read(table, key);
    if (!r.ok()) co_return r.status();
    const int64_t v = static_cast<int64_t>(U64(*r));
    negative |= v < 0;
    sum += static_cast<uint64_t>(v);
  }
  Status st = co_await tx.commit();
  if (!st.ok()) co_return st;
  c->audits.fetch_add(1);
  if (sum != o.accounts * o.initial) {
    if (c->bad_audits.fetch_add(1) < 3) {
      std::fprintf(stderr, "tx-bank: committed audit saw total %llu, want %llu\n",
                   static_cast<unsigned long long>(sum),
                   static_cast<unsigned long long>(o.accounts * o.initial));
    }
  }
  if (negative) c->negative.fetch_add(1);
  co_return Status::OK();
}

// One transfer of 1..50 from account a to b (both locked by write(); a multi-participant commit
// when they live on different servers); nothing moves when a holds less than the amount.
Task<Status> Transfer(Tx& tx, uint16_t table, std::mt19937_64& rng, const TxBankOptions& o,
                      Counts* c) {
  const uint64_t a = rng() % o.accounts;
  uint64_t b = rng() % (o.accounts - 1);
  if (b >= a) ++b;
  const uint64_t amount = 1 + rng() % 50;
  const auto ka = Word(a), kb = Word(b);
  Result<std::span<std::byte>> wa = co_await tx.write(table, ka);
  if (!wa.ok()) co_return wa.status();
  Result<std::span<std::byte>> wb = co_await tx.write(table, kb);
  if (!wb.ok()) co_return wb.status();
  const uint64_t va = U64(*wa), vb = U64(*wb);
  if (va >= amount) {
    const uint64_t na = va - amount, nb = vb + amount;
    std::memcpy(wa->data(), &na, 8);
    std::memcpy(wb->data(), &nb, 8);
  }
  Status st = co_await tx.commit();
  if (st.ok()) c->transfers.fetch_add(1);
  co_return st;
}

// Whether the workers go on: until --seconds passed and this process committed --min-audits
// audits and a transfer (so a slow machine gets a checked run, not a vacuous one), at most until
// `limit`.
bool KeepGoing(Clock::time_point end, Clock::time_point limit, const TxBankOptions& o,
               const Counts& c) {
  const auto now = Clock::now();
  if (now >= limit) return false;
  return now < end || c.audits.load() < o.min_audits || c.transfers.load() == 0;
}

Task<void> Worker(TxClient* client, Scheduler* sched, uint16_t table, uint64_t seed,
                  Clock::time_point end, Clock::time_point limit, const TxBankOptions* o,
                  Counts* c) {
  Tx tx(*client, *sched);
  std::mt19937_64 rng(seed);
  while (KeepGoing(end, limit, *o, *c)) {
    // An aborted operation is retried as the same kind: audits (every account) abort on any lock
    // a transfer holds (NO_WAIT), and would never commit if a retry could become a transfer.
    const bool audit = rng() % 4 == 0;
    for (int attempt = 0; attempt < 200 && KeepGoing(end, limit, *o, *c); ++attempt) {
      tx.start();
      // if/else, not ?: — GCC miscompiles co_await inside a conditional expression.
      Status st;
      if (audit) {
        st = co_await Audit(tx, table, *o, c);
      } else {
        st = co_await Transfer(tx, table, rng, *o, c);
      }
      if (st.ok()) break;
      (void)co_await tx.abort();
      if (st.code() != Code::kAborted) {
        if (c->errors.fetch_add(1) < 3)
          std::fprintf(stderr, "tx-bank: %s\n", st.ToString().c_str());
        break;
      }
      c->aborts.fetch_add(1);
      co_await sched->sleep_for(std::chrono::microseconds(20 + rng() % 200));
    }
  }
}

// Inserts the accounts (an account already there is left as it is only on a re-run: init is for
// a fresh table, so "exists" is an error).
int Init(TxClient& client, Node& node, uint16_t table, const TxBankOptions& o) {
  auto tx = BlockingTx::Create(client, node);
  if (!tx.ok()) {
    std::fprintf(stderr, "farmem bench tx-bank: error: %s\n", tx.status().ToString().c_str());
    return 1;
  }
  for (uint64_t a = 0; a < o.accounts; ++a) {
    (*tx)->start();
    Status st = (*tx)->insert(table, Word(a), Word(o.initial));
    if (st.ok()) st = (*tx)->commit();
    if (!st.ok()) {
      std::fprintf(stderr, "farmem bench tx-bank: error: insert of account %llu: %s\n",
                   static_cast<unsigned long long>(a), st.ToString().c_str());
      return 1;
    }
  }
  std::printf("tx-bank init: %llu accounts of %llu\n", static_cast<unsigned long long>(o.accounts),
              static_cast<unsigned long long>(o.initial));
  return 0;
}

// The total over every account, in one read-only transaction (retried while it aborts).
int Check(TxClient& client, Node& node, uint16_t table, const TxBankOptions& o) {
  auto tx = BlockingTx::Create(client, node);
  if (!tx.ok()) {
    std::fprintf(stderr, "farmem bench tx-bank: error: %s\n", tx.status().ToString().c_str());
    return 1;
  }
  Status st;
  for (int attempt = 0; attempt < 100; ++attempt) {
    uint64_t total = 0;
    (*tx)->start();
    st = Status::OK();
    for (uint64_t a = 0; a < o.accounts && st.ok(); ++a) {
      auto r = (*tx)->read(table, Word(a));
      if (r.ok()) total += U64(*r);
      st = r.status();
    }
    if (st.ok()) st = (*tx)->commit();
    if (st.code() == Code::kAborted) continue;
    if (!st.ok()) break;
    const uint64_t want = o.accounts * o.initial;
    std::printf("tx-bank check: total %llu, want %llu: %s\n",
                static_cast<unsigned long long>(total), static_cast<unsigned long long>(want),
                total == want ? "conserved" : "NOT CONSERVED");
    return total == want ? 0 : 1;
  }
  std::fprintf(stderr, "farmem bench tx-bank: error: check: %s\n", st.ToString().c_str());
  return 1;
}

int Run(TxClient& client, Node& node, uint16_t table, const TxBankOptions& o) {
  Counts c;
  const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(o.seconds));
  const auto limit = end + std::chrono::seconds(o.max_extra_seconds);
  // Connected to every server: a test may now break the network under the running clients.
  std::printf("tx-bank run: started\n");
  std::fflush(stdout);
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < o.threads; ++t) {
    threads.emplace_back([&, t] {
      auto sched = node.make_scheduler();
      if (!sched.ok()) {
        std::fprintf(stderr, "tx-bank: scheduler: %s\n", sched.status().ToString().c_str());
        failed.fetch_add(1);
        return;
      }
      for (int k = 0; k < o.coroutines; ++k) {
        const uint64_t seed = o.seed * 1000003 + static_cast<uint64_t>(t * 1000 + k);
        (*sched)->spawn(Worker(&client, sched->get(), table, seed, end, limit, &o, &c));
      }
      // Bounded: every transaction call has the transport's deadline; this is the backstop.
      const auto backstop = std::chrono::milliseconds(static_cast<int64_t>(o.seconds * 1000) +
                                                      (o.max_extra_seconds + 60) * 1000);
      if (Status st = (*sched)->run(backstop); !st.ok()) {
        std::fprintf(stderr, "tx-bank: %s\n", st.ToString().c_str());
        failed.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  const TxClientStats s = client.stats();
  std::printf(
      "tx-bank run: transfers %llu audits %llu bad_audits %llu negative %llu aborts %llu "
      "(locked %llu validation %llu) errors %llu one_sided_hits %llu rpc_lookups %llu\n",
      static_cast<unsigned long long>(c.transfers.load()),
      static_cast<unsigned long long>(c.audits.load()),
      static_cast<unsigned long long>(c.bad_audits.load()),
      static_cast<unsigned long long>(c.negative.load()),
      static_cast<unsigned long long>(c.aborts.load()),
      static_cast<unsigned long long>(s.aborts[static_cast<size_t>(TxAbortReason::kLocked)]),
      static_cast<unsigned long long>(s.aborts[static_cast<size_t>(TxAbortReason::kValidation)]),
      static_cast<unsigned long long>(c.errors.load()),
      static_cast<unsigned long long>(s.one_sided_hits),
      static_cast<unsigned long long>(s.rpc_lookups));
  if (c.audits.load() < o.min_audits || c.transfers.load() == 0) {
    std::fprintf(stderr, "tx-bank: only %llu audit(s) and %llu transfer(s) committed in %.0f s\n",
                 static_cast<unsigned long long>(c.audits.load()),
                 static_cast<unsigned long long>(c.transfers.load()),
                 o.seconds + static_cast<double>(o.max_extra_seconds));
    return 1;
  }
  const bool ok = failed.load() == 0 && c.errors.load() == 0 && c.bad_audits.load() == 0 &&
                  c.negative.load() == 0;
  return ok ? 0 : 1;
}

}  // namespace

int RunTxBank(const TxBankOptions& o) {
  InitLogging();
  auto node = MakeClientNode(o.client, "farmem-tx-bank");
  if (!node.ok()) {
    std::fprintf(stderr, "farmem bench tx-bank: error: %s\n", node.status().ToString().c_str());
    return 1;
  }
  TxClientOptions to;
  // The protection the run's audits depend on, removable for the fail-without-it check
  // (docs/testing.md, "Network namespaces"): audits then commit without validating their reads.
  if (const char* f = std::getenv("FARMEM_TX_FAULT"); f && std::string(f) == "validation") {
    std::fprintf(stderr, "tx-bank: FARMEM_TX_FAULT=validation: audits skip validation\n");
    to.faults.skip_validation = true;
  }
  int rc = 1;
  {
    std::unique_ptr<Cluster> cluster;
    if (!o.cluster.url.empty()) {
      int code = 1;
      auto opened = OpenClusterForCli(o.cluster, "farmem bench tx-bank", &code);
      if (!opened.ok()) {
        (*node)->stop();
        return code;
      }
      cluster = std::move(*opened);
    }
    auto client = cluster ? TxClient::Connect(**node, *cluster, to)
                          : TxClient::Connect(**node, o.connect, to);
    if (!client.ok()) {
      std::fprintf(stderr, "farmem bench tx-bank: error: %s\n", client.status().ToString().c_str());
    } else if (auto table = (*client)->table(o.table); !table.ok()) {
      std::fprintf(stderr, "farmem bench tx-bank: error: table '%s': %s\n", o.table.c_str(),
                   table.status().ToString().c_str());
    } else if ((*client)->key_size(*table) != 8 || (*client)->value_size(*table) != 8) {
      std::fprintf(stderr, "farmem bench tx-bank: error: table '%s' needs 8-byte keys and values\n",
                   o.table.c_str());
    } else if (o.mode == "init") {
      rc = Init(**client, **node, *table, o);
    } else if (o.mode == "check") {
      rc = Check(**client, **node, *table, o);
    } else {
      rc = Run(**client, **node, *table, o);
    }
  }
  (*node)->stop();
  return rc;
}

}  // namespace farmem::cli
