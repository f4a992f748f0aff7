#!/usr/bin/env bash
# Multi-host test on one machine: three network namespaces joined by veth links stand in for a
# client host and two memory-server hosts; `farmem demo` in the client namespace uses both farmemd
# instances, once over native TCP and once over libfabric "tcp;ofi_rxm". Needs root (else SKIP).
set -euo pipefail

FARMEM="${1:?usage: $0 path/to/farmem path/to/farmemd}"
FARMEMD="${2:?usage: $0 path/to/farmem path/to/farmemd}"
TOKEN="netns-token-$$"
WORK="$(mktemp -d -t farmem-netns.XXXXXX)"

# Unique per run so concurrent runs (and leftovers of a killed run) never clash. Interface names
# must stay within 15 characters: 5 + at most 7 pid digits.
NS0="fmem0_$$" # client host
NS1="fmem1_$$" # server host 1
NS2="fmem2_$$" # server host 2
V01="fmc1_$$"  # client end of the ns0<->ns1 link
V10="fms1_$$"  # server end of the ns0<->ns1 link
V02="fmc2_$$"
V20="fms2_$$"
IP01=10.231.1.1 # ns0 on link 1
IP1=10.231.1.2  # ns1
IP02=10.231.2.1 # ns0 on link 2
IP2=10.231.2.2  # ns2
# Waits below are sized so both cases finish well inside ctest's 300 s limit even when everything
# times out: per case 2 x 20 s ready + 60 s demo + 2 x 15 s shutdown.
BOOT_PORT=7300  # fresh namespaces: fixed ports cannot collide with anything
DATA_PORT=7301

CREATED_NS=()
SERVER_PIDS=()

TEST_NAME=multihost
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

stop_servers() {
  local pid
  for pid in "${SERVER_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq 50); do
    local alive=0
    for pid in "${SERVER_PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    ((alive)) || break
    sleep 0.1
  done
  for pid in "${SERVER_PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  SERVER_PIDS=()
}

cleanup() {
  local rc=$? ns pid
  stop_servers
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
# Namespaces of earlier runs that were killed before their trap ran (e.g. by a ctest timeout):
# ours by name, and their creator is gone.
for stale in $(ip netns list 2>/dev/null | sed -n 's/^\(fmem[012]_\([0-9]*\)\).*/\1 \2/p' | tr ' ' ':'); do
  if ! kill -0 "${stale#*:}" 2>/dev/null; then ip netns del "${stale%%:*}" 2>/dev/null || true; fi
done
ip netns add "$NS0" 2>"$WORK/netns.err" || skip "cannot create a network namespace: $(head -n1 "$WORK/netns.err")"
CREATED_NS+=("$NS0")

[[ -x "$FARMEM" ]] || fail "farmem binary not found or not executable: $FARMEM"
[[ -x "$FARMEMD" ]] || fail "farmemd binary not found or not executable: $FARMEMD"

# --- topology --------------------------------------------------------------------------------------
log "creating namespaces $NS0 (client) $NS1 $NS2 (servers)"
for ns in "$NS1" "$NS2"; do
  ip netns add "$ns" || fail "ip netns add $ns"
  CREATED_NS+=("$ns")
done
for ns in "$NS0" "$NS1" "$NS2"; do ip -n "$ns" link set lo up || fail "lo up in $ns"; done

netns_link "$NS0" "$V01" "$V10" "$NS1" "$IP01" "$IP1"
netns_link "$NS0" "$V02" "$V20" "$NS2" "$IP02" "$IP2"

netns_probe "$NS0" "$IP1"
netns_probe "$NS0" "$IP2"
netns_probe "$NS1" "$IP02" # server 1 reaches the client's link-2 address through the client host
netns_probe "$NS2" "$IP01"

# --- helpers ---------------------------------------------------------------------------------------
# wait_ready (shared with the other integration tests)

# Does `farmem demo` take its own data-path host? (Then the client binds a routable address.)
CLIENT_HOST_FLAG=0
if "$FARMEM" demo --help 2>/dev/null | grep -q -- '--data-host'; then CLIENT_HOST_FLAG=1; fi

# run_case <label> <backend flags...>: two servers, one client run, clean server shutdown.
run_case() {
  local label=$1
  shift
  local flags=("$@") ns ip pid i ready rc
  log "=== $label: farmemd in $NS1 ($IP1) and $NS2 ($IP2) with ${flags[*]}"
  i=0
  for pair in "$NS1 $IP1" "$NS2 $IP2"; do
    read -r ns ip <<<"$pair"
    i=$((i + 1))
    ip netns exec "$ns" "$FARMEMD" --listen "$ip:$BOOT_PORT" "${flags[@]}" \
      --data-host "$ip" --data-port "$DATA_PORT" --memory-mib 64 --pool-mib 16 \
      --token "$TOKEN" --name "server$i" --workers 1 \
      >"$WORK/$label-server$i.out" 2>"$WORK/$label-server$i.err" </dev/null &
    SERVER_PIDS+=($!)
  done
  i=0
  for pid in "${SERVER_PIDS[@]}"; do
    i=$((i + 1))
    ready="$(wait_ready "$WORK/$label-server$i.out" 20 "$pid")" ||
      fail "$label: server$i did not print its ready line within 20s"
    log "$label: server$i: $ready"
    grep -q "bootstrap=$([[ $i == 1 ]] && echo "$IP1" || echo "$IP2"):$BOOT_PORT" <<<"$ready" ||
      fail "$label: server$i is not bound to its veth address: $ready"
  done

  local client=("$FARMEM" demo --connect "$IP1:$BOOT_PORT" --connect "$IP2:$BOOT_PORT"
    "${flags[@]}" --token "$TOKEN")
  ((CLIENT_HOST_FLAG)) && client+=(--data-host "$IP01")
  log "$label: in $NS0: ${client[*]}"
  rc=0
  ip netns exec "$NS0" timeout --kill-after=5 60 "${client[@]}" \
    >"$WORK/$label-client.out" 2>"$WORK/$label-client.err" </dev/null || rc=$?
  ((rc != 124)) || fail "$label: farmem demo did not finish within 60s"
  ((rc == 0)) || fail "$label: farmem demo exited $rc"
  # Exit 0 alone could hide a demo that silently skipped a server: each must have answered STAT.
  for i in 1 2; do
    grep -q "node 'server$i'" "$WORK/$label-client.out" ||
      fail "$label: the demo output never shows server$i answering STAT"
  done
  grep -q '^demo passed' "$WORK/$label-client.out" || fail "$label: no 'demo passed' line"
  grep -E 'demo against|checks passed' "$WORK/$label-client.out"

  # Both servers must still be up, and stop cleanly on SIGTERM.
  for pid in "${SERVER_PIDS[@]}"; do
    kill -0 "$pid" 2>/dev/null || fail "$label: a server died during the demo"
    kill -TERM "$pid"
  done
  for pid in "${SERVER_PIDS[@]}"; do
    local code=124
    for _ in $(seq 150); do
      if ! kill -0 "$pid" 2>/dev/null; then
        code=0
        wait "$pid" || code=$?
        break
      fi
      sleep 0.1
    done
    ((code == 0)) || fail "$label: farmemd (pid $pid) exited $code after SIGTERM (124: still running after 15s)"
  done
  SERVER_PIDS=()
  log "$label: OK"
}

run_case tcp --backend tcp
run_case fabric-tcp --backend fabric --provider "tcp;ofi_rxm"

log "PASS"
