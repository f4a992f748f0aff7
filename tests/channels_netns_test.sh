#!/usr/bin/env bash
# The channels kvstore across three network namespaces (scripts/netns_cluster, no farmemd): one
# LOCO node per namespace (`farmem bench channels-node --workload kvlin`), two client threads each,
# 8 hot keys, unique written values; the three processes' histories (CLOCK_MONOTONIC, shared by
# the namespaces) are merged and checked for linearizability by Porcupine (tests/porcupine, built
# with Go here; SKIP without Go or the module). Native TCP and libfabric "tcp;ofi_rxm". Needs root
# and 'ip netns' (else SKIP). FARMEM_CHANNELS_FAULT=kv_acks|kv_update_fence must make it fail.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
HARNESS="$HERE/../scripts/netns_cluster"
OPS=300 # per client thread
PORT=7400

# Inside the cluster (netns_cluster run): the three nodes at once, then the check.
if [[ "${1:-}" == __inside ]]; then
  FARMEM=$2
  LABEL=$3
  BACKEND=$4
  CHECKER=$5
  fail() {
    echo "channels_netns: $LABEL: FAIL: $*" >&2
    exit 1
  }
  peers="$NETNS_IP1:$PORT,$NETNS_IP2:$PORT,$NETNS_IP3:$PORT"
  pids=()
  for i in 1 2 3; do
    ns="NETNS_NS$i"
    ip netns exec "${!ns}" timeout --kill-after=5 120 "$FARMEM" bench channels-node --id "$i" \
      --peers "$peers" --backend "$BACKEND" --workload kvlin --ops "$OPS" \
      --history "$NETNS_DIR/history$i.txt" >"$NETNS_DIR/node$i.out" 2>"$NETNS_DIR/node$i.err" &
    pids+=($!)
  done
  bad=0
  for i in 1 2 3; do
    rc=0
    wait "${pids[$((i - 1))]}" || rc=$?
    echo "channels_netns: $LABEL: node $i: $(cat "$NETNS_DIR/node$i.out")"
    if ((rc != 0)); then
      bad=1
      echo "channels_netns: $LABEL: node $i exited $rc: $(grep -v '\[info\]' "$NETNS_DIR/node$i.err" | tail -n 5)" >&2
    fi
  done
  ((bad == 0)) || fail "a node failed (an operation with an unknown outcome cannot be checked)"
  cat "$NETNS_DIR"/history[123].txt >"$NETNS_DIR/history.txt"
  n=$(wc -l <"$NETNS_DIR/history.txt")
  ((n == 3 * 2 * OPS)) || fail "$n operations in the merged history, want $((3 * 2 * OPS))"
  rc=0
  result="$("$CHECKER" "$NETNS_DIR/history.txt" 2>&1)" || rc=$?
  echo "channels_netns: $LABEL: porcupine on $n operations from 3 namespaces: $result"
  if ((rc != 0)); then
    cp "$NETNS_DIR/history.txt" "/tmp/channels_netns-$LABEL-history.txt"
    fail "history not linearizable (kept in /tmp/channels_netns-$LABEL-history.txt)"
  fi
  exit 0
fi

FARMEM="${1:?usage: $0 path/to/farmem path/to/farmemd}"
export NETNS_PREFIX=fm-test-ns # not the names of a cluster someone started with `up`

skip() {
  echo "SKIP: $*"
  exit 0
}
((EUID == 0)) || skip "network namespaces need root (running as uid $EUID)"
command -v ip >/dev/null 2>&1 || skip "'ip' (iproute2) not installed"
ip netns list >/dev/null 2>&1 || skip "'ip netns' is not available"
# Go as the in-process Porcupine test finds it: $GO, /usr/local/go/bin/go, or go on PATH.
GO="${GO:-}"
[[ -n "$GO" && -x "$GO" ]] || GO=/usr/local/go/bin/go
[[ -x "$GO" ]] || GO="$(command -v go || true)"
[[ -n "$GO" ]] || skip "Go is not installed: the kvstore history cannot be checked by Porcupine"
WORK="$(mktemp -d -t farmem-chnetns.XXXXXX)"
trap '"$HARNESS" down >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT
(cd "$HERE/porcupine" && GOFLAGS=-mod=mod "$GO" build -o "$WORK/kvcheck" . >"$WORK/build.log" 2>&1) ||
  skip "could not build the Porcupine checker (module not downloadable?): $(tail -n 3 "$WORK/build.log")"

# run_case <label> <channels-node backend>
run_case() {
  local label=$1 backend=$2 start
  start=$(date +%s%N)
  "$HARNESS" run --no-farmemd -- "${BASH_SOURCE[0]}" __inside "$FARMEM" "$label" "$backend" \
    "$WORK/kvcheck" || { echo "channels_netns: FAIL: $label" >&2; exit 1; }
  echo "channels_netns: $label: OK in $((($(date +%s%N) - start) / 1000000)) ms"
}

run_case tcp tcp
run_case fabric-tcp "fabric:tcp;ofi_rxm"
echo "channels_netns: PASS"
