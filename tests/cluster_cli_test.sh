#!/usr/bin/env bash
# The control plane end to end on 127.0.0.1: `farmem cluster up` (a real etcd plus 2 farmemds),
# members, the demo through --cluster, metadata put/get/list/remove and their errors, a killed
# farmemd seen as an expiry within TTL + 1 s, a SIGTERMed one as a leave, a farmemd whose etcd is
# dead exiting 2, transactions whose servers are found through the membership (role "tx"), and
# `farmem cluster down` leaving no process behind. SKIP without etcd.
# Usage: cluster_cli_test.sh FARMEM FARMEMD (from ctest).
set -euo pipefail

FARMEM="${1:?usage: $0 path/to/farmem path/to/farmemd}"
FARMEMD="${2:?usage: $0 path/to/farmem path/to/farmemd}"
ETCD="${FARMEM_ETCD:-$(command -v etcd || echo /usr/bin/etcd)}"
TOKEN="cluster-token-$$"
export FARMEM_TOKEN="$TOKEN" # reaches the farmemds of `cluster up` and every client below
unset FARMEM_CLUSTER
TTL=2 # short lease: the expiry part waits at most TTL + 1 s
WORK="$(mktemp -d -t farmem-cluster.XXXXXX)"
DIR="$WORK/cluster"
EXTRA_PID=""
TX_PIDS=() # the tx farmemds of the discovery part
PIDS=() # every process of the cluster, for the final check and the cleanup

TEST_NAME=cluster_cli
LOG_GLOBS="$DIR/*.log"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# A process is gone when it no longer exists or is a zombie (a detached daemon's parent may be
# an init that does not reap).
alive() {
  local state
  state="$(ps -o stat= -p "$1" 2>/dev/null || true)"
  [[ -n "$state" && "$state" != Z* ]]
}

cleanup() {
  local rc=$? pid
  [[ -z "$EXTRA_PID" ]] || kill -KILL "$EXTRA_PID" 2>/dev/null || true
  for pid in "${TX_PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  if [[ -f "$DIR/cluster.json" ]]; then
    timeout 30 "$FARMEM" cluster down --dir "$DIR" --wait 5 >/dev/null 2>&1 || true
  fi
  for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[[ -x "$FARMEM" ]] || fail "farmem binary not found or not executable: $FARMEM"
[[ -x "$FARMEMD" ]] || fail "farmemd binary not found or not executable: $FARMEMD"
[[ -x "$ETCD" ]] || skip "etcd not found ($ETCD; apt install etcd-server)"

# wait_ready (shared with the other integration tests)

# run NAME EXPECTED_RC CMD...: runs CMD with a timeout, output in $WORK/NAME.{out,err}; fails
# unless it exits EXPECTED_RC ("nz": any non-zero except a timeout).
run() {
  local name=$1 want=$2 rc=0
  shift 2
  timeout --kill-after=5 60 "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" </dev/null || rc=$?
  ((rc != 124)) || fail "$name: timed out: $*"
  if [[ "$want" == nz ]]; then
    ((rc != 0)) || fail "$name: exited 0, want an error: $*"
  else
    ((rc == want)) || fail "$name: exited $rc, want $want: $*"
  fi
}

# Times in milliseconds (bash's EPOCHREALTIME: no process per measurement).
now() { local t=${EPOCHREALTIME/./}; echo $((t / 1000)); }
elapsed_ms() { echo $(($(now) - $1)); }

# --- up ----------------------------------------------------------------------------------------------
log "farmem cluster up --nodes 2 (etcd $ETCD, lease ${TTL} s)"
run up 0 "$FARMEM" cluster up --nodes 2 --dir "$DIR" --cluster-ttl "$TTL" --etcd "$ETCD" \
  --farmemd "$FARMEMD" --wait 60
cat "$WORK/up.out"
grep -q 'farmemd(s) joined' "$WORK/up.out" || fail "cluster up showed no progress"
URL="$(sed -n 's/^export FARMEM_CLUSTER=//p' "$WORK/up.out")"
[[ "$URL" =~ ^etcd://127\.0\.0\.1:[0-9]+$ ]] || fail "cluster up printed no usable URL: '$URL'"
[[ -f "$DIR/cluster.json" ]] || fail "no $DIR/cluster.json"
read -r ETCD_PID NODE1_PID NODE2_PID < <(python3 - "$DIR/cluster.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["cluster_name"] == "default" and d["url"].startswith("etcd://"), d
assert [n["name"] for n in d["nodes"]] == ["node-1", "node-2"], d["nodes"]
print(d["etcd"]["pid"], d["nodes"][0]["pid"], d["nodes"][1]["pid"])
PY
) || fail "cluster.json is not what up should write"
PIDS=("$NODE1_PID" "$NODE2_PID" "$ETCD_PID")
for pid in "${PIDS[@]}"; do alive "$pid" || fail "process $pid of cluster.json is not running"; done
log "etcd pid $ETCD_PID, farmemds $NODE1_PID $NODE2_PID at $URL"

log "a second up on the same directory must be refused"
run up_again 1 "$FARMEM" cluster up --nodes 1 --dir "$DIR" --etcd "$ETCD" --farmemd "$FARMEMD"
grep -q 'already runs a cluster' "$WORK/up_again.err" || fail "second up does not say why"

# --- members ------------------------------------------------------------------------------------------
log "farmem cluster members"
run members_json 0 "$FARMEM" cluster members --cluster "$URL" --json
python3 - "$WORK/members_json.out" <<'PY' || fail "members --json is wrong"
import json, sys
m = json.load(open(sys.argv[1]))
assert [x["name"] for x in m] == ["node-1", "node-2"], m
for x in m:
    assert x["roles"] == ["memory"], x
    assert x["address"].startswith("127.0.0.1:"), x
    assert x["stat"] is not None and x["stat"]["budget_bytes"] > 0, x
    assert x["capacity_bytes"] == 64 << 20, x
PY
FARMEM_CLUSTER="$URL" run members 0 "$FARMEM" cluster members # URL from the environment
cat "$WORK/members.out"
grep -q '^2 member(s), 2 with memory$' "$WORK/members.out" || fail "members table has no summary"

# --- demo and stat through the cluster ------------------------------------------------------------------
log "farmem demo --cluster $URL"
run demo 0 "$FARMEM" demo --cluster "$URL"
for n in node-1 node-2; do
  grep -q "node '$n'" "$WORK/demo.out" || fail "the demo never reached $n"
done
grep -q '^demo passed' "$WORK/demo.out" || fail "the demo did not pass"
run stat_member 0 "$FARMEM" stat --cluster "$URL" node-2 --json
python3 - "$WORK/stat_member.out" "$URL" <<'PY' || fail "STAT of node-2 lacks its cluster section"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["node"] == "node-2", s["node"]
c = s["cluster"]
assert c["url"] == sys.argv[2] and c["name"] == "default" and c["joined"] is True, c
PY
run demo_both 2 "$FARMEM" demo --cluster "$URL" --connect 127.0.0.1:1
run stat_addr 2 "$FARMEM" stat --cluster "$URL" 127.0.0.1:1

# --- metadata ------------------------------------------------------------------------------------------
log "metadata put/get/list/remove"
run put 0 "$FARMEM" cluster put --cluster "$URL" cfg/alpha "first value"
printf 'from\na file' >"$WORK/value.txt"
run put_file 0 "$FARMEM" cluster put --cluster "$URL" cfg/beta --file "$WORK/value.txt"
run get 0 "$FARMEM" cluster get --cluster "$URL" cfg/alpha
[[ "$(cat "$WORK/get.out")" == "first value" ]] || fail "get returned '$(cat "$WORK/get.out")'"
run get_json 0 "$FARMEM" cluster get --cluster "$URL" cfg/beta --json
python3 -c 'import json,sys; v=json.load(open(sys.argv[1])); assert v["value"]=="from\na file", v' \
  "$WORK/get_json.out" || fail "get --json of the file value is wrong"
run list 0 "$FARMEM" cluster list --cluster "$URL" cfg/ --json
python3 -c 'import json,sys; k=[x["key"] for x in json.load(open(sys.argv[1]))]; assert k==["cfg/alpha","cfg/beta"], k' \
  "$WORK/list.out" || fail "list cfg/ is wrong"
run remove 0 "$FARMEM" cluster remove --cluster "$URL" cfg/alpha
run get_removed 1 "$FARMEM" cluster get --cluster "$URL" cfg/alpha
grep -q '^farmem: error: NotFound' "$WORK/get_removed.err" || fail "get of a removed key: no NotFound"
run remove_again 1 "$FARMEM" cluster remove --cluster "$URL" cfg/alpha

log "errors: bad key, unknown cluster name, bad URL, missing URL"
run bad_key 1 "$FARMEM" cluster get --cluster "$URL" ""
grep -q '^farmem: error: ' "$WORK/bad_key.err" || fail "bad key: no error line"
run long_key 1 "$FARMEM" cluster put --cluster "$URL" "$(head -c 2000 /dev/zero | tr '\0' k)" v
grep -q '^farmem: error: ' "$WORK/long_key.err" || fail "long key: no error line"
run wrong_name 1 "$FARMEM" cluster list --cluster "$URL" --cluster-name no-such-cluster
grep -q 'no-such-cluster' "$WORK/wrong_name.err" || fail "wrong cluster name: message does not name it"
grep -q 'default' "$WORK/wrong_name.err" || fail "wrong cluster name: message does not list the clusters there are"
run bad_url nz "$FARMEM" cluster list --cluster "bogus://nothing"
grep -q '^farmem: error: ' "$WORK/bad_url.err" || fail "bad URL: no error line"
DEAD_PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()')"
run dead_url 1 "$FARMEM" cluster list --cluster "etcd://127.0.0.1:$DEAD_PORT"
grep -q '^farmem: error: ' "$WORK/dead_url.err" || fail "unreachable etcd: no error line"
run no_url 2 "$FARMEM" cluster list

# --- a killed farmemd expires ----------------------------------------------------------------------------
# watch_until NAME PATTERN SECONDS: waits for PATTERN in $WORK/NAME.out.
watch_until() {
  local name=$1 pattern=$2 secs=$3 t0
  t0="$(now)"
  while ! grep -q "$pattern" "$WORK/$name.out" 2>/dev/null; do
    (($(elapsed_ms "$t0") <= secs * 1000)) || return 1
    sleep 0.05
  done
}

log "SIGKILL node-1: its membership must expire within TTL + 1 s"
"$FARMEM" cluster watch --cluster "$URL" --count 1 --timeout 30 >"$WORK/watch_kill.out" \
  2>"$WORK/watch_kill.err" </dev/null &
WATCH_PID=$!
watch_until watch_kill '^.* member *node-2' 10 >/dev/null || fail "watch did not list the members"
t_kill="$(now)"
kill -KILL "$NODE1_PID"
watch_until watch_kill ' expire *node-1' $((TTL + 5)) || fail "no expire event for node-1"
# Measured when the line is in the watch's output: the bound includes the watch's delivery.
took="$(elapsed_ms "$t_kill")"
((took <= (TTL + 1) * 1000)) ||
  fail "the expire event came $took ms after the kill (lease $TTL s; want <= $((TTL + 1)) s)"
log "  expire seen $took ms after SIGKILL (bound $((TTL + 1)) s)"
rc=0
wait "$WATCH_PID" || rc=$?
((rc == 0)) || fail "watch --count 1 exited $rc after its event"
cat "$WORK/watch_kill.out"

# --- a SIGTERMed farmemd leaves ------------------------------------------------------------------------
log "farmemd with SIGTERM: leave, not expire"
"$FARMEMD" --listen 127.0.0.1:0 --memory-mib 32 --name extra --cluster "$URL" --cluster-ttl "$TTL" \
  >"$WORK/extra.out" 2>"$WORK/extra.err" </dev/null &
EXTRA_PID=$!
wait_ready "$WORK/extra.out" 20 "$EXTRA_PID" >/dev/null || fail "farmemd 'extra' not ready"
"$FARMEM" cluster watch --cluster "$URL" --count 1 --timeout 30 --json >"$WORK/watch_term.out" \
  2>"$WORK/watch_term.err" </dev/null &
WATCH_PID=$!
watch_until watch_term '"name":"extra"' 10 >/dev/null || fail "watch does not list 'extra'"
kill -TERM "$EXTRA_PID"
rc=0
wait "$EXTRA_PID" || rc=$?
EXTRA_PID=""
((rc == 0)) || fail "farmemd 'extra' exited $rc after SIGTERM"
rc=0
wait "$WATCH_PID" || rc=$?
((rc == 0)) || fail "watch of the leave exited $rc"
python3 - "$WORK/watch_term.out" <<'PY' || fail "SIGTERM did not show as a leave"
import json, sys
events = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
changes = [e for e in events if e["event"] != "member"]
assert [(e["event"], e["name"]) for e in changes] == [("leave", "extra")], changes
PY
grep -q 'cluster: left' "$WORK/extra.err" || fail "farmemd 'extra' did not log its leave"

# --- tx servers found through the membership ---------------------------------------------------------
log "two farmemds with a tx table join with role tx; tx-bank finds them with --cluster"
for p in 0 1; do
  "$FARMEMD" --listen 127.0.0.1:0 --memory-mib 32 --name "tx-$p" --cluster "$URL" \
    --cluster-ttl "$TTL" --tx-table bank:8:8:64:2 --tx-partition "$p" --tx-partitions 2 \
    >"$WORK/tx$p.out" 2>"$WORK/tx$p.err" </dev/null &
  TX_PIDS+=($!)
  wait_ready "$WORK/tx$p.out" 20 "$!" >/dev/null || fail "farmemd 'tx-$p' not ready"
done
run tx_members 0 "$FARMEM" cluster members --cluster "$URL" --json
python3 - "$WORK/tx_members.out" <<'PY' || fail "the tx farmemds do not announce role tx"
import json, sys
roles = {x["name"]: x["roles"] for x in json.load(open(sys.argv[1]))}
assert roles["tx-0"] == ["memory", "tx"] and roles["tx-1"] == ["memory", "tx"], roles
assert roles["node-2"] == ["memory"], roles  # no tx table: not a tx server
PY
run tx_init 0 "$FARMEM" bench tx-bank init --cluster "$URL" --accounts 40
run tx_run 0 "$FARMEM" bench tx-bank run --cluster "$URL" --accounts 40 --seconds 1 --min-audits 3
grep -q '^tx-bank run: transfers' "$WORK/tx_run.out" || fail "tx-bank run printed no summary"
run tx_check 0 "$FARMEM" bench tx-bank check --cluster "$URL" --accounts 40
run tx_both 2 "$FARMEM" bench tx-bank check --cluster "$URL" --connect 127.0.0.1:1
run tx_neither 2 "$FARMEM" bench tx-bank check
grep -q 'either --connect or --cluster' "$WORK/tx_neither.err" || fail "no usage message"
kill -TERM "${TX_PIDS[1]}"
wait "${TX_PIDS[1]}" || fail "farmemd 'tx-1' exited $? after SIGTERM"
run tx_left 1 "$FARMEM" bench tx-bank check --cluster "$URL" --accounts 40
grep -q 'no server holds partition 1 of table bank' "$WORK/tx_left.err" ||
  fail "a partition whose member left is not named: $(cat "$WORK/tx_left.err")"
kill -TERM "${TX_PIDS[0]}"
wait "${TX_PIDS[0]}" || fail "farmemd 'tx-0' exited $? after SIGTERM"
TX_PIDS=()
run tx_none 1 "$FARMEM" bench tx-bank check --cluster "$URL"
grep -q "no member of cluster 'default' serves tx" "$WORK/tx_none.err" ||
  fail "no tx member is not a clear error: $(cat "$WORK/tx_none.err")"

# --- a farmemd whose etcd is dead ----------------------------------------------------------------------
log "farmemd --cluster at a dead port must exit 2 within a few seconds"
t0="$(now)"
run dead_etcd 2 "$FARMEMD" --listen 127.0.0.1:0 --cluster "etcd://127.0.0.1:$DEAD_PORT"
took="$(elapsed_ms "$t0")"
((took < 10000)) || fail "farmemd took $took ms to give up on a dead etcd"
log "  exit 2 after $took ms"
grep -q "^farmemd: error: .*127.0.0.1:$DEAD_PORT" "$WORK/dead_etcd.err" ||
  fail "farmemd's error does not name the cluster: $(cat "$WORK/dead_etcd.err")"
! grep -q '^farmemd ready' "$WORK/dead_etcd.out" || fail "farmemd said ready without its cluster"

# --- down ----------------------------------------------------------------------------------------------
log "farmem cluster down"
run down 0 "$FARMEM" cluster down --dir "$DIR"
cat "$WORK/down.out"
grep -q 'stopped node-2' "$WORK/down.out" || fail "down did not report stopping node-2"
grep -q 'stopped etcd' "$WORK/down.out" || fail "down did not report stopping etcd"
for pid in "${PIDS[@]}"; do
  ! alive "$pid" || fail "process $pid still runs after cluster down"
done
[[ ! -f "$DIR/cluster.json" ]] || fail "cluster.json is still there after down"
run down_again 1 "$FARMEM" cluster down --dir "$DIR"
grep -q 'cluster.json' "$WORK/down_again.err" || fail "a second down does not say why it refuses"
PIDS=()

log "PASS"
