#!/usr/bin/env bash
# scripts/bench_tx_netns end to end, tiny: `farmem bench tx --servers` in ns1 against a farmemd per
# namespace and a redis-server in ns2 writes the KV targets (latency, one-sided shares, server CPU
# from /proc, throughput), the TATP ones (vs RPC-only, Redis Lua, WATCH/MULTI/EXEC; 5 interleaved
# rounds) and the farmemds' CPU; nothing is left after a run (namespaces, Redis), nor after a
# client that fails inside the cluster; without root it refuses with the reason. Needs root and
# 'ip netns' (else SKIP); without redis-server it checks the rest.
# NETNS_CLUSTER_FAULT=no_teardown (the harness leaves its namespaces) and
# BENCH_TX_NETNS_FAULT=no_redis (the client is not told where Redis is) must make it fail.
set -euo pipefail

FARMEM="${1:?usage: $0 path/to/farmem path/to/farmemd}"
FARMEMD="${2:?usage: $0 path/to/farmem path/to/farmemd}"
TEST_NAME=bench_tx_netns
WORK="$(mktemp -d -t farmem-btx.XXXXXX)"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
netns_test_start
BENCH="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/scripts/bench_tx_netns"
SMALL=(--rounds 5 --seconds 0.2 --subscribers 300 --threads 1 --inflight 4 --kv-keys 3000
  --latency-samples 100)
HAVE_REDIS=0
if command -v redis-server >/dev/null 2>&1; then HAVE_REDIS=1; fi

leftovers() { ip netns list 2>/dev/null | grep "^$NETNS_PREFIX[123]\b" || true; }

# Without root: a clear refusal before anything is created.
expect_root_refused "$BENCH" --farmem "$FARMEM" --farmemd "$FARMEMD"

start=$(date +%s%N)
"$BENCH" --farmem "$FARMEM" --farmemd "$FARMEMD" --json "$WORK/tx.json" -- "${SMALL[@]}" \
  >"$WORK/run.out" 2>"$WORK/run.err" || fail "the benchmark failed"
[[ -z "$(leftovers)" ]] || fail "left after a run: $(leftovers)"
python3 - "$WORK/tx.json" "$HAVE_REDIS" <<'EOF' || fail "tx.json lacks a netns target or the CPU"
import json, os, sys
j, have_redis = json.load(open(sys.argv[1])), sys.argv[2] == "1"
def one(name, rounds=5, limit=None):
    t = [t for t in j["targets"] if t["name"] == "[tcp, 3 servers] " + name]
    assert len(t) == 1, (name, [t["name"] for t in j["targets"]])
    t = t[0]
    assert t["result"] in ("PASS", "MISS"), t  # judged: not n/a
    if rounds:  # a round whose baseline completed nothing (a loaded machine) has no ratio
        assert 1 <= len(t["round_ratios"]) <= rounds, t
        assert t["ratio_min"] <= t["ratio"] <= t["ratio_max"], t
    assert limit is None or t["limit"] == limit, (t["limit"], limit)
one("tatp committed tx/s one-two-sided / RPC-only", limit=">= 1.15x")
tatp = j["results"]["tcp, 3 servers"]["tatp"]["configs"]
for c in ("one-two-sided", "rpc-only") + (("redis-lua", "redis-watch-multi-exec") if have_redis else ()):
    assert len(tatp[c]["round_tx_per_s"]) == 5, (c, tatp[c])  # interleaved: 5 rounds each
one("kv lookup p50 one-sided / RPC", limit="<= 0.9x")
one("kv one-sided share, cold cache (%)", rounds=0)
one("kv one-sided share, warm cache (%)", rounds=0)
one("kv server CPU per M lookups RPC-only / one-two-sided", limit=">= 1.3x")
one("kv throughput one-two-sided / RPC-only", limit=">= 1.4x")
one("kv throughput perfect / RPC-only", limit=">= 1.8x")
kv = j["results"]["tcp, 3 servers"]["kv"]
# Per configuration 5 rounds; a 0.1 s round on a loaded machine may complete no lookup (its CPU
# per lookup is then null), so the median and some round must be positive, not every round.
for c in ("rpc-only", "one-two-sided", "perfect", "rpc-only zipf", "perfect zipf"):
    v, cpu = kv["throughput"][c], kv["server_cpu_s_per_m"][c]
    assert len(v) == 5 and sorted(v)[2] > 0, (c, v)
    assert len(cpu) == 5 and any(x is not None and x > 0 for x in cpu), (c, cpu)
if have_redis:
    one("tatp tx/s one-two-sided / Redis Lua", limit=">= 1.5x")
    one("tatp tx/s one-two-sided / Redis WATCH/MULTI/EXEC", limit=">= 3x")
    r = j["netns"]["redis"]
    assert r["namespace"] == "ns2" and r["cpu_seconds"] > 0, r
    try:  # teardown: the redis-server has gone
        os.kill(r["pid"], 0)
        raise AssertionError(f"redis-server pid {r['pid']} still runs")
    except ProcessLookupError:
        pass
assert len(j["machine"]["loadavg_at_start"]) == 3 and len(j["machine"]["loadavg_at_end"]) == 3
cpu = j["netns"]["servers_cpu_seconds"]
assert len(cpu) == 3 and all(c > 0 for c in cpu), cpu
assert len(j["options"]["servers"]) == 3, j["options"]
EOF
log "run: $(grep -m1 'tatp committed' "$WORK/run.out" | tr -s ' ') in $((($(date +%s%N) - start) / 1000000)) ms"
log "run: $(grep -m1 'kv lookup p50' "$WORK/run.out" | tr -s ' ')"
((HAVE_REDIS == 0)) || log "run: $(grep -m1 'Redis Lua' "$WORK/run.out" | tr -s ' ')"

# A client that fails inside the cluster (a flag given twice: exit 2 there) fails the script,
# and the namespaces still go.
rc=0
"$BENCH" --farmem "$FARMEM" --farmemd "$FARMEMD" --json "" -- "${SMALL[@]}" --token twice \
  >"$WORK/bad.out" 2>"$WORK/bad.err" || rc=$?
((rc != 0)) || fail "a failing client gave exit 0"
[[ -z "$(leftovers)" ]] || fail "left after a failing client: $(leftovers)"
log "failing client: exit $rc, nothing left"
log "PASS"
