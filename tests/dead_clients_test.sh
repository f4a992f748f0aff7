#!/usr/bin/env bash
# Dead clients (issue 16, finding 7; docs/sessions.md): eight `farmem hold` clients allocate
# objects and written raw ranges on a real farmemd (default flags) in their sessions, asking for
# a 2 s lease, and are SIGKILLed. Within lease + margin STAT must show no owned objects or raw
# bytes left, the live objects and raw allocations back to what a persistent holder made, 16
# expired sessions (objects + raw client per holder), and farmemd's RSS back down near where it
# was before the holders. Labels: adversarial, integration. Usage: dead_clients_test.sh FARMEM FARMEMD
set -euo pipefail

FARMEM="${1:?usage: $0 path/to/farmem path/to/farmemd}"
FARMEMD="${2:?usage: $0 path/to/farmem path/to/farmemd}"
TOKEN="dead-clients-$$"
WORK="$(mktemp -d -t farmem-dead.XXXXXX)"
SERVER_PID=""
HOLDERS=()
CLIENTS=8
OBJECTS=2400        # per client, 1000 B each: ~19 k objects in all (the issue's 19,272)
RAW=12              # per client, 256 KiB each: 24 MiB in all (the issue's 25 MiB)
RAW_BYTES=262144
TTL_MS=2000         # asked by the clients; farmemd runs with its default --session-ttl-max

TEST_NAME=dead_clients
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cleanup() {
  local rc=$?
  for pid in "${HOLDERS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  stop_process "$SERVER_PID"
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[[ -x "$FARMEM" ]] || fail "farmem binary not found or not executable: $FARMEM"
[[ -x "$FARMEMD" ]] || fail "farmemd binary not found or not executable: $FARMEMD"

rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$SERVER_PID/status"; }
# stat_field PATH...: one number from `farmem stat --json` (e.g. objects owned_objects).
stat_field() {
  "$FARMEM" stat "$ADDR" --json --token "$TOKEN" 2>>"$WORK/stat.err" |
    python3 -c 'import json,sys
j=json.load(sys.stdin)
for k in sys.argv[1:]: j=j[k]
print(j)' "$@"
}

"$FARMEMD" --listen 127.0.0.1:0 --token "$TOKEN" --name dead-clients \
  >"$WORK/farmemd.out" 2>"$WORK/farmemd.err" &
SERVER_PID=$!
READY="$(wait_ready "$WORK/farmemd.out" 20 "$SERVER_PID")" || fail "farmemd did not become ready"
ADDR="$(sed -E 's/.*bootstrap=([^ ]+).*/\1/' <<<"$READY")"
log "farmemd at $ADDR (pid $SERVER_PID)"

# What must survive: a persistent holder that exits normally.
"$FARMEM" hold "$ADDR" --token "$TOKEN" --objects 50 --raw 2 --raw-bytes 4096 --persistent \
  --seconds 1 >"$WORK/persistent.out" 2>"$WORK/persistent.err" || fail "persistent holder failed"
[[ "$(stat_field objects persistent_objects)" == 50 ]] || fail "persistent objects not kept"
[[ "$(stat_field memory persistent_allocations)" == 2 ]] || fail "persistent raw not kept"
BASE_RSS=$(rss_kib)
log "persistent: 50 objects, 2 raw ranges; farmemd RSS ${BASE_RSS} KiB"

for i in $(seq "$CLIENTS"); do
  "$FARMEM" hold "$ADDR" --token "$TOKEN" --objects "$OBJECTS" --object-size 1000 --raw "$RAW" \
    --raw-bytes "$RAW_BYTES" --session-ttl-ms "$TTL_MS" >"$WORK/hold$i.out" 2>"$WORK/hold$i.err" &
  HOLDERS+=($!)
done
for i in $(seq "$CLIENTS"); do
  for _ in $(seq 1200); do
    grep -q '^farmem hold: holding' "$WORK/hold$i.out" 2>/dev/null && break
    kill -0 "${HOLDERS[$((i - 1))]}" 2>/dev/null || fail "holder $i exited early"
    sleep 0.1
  done
  grep -q '^farmem hold: holding' "$WORK/hold$i.out" || fail "holder $i did not allocate in 120 s"
done
OWNED=$(stat_field objects owned_objects)
OWNED_RAW=$(stat_field memory owned_bytes)
PEAK_RSS=$(rss_kib)
log "8 holders: $OWNED owned objects, $OWNED_RAW owned raw bytes; farmemd RSS ${PEAK_RSS} KiB"
[[ "$OWNED" == $((CLIENTS * OBJECTS)) ]] || fail "expected $((CLIENTS * OBJECTS)) owned objects"
[[ "$OWNED_RAW" == $((CLIENTS * RAW * RAW_BYTES)) ]] || fail "expected owned raw bytes"

for pid in "${HOLDERS[@]}"; do kill -KILL "$pid"; done
for pid in "${HOLDERS[@]}"; do { wait "$pid"; } 2>/dev/null || true; done
HOLDERS=()
KILLED_AT=$(date +%s.%N)
log "SIGKILLed the 8 holders"

# The lease is 2 s; the reaper runs every 100 ms; give it 2 s more plus the freeing itself.
DEADLINE=$(( $(date +%s) + 8 ))
while :; do
  O=$(stat_field objects owned_objects)
  R=$(stat_field memory owned_bytes)
  [[ "$O" == 0 && "$R" == 0 ]] && break
  (( $(date +%s) < DEADLINE )) ||
    fail "after 8 s: $O owned objects and $R owned raw bytes still allocated (dead clients leak)"
  sleep 0.2
done
FREED_AFTER=$(python3 -c "import time; print(f'{time.time() - $KILLED_AT:.1f}')")
LIVE=$(stat_field objects live_objects)
ALLOCS=$(stat_field memory allocations)
EXPIRED=$(stat_field sessions expired_total)
log "freed ${FREED_AFTER} s after the kill: live objects $LIVE, raw allocations $ALLOCS, expired sessions $EXPIRED"
[[ "$LIVE" == 50 ]] || fail "live objects $LIVE, expected the 50 persistent ones"
[[ "$ALLOCS" == 2 ]] || fail "raw allocations $ALLOCS, expected the 2 persistent ones"
[[ "$EXPIRED" == $((2 * CLIENTS)) ]] || fail "expired sessions $EXPIRED, expected $((2 * CLIENTS))"

# RSS comes back down: freed raw ranges and emptied object blocks return their pages. Bound: the
# pre-holder RSS plus 16 MiB (allocator caches, free blocks kept for reuse), and at most a third
# of the growth the holders caused.
FINAL_RSS=$(rss_kib)
for _ in $(seq 20); do
  (( FINAL_RSS <= BASE_RSS + 16384 )) && break
  sleep 0.2
  FINAL_RSS=$(rss_kib)
done
log "farmemd RSS: ${BASE_RSS} KiB before, ${PEAK_RSS} KiB with the holders, ${FINAL_RSS} KiB after"
(( FINAL_RSS <= BASE_RSS + 16384 )) || fail "RSS ${FINAL_RSS} KiB did not come back near ${BASE_RSS} KiB"
(( (FINAL_RSS - BASE_RSS) * 3 <= PEAK_RSS - BASE_RSS )) ||
  fail "RSS kept more than a third of the holders' growth"

"$FARMEM" stat "$ADDR" --token "$TOKEN" >"$WORK/stat.out" 2>&1 || fail "farmem stat failed"
grep -q '^sessions: 0 open' "$WORK/stat.out" || fail "stat lacks the sessions line"
grep -q 'owned by client sessions 0 B in 0 allocation(s), persistent' "$WORK/stat.out" ||
  fail "stat lacks owned vs persistent raw"
log "PASS"
