#!/usr/bin/env bash
# Storm transactions across three network namespaces (scripts/netns_cluster): a farmemd in each
# holds one partition of the tx table "bank"; one `farmem bench tx-bank` client per namespace runs
# transfers and read-only audits over all three servers at the same time (multi-participant
# commits). Every committed audit must see the exact total and no negative balance, and the final
# total is conserved; over native TCP and libfabric "tcp;ofi_rxm". Needs root and 'ip netns' (else
# SKIP). FARMEM_TX_FAULT=validation (audits skip validation) must make it fail.
set -euo pipefail

HARNESS="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/scripts/netns_cluster"
ACCOUNTS=60
SECONDS_PER_RUN=4

# Inside the cluster (netns_cluster run): init from ns1, three concurrent run clients, check.
if [[ "${1:-}" == __inside ]]; then
  FARMEM=$2
  LABEL=$3
  read -r -a CLIENT <<<"$4"
  fail() {
    echo "tx_netns: $LABEL: FAIL: $*" >&2
    exit 1
  }
  bank() { # bank <ns index> <mode> [flags...]
    local i=$1 ns ip
    shift
    ns="NETNS_NS$i"
    ip="NETNS_IP$i"
    ip netns exec "${!ns}" timeout --kill-after=5 60 "$FARMEM" bench tx-bank "$@" \
      --connect "$NETNS_SERVERS" --token "$NETNS_TOKEN" --data-host "${!ip}" "${CLIENT[@]}" \
      --accounts "$ACCOUNTS"
  }
  bank 1 init >"$NETNS_DIR/init.out" 2>"$NETNS_DIR/init.err" || fail "init: $(tail -n 5 "$NETNS_DIR/init.err")"
  pids=()
  for i in 1 2 3; do
    bank "$i" run --seed "$i" --seconds "$SECONDS_PER_RUN" >"$NETNS_DIR/run$i.out" \
      2>"$NETNS_DIR/run$i.err" &
    pids+=($!)
  done
  bad=0
  for i in 1 2 3; do
    rc=0
    wait "${pids[$((i - 1))]}" || rc=$?
    line="$(grep '^tx-bank run:' "$NETNS_DIR/run$i.out" || true)"
    echo "tx_netns: $LABEL: client in ns$i: ${line:-no result line}"
    if ((rc != 0)); then
      bad=1
      echo "tx_netns: $LABEL: client in ns$i exited $rc: $(grep -v '\[info\]' "$NETNS_DIR/run$i.err" | tail -n 5)" >&2
    fi
  done
  ((bad == 0)) || fail "a client saw a broken invariant or an error"
  bank 2 check >"$NETNS_DIR/check.out" 2>"$NETNS_DIR/check.err" ||
    fail "check: $(cat "$NETNS_DIR/check.out") $(tail -n 5 "$NETNS_DIR/check.err")"
  echo "tx_netns: $LABEL: $(cat "$NETNS_DIR/check.out")"
  # Every server took part in two-phase commits (multi-participant transactions): its tx
  # statistics show commits, and prepares or decides.
  for i in 1 2 3; do
    ip="NETNS_IP$i"
    ip netns exec "$NETNS_NS1" timeout 30 "$FARMEM" stat "${!ip}:7300" --token "$NETNS_TOKEN" \
      --data-host "$NETNS_IP1" "${CLIENT[@]}" >"$NETNS_DIR/stat$i.out" 2>/dev/null ||
      fail "farmem stat of server $i"
    line="$(grep -E '^ +[0-9]+ commit\(s\) of' "$NETNS_DIR/stat$i.out" || true)"
    echo "tx_netns: $LABEL: server $i:$line"
    [[ "$line" =~ ^\ +([0-9]+)\ commit.*2PC:\ ([0-9]+)\ prepare.*\ ([0-9]+)\ decide ]] ||
      fail "server $i: no tx statistics"
    # (The participant a multi-participant commit decides at first gets no prepare; docs/tx.md.)
    ((BASH_REMATCH[1] > 0 && BASH_REMATCH[2] + BASH_REMATCH[3] > 0)) ||
      fail "server $i took no part in 2PC commits"
  done
  exit 0
fi

FARMEM="${1:?usage: $0 path/to/farmem path/to/farmemd}"
FARMEMD="${2:?usage: $0 path/to/farmem path/to/farmemd}"
export NETNS_PREFIX=fm-test-ns # not the names of a cluster someone started with `up`

skip() {
  echo "SKIP: $*"
  exit 0
}
((EUID == 0)) || skip "network namespaces need root (running as uid $EUID)"
command -v ip >/dev/null 2>&1 || skip "'ip' (iproute2) not installed"
ip netns list >/dev/null 2>&1 || skip "'ip netns' is not available"
trap '"$HARNESS" down >/dev/null 2>&1 || true' EXIT

# run_case <label> <netns_cluster backend> <client backend flags>
run_case() {
  local label=$1 backend=$2 client=$3 start
  start=$(date +%s%N)
  "$HARNESS" run --farmemd "$FARMEMD" --backend "$backend" --farmemd-arg=--services=tx \
    --farmemd-arg=--tx-table=bank:8:8:32:2 --farmemd-arg=--tx-partition={p} \
    --farmemd-arg=--tx-partitions=3 -- "${BASH_SOURCE[0]}" __inside "$FARMEM" "$label" "$client" ||
    { echo "tx_netns: FAIL: $label" >&2; exit 1; }
  echo "tx_netns: $label: OK in $((($(date +%s%N) - start) / 1000000)) ms"
}

run_case tcp tcp "--backend tcp"
run_case fabric-tcp "fabric:tcp;ofi_rxm" "--backend fabric --provider tcp;ofi_rxm"
echo "tx_netns: PASS"
