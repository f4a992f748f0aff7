#!/usr/bin/env bash
# Smoke test of the shipped binaries on 127.0.0.1: farmemd starts and reports ready, `farmem stat`
# (table and --json, with the objects section), `farmem demo --connect` (raw and objects parts),
# `farmem compact` (and its bad input), a wrong token and an unreachable address fail with a
# message, a farmemd running only the pools service (--services, STAT and /metrics from the
# services, an unknown service refused with exit 2), and SIGTERM stops farmemd cleanly. Usage: cli_smoke_test.sh FARMEM FARMEMD (from ctest).
set -euo pipefail

FARMEM="${1:?usage: $0 path/to/farmem path/to/farmemd}"
FARMEMD="${2:?usage: $0 path/to/farmem path/to/farmemd}"
TOKEN="smoke-token-$$"
WORK="$(mktemp -d -t farmem-smoke.XXXXXX)"
SERVER_PID=""
POOLS_PID=""

TEST_NAME=cli_smoke
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

cleanup() {
  local rc=$?
  stop_process "$SERVER_PID"
  [[ -z "$POOLS_PID" ]] || kill -KILL "$POOLS_PID" 2>/dev/null || true
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[[ -x "$FARMEM" ]] || fail "farmem binary not found or not executable: $FARMEM"
[[ -x "$FARMEMD" ]] || fail "farmemd binary not found or not executable: $FARMEMD"

# wait_ready (shared with the other integration tests)

# Waits up to $2 seconds for background process $1 to exit; sets EXIT_CODE (124 on timeout).
wait_exit() {
  local pid=$1 secs=$2
  for _ in $(seq $((secs * 10))); do
    if ! kill -0 "$pid" 2>/dev/null; then
      EXIT_CODE=0
      wait "$pid" || EXIT_CODE=$?
      return 0
    fi
    sleep 0.1
  done
  EXIT_CODE=124
}

# A port nothing listens on: bind an ephemeral one and close it again.
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# --- start the daemon -----------------------------------------------------------------------------
# Port 0: the daemon binds an ephemeral port and its ready line tells which, so parallel test runs
# never collide.
log "starting farmemd"
"$FARMEMD" --listen 127.0.0.1:0 --backend tcp --data-host 127.0.0.1 --data-port 0 \
  --memory-mib 64 --pool-mib 16 --token "$TOKEN" --name smoke --workers 1 \
  >"$WORK/farmemd.out" 2>"$WORK/farmemd.err" </dev/null &
SERVER_PID=$!
ready="$(wait_ready "$WORK/farmemd.out" 20 "$SERVER_PID")" || fail "farmemd did not print its ready line within 20s"
log "$ready"
ADDR="$(sed -n 's/.*bootstrap=\([^ ]*\).*/\1/p' <<<"$ready")"
[[ "$ADDR" =~ ^127\.0\.0\.1:[1-9][0-9]*$ ]] || fail "cannot parse bootstrap address from: $ready"
grep -q ' transport=' <<<"$ready" || fail "ready line lacks transport=: $ready"
grep -q ' address=' <<<"$ready" || fail "ready line lacks address=: $ready"

# --- farmem stat ----------------------------------------------------------------------------------
log "farmem stat $ADDR"
timeout 20 "$FARMEM" stat "$ADDR" --token "$TOKEN" >"$WORK/stat.out" 2>"$WORK/stat.err" </dev/null ||
  fail "farmem stat exited $?"
[[ -s "$WORK/stat.out" ]] || fail "farmem stat printed nothing"
grep -q 'smoke' "$WORK/stat.out" || fail "farmem stat does not show the node name 'smoke'"
cat "$WORK/stat.out"

log "farmem stat $ADDR --json"
timeout 20 "$FARMEM" stat "$ADDR" --json --token "$TOKEN" >"$WORK/stat_json.out" 2>"$WORK/stat_json.err" </dev/null ||
  fail "farmem stat --json exited $?"
python3 -m json.tool "$WORK/stat_json.out" >/dev/null 2>"$WORK/json_tool.err" ||
  fail "farmem stat --json output is not valid JSON"
grep -q '"smoke"' "$WORK/stat_json.out" || fail "farmem stat --json does not contain the node name"

# --- farmem demo against the daemon ---------------------------------------------------------------
log "farmem demo --connect $ADDR"
timeout 60 "$FARMEM" demo --connect "$ADDR" --token "$TOKEN" >"$WORK/demo.out" 2>"$WORK/demo.err" </dev/null ||
  fail "farmem demo --connect exited $?"
grep -q "node 'smoke'" "$WORK/demo.out" || fail "the demo output never shows the daemon answering STAT"
grep -q '^demo passed' "$WORK/demo.out" || fail "farmem demo printed no 'demo passed' line"
grep -Eq '^  objects: [0-9]+/[0-9]+ checks passed' "$WORK/demo.out" || fail "farmem demo did not run its objects part"
grep -q 'read_any survivors     ok' "$WORK/demo.out" || fail "the demo's objects survived compaction badly"
tail -n 2 "$WORK/demo.out"

# --- farmem compact ---------------------------------------------------------------------------------
log "farmem stat shows the object store"
grep -q '^objects: ' "$WORK/stat.out" || fail "farmem stat has no objects section"
grep -q '"objects"' "$WORK/stat_json.out" || fail "farmem stat --json has no objects section"

log "farmem compact $ADDR"
timeout 30 "$FARMEM" compact "$ADDR" --token "$TOKEN" >"$WORK/compact.out" 2>"$WORK/compact.err" </dev/null ||
  fail "farmem compact exited $?"
grep -Eq '^compacted .* \(all classes\): [0-9]+ merge\(s\)' "$WORK/compact.out" || fail "farmem compact printed no merge count"
grep -q 'blocks_freed' "$WORK/compact.out" || fail "farmem compact printed no compaction counters"
cat "$WORK/compact.out"
timeout 30 "$FARMEM" compact "$ADDR" --class 0 --token "$TOKEN" >"$WORK/compact0.out" 2>"$WORK/compact0.err" </dev/null ||
  fail "farmem compact --class 0 exited $?"
grep -q '(class 0)' "$WORK/compact0.out" || fail "farmem compact --class 0 does not name the class"

log "farmem compact bad input must be refused"
rc=0
timeout 30 "$FARMEM" compact "$ADDR" --class 60000 --token "$TOKEN" >"$WORK/badclass.out" 2>"$WORK/badclass.err" </dev/null || rc=$?
((rc == 2)) || fail "farmem compact --class 60000 exited $rc (want 2)"
grep -q 'does not exist' "$WORK/badclass.err" || fail "unknown-class error does not say why"
rc=0
timeout 30 "$FARMEM" compact "$ADDR" --class -1 --token "$TOKEN" >"$WORK/negclass.out" 2>"$WORK/negclass.err" </dev/null || rc=$?
((rc == 2)) || fail "farmem compact --class -1 exited $rc (want 2)"
rc=0
timeout 30 "$FARMEM" compact --token "$TOKEN" >"$WORK/noaddr.out" 2>"$WORK/noaddr.err" </dev/null || rc=$?
((rc == 2)) || fail "farmem compact without an address exited $rc (want 2)"
rc=0
timeout 30 "$FARMEM" compact "$ADDR" --token "not-$TOKEN" >"$WORK/compact_tok.out" 2>"$WORK/compact_tok.err" </dev/null || rc=$?
((rc == 1)) || fail "farmem compact with a wrong token exited $rc (want 1)"

# --- failures are reported, not hung on ------------------------------------------------------------
log "wrong token must be refused"
rc=0
timeout 20 "$FARMEM" stat "$ADDR" --token "not-$TOKEN" >"$WORK/badtoken.out" 2>"$WORK/badtoken.err" </dev/null || rc=$?
((rc != 0)) || fail "farmem stat with a wrong token exited 0"
((rc != 124)) || fail "farmem stat with a wrong token hung (killed after 20s)"
grep -Eiq 'token|permission|denied|auth' "$WORK/badtoken.out" "$WORK/badtoken.err" ||
  fail "wrong-token error does not say why (no token/permission/denied in output)"
log "  refused (exit $rc): $(grep -h -m1 -i 'error' "$WORK/badtoken.err" "$WORK/badtoken.out" || true)"

log "unreachable address must fail"
port="$(free_port)"
rc=0
timeout 20 "$FARMEM" stat "127.0.0.1:$port" --token "$TOKEN" >"$WORK/unreach.out" 2>"$WORK/unreach.err" </dev/null || rc=$?
((rc != 0)) || fail "farmem stat of a closed port exited 0"
((rc != 124)) || fail "farmem stat of a closed port hung (killed after 20s)"
[[ -s "$WORK/unreach.err" || -s "$WORK/unreach.out" ]] || fail "farmem stat of a closed port printed no error"
log "  failed (exit $rc): $(grep -h -m1 -i 'error' "$WORK/unreach.err" "$WORK/unreach.out" || true)"

# The daemon must have survived all of the above.
kill -0 "$SERVER_PID" 2>/dev/null || fail "farmemd died during the test"

# --- a farmemd with one service --------------------------------------------------------------------
log "farmemd --services bogus must be refused with exit 2"
rc=0
timeout 20 "$FARMEMD" --listen 127.0.0.1:0 --services pools,bogus --token "$TOKEN" \
  >"$WORK/bogus.out" 2>"$WORK/bogus.err" </dev/null || rc=$?
((rc == 2)) || fail "farmemd --services pools,bogus exited $rc (want 2)"
grep -q "unknown service 'bogus'" "$WORK/bogus.err" || fail "no 'unknown service' message"

log "farmemd --services pools --metrics-port 0"
"$FARMEMD" --listen 127.0.0.1:0 --services pools --metrics-port 0 --memory-mib 32 \
  --token "$TOKEN" --name pools-only >"$WORK/pools.out" 2>"$WORK/pools.err" </dev/null &
POOLS_PID=$!
ready="$(wait_ready "$WORK/pools.out" 20 "$POOLS_PID")" || fail "pools-only farmemd not ready"
PADDR="$(sed -n 's/.*bootstrap=\([^ ]*\).*/\1/p' <<<"$ready")"
timeout 20 "$FARMEM" stat "$PADDR" --json --token "$TOKEN" >"$WORK/pools_stat.out" \
  2>"$WORK/pools_stat.err" </dev/null || fail "farmem stat of the pools-only server failed"
python3 - "$WORK/pools_stat.out" <<'PY' || fail "pools-only STAT is wrong"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["services"] == ["pools"], s["services"]
assert "objects" not in s, "objects section present"
assert s["rpc"]["alloc_raw"]["service"] == "pools", s["rpc"]
assert not any(k.startswith("obj_") for k in s["rpc"]), s["rpc"]
PY
mport="$(sed -n 's/.*metrics: http:\/\/127\.0\.0\.1:\([0-9]*\)\/metrics.*/\1/p' "$WORK/pools.err" | head -n1)"
[[ -n "$mport" ]] || fail "no metrics port in the pools-only farmemd's log"
python3 - "$mport" >"$WORK/metrics.out" <<'PY' || fail "GET /metrics failed"
import sys, urllib.request
print(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).read().decode())
PY
grep -q 'farmem_rpc_calls_total{service="pools",op="alloc_raw"}' "$WORK/metrics.out" ||
  fail "/metrics lacks the pools service's RPC counters"
grep -q '^farmem_memory_budget_bytes 33554432$' "$WORK/metrics.out" || fail "/metrics lacks the budget"
! grep -q 'farmem_objects_' "$WORK/metrics.out" || fail "/metrics shows objects metrics without the service"
kill -TERM "$POOLS_PID"
wait_exit "$POOLS_PID" 20
((EXIT_CODE == 0)) || fail "pools-only farmemd exited $EXIT_CODE after SIGTERM (want 0)"
POOLS_PID=""

# --- clean shutdown -------------------------------------------------------------------------------
log "SIGTERM farmemd"
kill -TERM "$SERVER_PID"
wait_exit "$SERVER_PID" 20
((EXIT_CODE != 124)) || fail "farmemd did not exit within 20s of SIGTERM"
SERVER_PID=""
((EXIT_CODE == 0)) || fail "farmemd exited $EXIT_CODE after SIGTERM (want 0)"

log "PASS"
