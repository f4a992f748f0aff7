#!/usr/bin/env bash
# Storm transactions across three network namespaces (scripts/netns_cluster): a farmemd in each
# holds one partition of the tx table "bank"; one `farmem bench tx-bank` client per namespace runs
# transfers and read-only audits over all three servers at the same time (multi-participant
# commits). Every committed audit must see the exact total and no negative balance, and the final
# total is conserved; over native TCP and libfabric "tcp;ofi_rxm". Then a network partition (tcp):
# ns3 is cut off (its link down) under clients in ns1 and ns2, which must end with errors (TimedOut)
# (1 s operation timeout) instead of hanging, no committed audit wrong; after the link is back the
# total is conserved.
# Needs root and 'ip netns' (else SKIP). FARMEM_TX_FAULT=validation (audits skip validation) must
# make it fail.
set -euo pipefail

ACCOUNTS=60
SECONDS_PER_RUN=2

# Inside the cluster (netns_cluster run): init from ns1, three concurrent run clients, check.
if [[ "${1:-}" == __inside ]]; then
  FARMEM=$2
  LABEL=$3
  read -r -a CLIENT <<<"$4"
  MODE=${5:-all}
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
  if [[ "$MODE" == partition ]]; then
    pids=()
    # A previous case's files would otherwise answer the wait below before the redirect truncates.
    rm -f "$NETNS_DIR"/run*.out "$NETNS_DIR"/run*.err "$NETNS_DIR"/stat*.out
    for i in 1 2; do
      bank "$i" run --seed "$i" --seconds 3 --min-audits 0 --op-timeout-ms 1000 \
        >"$NETNS_DIR/run$i.out" \
        2>"$NETNS_DIR/run$i.err" &
      pids+=($!)
    done
    # Both clients connected to all three servers, then ns3 drops off the network.
    for i in 1 2; do
      for _ in $(seq 300); do
        grep -q '^tx-bank run: started' "$NETNS_DIR/run$i.out" && break
        kill -0 "${pids[$((i - 1))]}" 2>/dev/null || fail "client in ns$i exited before it started"
        sleep 0.1
      done
      if ! grep -q '^tx-bank run: started' "$NETNS_DIR/run$i.out"; then
        dump_stuck "${pids[$((i - 1))]}"
        fail "client in ns$i not started in 30 s"
      fi
    done
    sleep 0.5
    ip -n "$NETNS_NS3" link set eth0 down || fail "link down in $NETNS_NS3"
    log "$NETNS_NS3 cut off (eth0 down) under the running clients"
    for i in 1 2; do
      rc=0
      wait "${pids[$((i - 1))]}" || rc=$?
      line="$(grep '^tx-bank run: transfers' "$NETNS_DIR/run$i.out" || true)"
      log "client in ns$i (exit $rc): ${line:-no result line}"
      ((rc != 124 && rc != 137)) || fail "client in ns$i hung (ended by its 60 s timeout)"
      [[ "$line" =~ bad_audits\ 0\ negative\ 0 ]] || fail "client in ns$i: a committed audit was wrong"
      [[ "$line" =~ errors\ ([1-9][0-9]*) ]] || fail "client in ns$i got no error from the partition"
    done
    log "$(grep -h -m1 -o 'TimedOut: .*' "$NETNS_DIR"/run[12].err | head -n 1)"
    ip -n "$NETNS_NS3" link set eth0 up || fail "link up in $NETNS_NS3"
    bank 2 check >"$NETNS_DIR/check.out" 2>"$NETNS_DIR/check.err" ||
      fail "check after the partition: $(cat "$NETNS_DIR/check.out")"
    log "after the partition: $(cat "$NETNS_DIR/check.out")"
    exit 0
  fi
  pids=()
  for i in 1 2 3; do
    bank "$i" run --seed "$i" --seconds "$SECONDS_PER_RUN" >"$NETNS_DIR/run$i.out" \
      2>"$NETNS_DIR/run$i.err" &
    pids+=($!)
  done
  netns_wait_all "client in ns" "$NETNS_DIR/run" '^tx-bank run: transfers' "${pids[@]}" ||
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
# tx_case <label> <backend> <client flags> [partition]; TX_NETNS_CASE=<label> runs only that one
# (to show a fault failing a given case).
tx_case() {
  [[ -z "${TX_NETNS_CASE:-}" || "$TX_NETNS_CASE" == "$1" ]] || return 0
  netns_case "$1" "${TX_FLAGS[@]}" --backend "$2" -- "${BASH_SOURCE[0]}" __inside "$FARMEM" "$1" \
    "$3" "${4:-all}"
}
tx_case tcp tcp "--backend tcp"
tx_case fabric-tcp "fabric:tcp;ofi_rxm" "--backend fabric --provider tcp;ofi_rxm"
tx_case tcp-partition tcp "--backend tcp" partition
log "PASS"
