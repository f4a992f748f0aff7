#!/usr/bin/env bash
# A channels participant SIGKILLed in the middle of using every channel, across three network
# namespaces (scripts/netns_cluster, no farmemd): one LOCO node per namespace (`farmem bench
# channels-node --workload kill`, the scenario of src/channels/kill_test.cc in
# src/channels/kill_scenario.h). Node 3 uses the ringbuffer, queue, kvstore, atomic and owned
# vars and ticket locks (and holds one) until the test kills it; nodes 1 and 2 then check that
# each of their calls errors within 5 s (never a hang, never the dead node's value), that an
# insert that failed at the dead node's tracker left no key on them, and that their own values
# still read. Native TCP and libfabric "tcp;ofi_rxm". Needs root and 'ip netns' (else SKIP).
# FARMEM_CHANNELS_FAULT=kv_rollback must make it fail (the failed insert's key stays).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PORT=7450

# Inside the cluster (netns_cluster run): the three nodes, the kill, the survivors' checks.
if [[ "${1:-}" == __inside ]]; then
  FARMEM=$2
  LABEL=$3
  BACKEND=$4
  TEST_NAME="channels_kill_netns: $LABEL"
  WORK="$NETNS_DIR" # fail shows the tails of the nodes' *.out and *.err there
  source "$HERE/lib.sh"
  peers="$NETNS_IP1:$PORT,$NETNS_IP2:$PORT,$NETNS_IP3:$PORT"
  marker="$NETNS_DIR/victim-dead"
  rm -f "$marker"
  pids=()
  for i in 1 2 3; do
    ns="NETNS_NS$i"
    # The victim runs without `timeout` in between, so that the pid it prints is the one killed.
    wrap=(timeout --kill-after=5 120)
    ((i == 3)) && wrap=()
    ip netns exec "${!ns}" "${wrap[@]}" "$FARMEM" bench channels-node --id "$i" --peers "$peers" \
      --backend "$BACKEND" --workload kill --kill-marker "$marker" \
      >"$NETNS_DIR/node$i.out" 2>"$NETNS_DIR/node$i.err" &
    pids+=($!)
  done
  victim=""
  for _ in $(seq 600); do
    # (The background job may not have created node3.err yet: under set -e a failing sed here
    # ended the test at once.)
    victim="$(sed -n 's/^kill victim: busy, pid \([0-9]*\)$/\1/p' "$NETNS_DIR/node3.err" 2>/dev/null || true)"
    ready=$(cat "$NETNS_DIR"/node[12].err | grep -c '^kill survivor: ready' || true)
    [[ -n "$victim" && "$ready" == 2 ]] && break
    kill -0 "${pids[0]}" 2>/dev/null && kill -0 "${pids[1]}" 2>/dev/null ||
      fail "a survivor exited during the set-up"
    sleep 0.1
  done
  [[ -n "$victim" && "$ready" == 2 ]] || fail "set-up not done within 60 s"
  # Mid-use: the victim is looping over every channel.
  sleep 0.2
  kill -KILL "$victim"
  for _ in $(seq 100); do kill -0 "$victim" 2>/dev/null || break; sleep 0.05; done
  kill -0 "$victim" 2>/dev/null && fail "the victim (pid $victim) did not die"
  log "killed node 3 (pid $victim) mid-use"
  touch "$marker"
  rc=0
  for i in 1 2; do
    wait "${pids[$((i - 1))]}" || rc=1
    # One line per check: what, outcome, time.
    python3 - "$NETNS_DIR/node$i.out" "$i" <<'EOF' || rc=1
import json, sys
line = [l for l in open(sys.argv[1]) if l.startswith("{")][-1]
j = json.loads(line)
for c in j.get("checks", []):
    mark = "ok  " if c["passed"] else "FAIL"
    print(f"  node {sys.argv[2]} {mark} {c['what']}: {c['status']} ({c['ms']} ms)")
if "error" in j:
    print(f"  node {sys.argv[2]}: {j['error']}")
sys.exit(0 if "error" not in j and j.get("failed", 1) == 0 else 1)
EOF
  done
  wait "${pids[2]}" 2>/dev/null || true
  ((rc == 0)) || fail "a survivor's check failed (above)"
  exit 0
fi

FARMEM="${1:?usage: $0 path/to/farmem path/to/farmemd}"
TEST_NAME=channels_kill_netns
WORK="$(mktemp -d -t farmem-chkill.XXXXXX)"
source "$HERE/lib.sh"
netns_test_start

for backend in tcp "fabric:tcp;ofi_rxm"; do
  label="${backend%%;*}"
  label="${label/:/-}"
  netns_case "$label" --no-farmemd -- "${BASH_SOURCE[0]}" __inside "$FARMEM" "$label" "$backend"
done
log "PASS"
