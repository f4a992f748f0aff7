// `farmem bench tx-bank` (hidden; tests/tx_netns_test.sh, tests/cluster_cli_test.sh): a bank
// workload on running farmemds' tx tables, one client process of many. Header-only flag
// registration (main.cc, which links CLI11, includes it); the command itself is tx_bank_cmd.cc.
// Main thread only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/commands.h"

namespace farmem::cli {

struct TxBankOptions {
  ClientOptions client;
  std::vector<std::string> connect;  // every farmemd holding a partition of the table, or
  ClusterClientOptions cluster;      // url set: the members with role "tx" (TxClient::Connect)
  std::string mode;                  // init | run | check
  std::string table = "bank";        // key and value 8 bytes
  uint64_t accounts = 60;
  uint64_t initial = 1000;     // each account's balance at init; the total is accounts x initial
  double seconds = 3;          // run: how long to keep transferring and auditing, at least
  uint64_t min_audits = 5;     // run: go on after --seconds until this many audits committed
  int max_extra_seconds = 60;  // run: ... but no longer than this past --seconds
  int threads = 2;             // run: client threads (one Scheduler each)
  int coroutines = 4;          // run: transactions in flight per thread
  uint64_t seed = 1;           // run: different per client process
};

// Exit code: 0 the invariant held (run: every committed audit saw the exact total and no negative
// balance, no error, and --min-audits audits and a transfer committed; check: the total is
// conserved), 1 it did not or a call failed, 2 usage.
int RunTxBank(const TxBankOptions& options);

inline CLI::App* AddTxBankCommand(CLI::App& bench, TxBankOptions& o) {
  CLI::App* cmd = bench.add_subcommand("tx-bank", "");
  cmd->group("");  // hidden: a test client (tests/tx_netns_test.sh, docs/testing.md)
  cmd->add_option("mode", o.mode)->required()->check(CLI::IsMember({"init", "run", "check"}));
  cmd->add_option("--connect", o.connect)->delimiter(',');  // or --cluster (main.cc)
  cmd->add_option("--table", o.table);
  cmd->add_option("--accounts", o.accounts)->check(CLI::Range(2ull, 1000000ull));
  cmd->add_option("--initial", o.initial)->check(CLI::Range(1ull, 1000000000ull));
  cmd->add_option("--seconds", o.seconds)->check(CLI::Range(0.1, 3600.0));
  cmd->add_option("--min-audits", o.min_audits)->check(CLI::Range(0ull, 1000000ull));
  cmd->add_option("--max-extra-seconds", o.max_extra_seconds)->check(CLI::Range(0, 3600));
  cmd->add_option("--threads", o.threads)->check(CLI::Range(1, 64));
  cmd->add_option("--coroutines", o.coroutines)->check(CLI::Range(1, 256));
  cmd->add_option("--seed", o.seed);
  cmd->add_option("--op-timeout-ms", o.client.op_timeout_ms)->check(CLI::Range(1u, 600000u));
  return cmd;
}

}  // namespace farmem::cli
