#!/usr/bin/env bash
# scripts/bench_tx_netns end to end, tiny: `farmem bench tx --servers` in ns1 against a farmemd per
# namespace writes its TATP target (one-two-sided / RPC-only, 5 interleaved rounds) and the
# farmemds' CPU; nothing is left after a run, nor after a client that fails inside the cluster;
# without root it refuses with the reason. Needs root and 'ip netns' (else SKIP).
# NETNS_CLUSTER_FAULT=no_teardown (the harness leaves its namespaces) must make it fail.
set -euo pipefail

FARMEM="${1:?usage: $0 path/to/farmem path/to/farmemd}"
FARMEMD="${2:?usage: $0 path/to/farmem path/to/farmemd}"
TEST_NAME=bench_tx_netns
WORK="$(mktemp -d -t farmem-btx.XXXXXX)"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
netns_test_start
BENCH="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/scripts/bench_tx_netns"
SMALL=(--rounds 5 --seconds 0.1 --subscribers 300 --threads 1 --inflight 4)

leftovers() { ip netns list 2>/dev/null | grep "^$NETNS_PREFIX[123]\b" || true; }

# Without root: a clear refusal before anything is created.
if id nobody >/dev/null 2>&1 && runuser -u nobody -- test -x "$BENCH" 2>/dev/null; then
  rc=0
  runuser -u nobody -- "$BENCH" --farmem "$FARMEM" --farmemd "$FARMEMD" >"$WORK/nonroot.out" \
    2>&1 || rc=$?
  ((rc == 1)) || fail "as nobody: exit $rc, want 1"
  grep -q 'need root' "$WORK/nonroot.out" || fail "as nobody: no reason given: $(cat "$WORK/nonroot.out")"
  log "as nobody: $(cat "$WORK/nonroot.out")"
else
  log "no 'nobody' user that can run $BENCH: the non-root refusal is not checked"
fi

start=$(date +%s%N)
"$BENCH" --farmem "$FARMEM" --farmemd "$FARMEMD" --json "$WORK/tx.json" -- "${SMALL[@]}" \
  >"$WORK/run.out" 2>"$WORK/run.err" || fail "the benchmark failed"
[[ -z "$(leftovers)" ]] || fail "left after a run: $(leftovers)"
python3 - "$WORK/tx.json" <<'EOF' || fail "tx.json lacks the netns target or the servers' CPU"
import json, sys
j = json.load(open(sys.argv[1]))
t = [t for t in j["targets"] if "3 servers] tatp committed tx/s one-two-sided / RPC-only" in t["name"]]
assert len(t) == 1 and t[0]["result"] in ("PASS", "MISS") and len(t[0]["round_ratios"]) == 5, t
assert t[0]["limit"] == ">= 1.15x", t[0]["limit"]
cpu = j["netns"]["servers_cpu_seconds"]
assert len(cpu) == 3 and all(c > 0 for c in cpu), cpu
assert len(j["options"]["servers"]) == 3, j["options"]
EOF
log "run: $(grep -m1 'tatp committed' "$WORK/run.out" | tr -s ' ') in $((($(date +%s%N) - start) / 1000000)) ms"

# A client that fails inside the cluster (a flag given twice: exit 2 there) fails the script,
# and the namespaces still go.
rc=0
"$BENCH" --farmem "$FARMEM" --farmemd "$FARMEMD" --json "" -- "${SMALL[@]}" --token twice \
  >"$WORK/bad.out" 2>"$WORK/bad.err" || rc=$?
((rc != 0)) || fail "a failing client gave exit 0"
[[ -z "$(leftovers)" ]] || fail "left after a failing client: $(leftovers)"
log "failing client: exit $rc, nothing left"
log "PASS"
