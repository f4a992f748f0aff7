#!/usr/bin/env bash
# The control plane across hosts, on one machine: four network namespaces joined by veth links to
# a routing client host — etcd on one, a farmemd on each of two others (--cluster at etcd's
# address) — and `farmem demo --cluster etcd://<etcd ip>:2379` in the client namespace finds both
# servers through etcd alone. Needs root and etcd (else SKIP). Topology as multihost_netns_test.sh.
set -euo pipefail

FARMEM="${1:?usage: $0 path/to/farmem path/to/farmemd}"
FARMEMD="${2:?usage: $0 path/to/farmem path/to/farmemd}"
ETCD="${FARMEM_ETCD:-$(command -v etcd || echo /usr/bin/etcd)}"
TOKEN="cnetns-token-$$"
WORK="$(mktemp -d -t farmem-cnetns.XXXXXX)"

# Unique per run; interface names stay within 15 characters (5 + at most 7 pid digits).
NS0="fmcc_$$" # client host (routes between the others)
NSE="fmce_$$" # etcd host
NS1="fmc1_$$" # server host 1
NS2="fmc2_$$" # server host 2
IP0E=10.232.9.1 # ns0 on the etcd link
IPE=10.232.9.2  # etcd
IP01=10.232.1.1 # ns0 on link 1
IP1=10.232.1.2  # server 1
IP02=10.232.2.1 # ns0 on link 2
IP2=10.232.2.2  # server 2
ETCD_PORT=2379 # fresh namespaces: fixed ports cannot collide with anything
BOOT_PORT=7300
DATA_PORT=7301

CREATED_NS=()
PIDS=()

TEST_NAME=cluster_netns
LOG_GLOBS="$WORK/*.log"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

cleanup() {
  local rc=$? ns pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq 50); do
    local alive=0
    for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    ((alive)) || break
    sleep 0.1
  done
  for ns in "${CREATED_NS[@]}"; do
    # Anything still running inside one of our namespaces was started by this script.
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true # also removes the veth ends inside it
  done
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- preconditions: the only reasons to skip ------------------------------------------------------
netns_require
[[ -x "$ETCD" ]] || skip "etcd not found ($ETCD; apt install etcd-server)"
# Namespaces of earlier runs killed before their trap ran: ours by name, creator gone.
for stale in $(ip netns list 2>/dev/null | sed -n 's/^\(fmc[ce12]_\([0-9]*\)\).*/\1 \2/p' | tr ' ' ':'); do
  if ! kill -0 "${stale#*:}" 2>/dev/null; then ip netns del "${stale%%:*}" 2>/dev/null || true; fi
done
ip netns add "$NS0" 2>"$WORK/netns.err" || skip "cannot create a network namespace: $(head -n1 "$WORK/netns.err")"
CREATED_NS+=("$NS0")

[[ -x "$FARMEM" ]] || fail "farmem binary not found or not executable: $FARMEM"
[[ -x "$FARMEMD" ]] || fail "farmemd binary not found or not executable: $FARMEMD"

# --- topology --------------------------------------------------------------------------------------
log "namespaces: $NS0 (client, router) $NSE (etcd $IPE) $NS1 ($IP1) $NS2 ($IP2)"
for ns in "$NSE" "$NS1" "$NS2"; do
  ip netns add "$ns" || fail "ip netns add $ns"
  CREATED_NS+=("$ns")
done
for ns in "$NS0" "$NSE" "$NS1" "$NS2"; do ip -n "$ns" link set lo up || fail "lo up in $ns"; done
# The servers reach etcd through the client host, which therefore forwards (only inside its
# own namespace).
ip netns exec "$NS0" sysctl -qw net.ipv4.ip_forward=1 || fail "ip_forward in $NS0"

netns_link "$NS0" "fmce0_$$" "fmce1_$$" "$NSE" "$IP0E" "$IPE"
netns_link "$NS0" "fmc10_$$" "fmc11_$$" "$NS1" "$IP01" "$IP1"
netns_link "$NS0" "fmc20_$$" "fmc21_$$" "$NS2" "$IP02" "$IP2"

netns_probe "$NS0" "$IPE"
netns_probe "$NS1" "$IPE" # through the client host
netns_probe "$NS2" "$IPE"


# --- etcd --------------------------------------------------------------------------------------------
URL="etcd://$IPE:$ETCD_PORT"
log "etcd in $NSE at $IPE:$ETCD_PORT"
ip netns exec "$NSE" env ETCD_UNSUPPORTED_ARCH= "$ETCD" --name=e --data-dir="$WORK/etcd-data" \
  --listen-client-urls="http://$IPE:$ETCD_PORT" --advertise-client-urls="http://$IPE:$ETCD_PORT" \
  --listen-peer-urls="http://127.0.0.1:2380" --initial-advertise-peer-urls="http://127.0.0.1:2380" \
  --initial-cluster="e=http://127.0.0.1:2380" --logger=zap >"$WORK/etcd.log" 2>&1 </dev/null &
PIDS+=($!)
for _ in $(seq 200); do
  ip netns exec "$NS0" timeout 2 bash -c "exec 3<>/dev/tcp/$IPE/$ETCD_PORT" 2>/dev/null && break
  kill -0 "${PIDS[0]}" 2>/dev/null || fail "etcd exited at start"
  sleep 0.1
done

# --- two farmemds that know only etcd's address ------------------------------------------------------
i=0
for pair in "$NS1 $IP1" "$NS2 $IP2"; do
  read -r ns ip <<<"$pair"
  i=$((i + 1))
  ip netns exec "$ns" "$FARMEMD" --listen "$ip:$BOOT_PORT" --data-host "$ip" \
    --data-port "$DATA_PORT" --memory-mib 64 --token "$TOKEN" --name "server$i" \
    --cluster "$URL" --cluster-ttl 3 >"$WORK/server$i.out" 2>"$WORK/server$i.err" </dev/null &
  PIDS+=($!)
done
for i in 1 2; do
  wait_ready "$WORK/server$i.out" 30 "${PIDS[$i]}" >/dev/null ||
    fail "server$i did not get ready (joined the cluster) within 30 s"
done

# --- the client finds them through etcd ---------------------------------------------------------------
log "in $NS0: farmem cluster members --cluster $URL"
ip netns exec "$NS0" timeout 30 "$FARMEM" cluster members --cluster "$URL" --token "$TOKEN" \
  --data-host "$IP01" >"$WORK/members.out" 2>"$WORK/members.err" </dev/null ||
  fail "farmem cluster members failed"
cat "$WORK/members.out"
grep -q "^server1 *$IP1:$BOOT_PORT" "$WORK/members.out" || fail "server1 not listed at $IP1"
grep -q "^server2 *$IP2:$BOOT_PORT" "$WORK/members.out" || fail "server2 not listed at $IP2"
! grep -q '?' "$WORK/members.out" || fail "a member did not answer STAT"

log "in $NS0: farmem demo --cluster $URL"
rc=0
ip netns exec "$NS0" timeout --kill-after=5 90 "$FARMEM" demo --cluster "$URL" --token "$TOKEN" \
  --data-host "$IP01" >"$WORK/demo.out" 2>"$WORK/demo.err" </dev/null || rc=$?
((rc == 0)) || fail "farmem demo --cluster exited $rc"
for i in 1 2; do
  grep -q "node 'server$i'" "$WORK/demo.out" || fail "the demo never reached server$i"
done
grep -q '^demo passed' "$WORK/demo.out" || fail "no 'demo passed' line"
grep -E 'memory member|demo against|checks passed' "$WORK/demo.out"

# SIGTERM: both leave, exit 0.
for i in 1 2; do kill -TERM "${PIDS[$i]}"; done
for i in 1 2; do
  code=0
  wait "${PIDS[$i]}" || code=$?
  ((code == 0)) || fail "server$i exited $code after SIGTERM"
  grep -q 'cluster: left' "$WORK/server$i.err" || fail "server$i did not leave the cluster"
done
log "PASS"
