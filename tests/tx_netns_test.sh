#!/usr/bin/env bash
# Storm transactions across three network namespaces (scripts/netns_cluster): a farmemd in each
# holds one partition of the tx table "bank"; one `farmem bench tx-bank` client per namespace runs
# transfers and read-only audits over all three servers at the same time (multi-participant
# commits). Every committed audit must see the exact total and no negative balance, and the final
# total is conserved; over native TCP and libfabric "tcp;ofi_rxm". Needs root and 'ip netns' (else
# SKIP). FARMEM_TX_FAULT=validation (audits skip validation) must make it fail.
set -euo pipefail

ACCOUNTS=60
SECONDS_PER_RUN=2

# Inside the cluster (netns_cluster run): init from ns1, three concurrent run clients, check.
if [[ "${1:-}" == __inside ]]; then
  FARMEM=$2
  LABEL=$3
  read -r -a CLIENT <<<"$4"
  TEST_NAME="tx_netns: $LABEL"
  WORK="$NETNS_DIR" # fail shows the tails of the clients' *.out and *.err there
  source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
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
  netns_wait_all "client in ns" "$NETNS_DIR/run" '^tx-bank run:' "${pids[@]}" ||
    fail "a client saw a broken invariant or an error"
  bank 2 check >"$NETNS_DIR/check.out" 2>"$NETNS_DIR/check.err" ||
    fail "check: $(cat "$NETNS_DIR/check.out") $(tail -n 5 "$NETNS_DIR/check.err")"
  log "$(cat "$NETNS_DIR/check.out")"
  # Every server took part in two-phase commits (multi-participant transactions): its tx
  # statistics show commits, and prepares or decides.
  for i in 1 2 3; do
    ip="NETNS_IP$i"
    ip netns exec "$NETNS_NS1" timeout 30 "$FARMEM" stat "${!ip}:7300" --token "$NETNS_TOKEN" \
      --data-host "$NETNS_IP1" "${CLIENT[@]}" >"$NETNS_DIR/stat$i.out" 2>/dev/null ||
      fail "farmem stat of server $i"
    line="$(grep -E '^ +[0-9]+ commit\(s\) of' "$NETNS_DIR/stat$i.out" || true)"
    log "server $i:$line"
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
TEST_NAME=tx_netns
WORK=""
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
netns_test_start

# Partition {p} (0..2) of table bank on the farmemd of namespace p + 1.
TX_FLAGS=(--farmemd "$FARMEMD" --farmemd-arg=--services=tx --farmemd-arg=--tx-table=bank:8:8:32:2
  --farmemd-arg=--tx-partition={p} --farmemd-arg=--tx-partitions=3)
netns_case tcp "${TX_FLAGS[@]}" --backend tcp -- "${BASH_SOURCE[0]}" __inside "$FARMEM" tcp \
  "--backend tcp"
netns_case fabric-tcp "${TX_FLAGS[@]}" --backend "fabric:tcp;ofi_rxm" -- "${BASH_SOURCE[0]}" \
  __inside "$FARMEM" fabric-tcp "--backend fabric --provider tcp;ofi_rxm"
log "PASS"
