#!/usr/bin/env bash
# The channels kvstore across three network namespaces (scripts/netns_cluster, no farmemd): one
# LOCO node per namespace (`farmem bench channels-node --workload kvlin`), two client threads each,
# 8 hot keys, unique written values; the three processes' histories (CLOCK_MONOTONIC, shared by
# the namespaces) are merged and checked for linearizability by Porcupine (tests/porcupine, built
# with Go here; SKIP without Go or the module). Native TCP and libfabric "tcp;ofi_rxm". Needs root
# and 'ip netns' (else SKIP). FARMEM_CHANNELS_FAULT=kv_acks|kv_update_fence must make it fail.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OPS=300 # per client thread
PORT=7400

# Inside the cluster (netns_cluster run): the three nodes at once, then the check.
if [[ "${1:-}" == __inside ]]; then
  FARMEM=$2
  LABEL=$3
  BACKEND=$4
  CHECKER=$5
  TEST_NAME="channels_netns: $LABEL"
  WORK="$NETNS_DIR" # fail shows the tails of the nodes' *.out and *.err there
  source "$HERE/lib.sh"
  peers="$NETNS_IP1:$PORT,$NETNS_IP2:$PORT,$NETNS_IP3:$PORT"
  pids=()
  for i in 1 2 3; do
    ns="NETNS_NS$i"
    ip netns exec "${!ns}" timeout --kill-after=5 120 "$FARMEM" bench channels-node --id "$i" \
      --peers "$peers" --backend "$BACKEND" --workload kvlin --ops "$OPS" \
      --history "$NETNS_DIR/history$i.txt" >"$NETNS_DIR/node$i.out" 2>"$NETNS_DIR/node$i.err" &
    pids+=($!)
  done
  netns_wait_all node "$NETNS_DIR/node" . "${pids[@]}" ||
    fail "a node failed (an operation with an unknown outcome cannot be checked)"
  cat "$NETNS_DIR"/history[123].txt >"$NETNS_DIR/history.txt"
  n=$(wc -l <"$NETNS_DIR/history.txt")
  ((n == 3 * 2 * OPS)) || fail "$n operations in the merged history, want $((3 * 2 * OPS))"
  rc=0
  result="$("$CHECKER" "$NETNS_DIR/history.txt" 2>&1)" || rc=$?
  log "porcupine on $n operations from 3 namespaces: $result"
  if ((rc != 0)); then
    cp "$NETNS_DIR/history.txt" "/tmp/channels_netns-$LABEL-history.txt"
    fail "history not linearizable (kept in /tmp/channels_netns-$LABEL-history.txt)"
  fi
  exit 0
fi

FARMEM="${1:?usage: $0 path/to/farmem path/to/farmemd}"
TEST_NAME=channels_netns
WORK="$(mktemp -d -t farmem-chnetns.XXXXXX)"
source "$HERE/lib.sh"
netns_test_start
# Go as the in-process Porcupine test finds it: $GO, /usr/local/go/bin/go, or go on PATH.
GO="${GO:-}"
[[ -n "$GO" && -x "$GO" ]] || GO=/usr/local/go/bin/go
[[ -x "$GO" ]] || GO="$(command -v go || true)"
[[ -n "$GO" ]] || skip "Go is not installed: the kvstore history cannot be checked by Porcupine"
(cd "$HERE/porcupine" && GOFLAGS=-mod=mod "$GO" build -o "$WORK/kvcheck" . >"$WORK/build.log" 2>&1) ||
  skip "could not build the Porcupine checker (module not downloadable?): $(tail -n 3 "$WORK/build.log")"

for backend in tcp "fabric:tcp;ofi_rxm"; do
  label="${backend%%;*}"
  label="${label/:/-}"
  netns_case "$label" --no-farmemd -- "${BASH_SOURCE[0]}" __inside "$FARMEM" "$label" "$backend" \
    "$WORK/kvcheck"
done
log "PASS"
