#!/usr/bin/env bash
# etcd lost under a running cluster, on 127.0.0.1: a farmemd joined through etcd keeps serving
# the data path (demo --connect, stat) while etcd is killed; control-plane commands fail cleanly
# and quickly; when etcd comes back (same data) after longer than the lease TTL, the farmemd
# keeps its membership (etcd restores leases); when its lease is then revoked it re-joins by
# itself, and a watcher started before the outage resumes and sees the expiry and the re-join,
# each once. SKIP without etcd. Usage: cluster_etcd_loss_test.sh FARMEM FARMEMD.
set -euo pipefail

FARMEM="${1:?usage: $0 path/to/farmem path/to/farmemd}"
FARMEMD="${2:?usage: $0 path/to/farmem path/to/farmemd}"
ETCD="${FARMEM_ETCD:-$(command -v etcd || echo /usr/bin/etcd)}"
export FARMEM_TOKEN="etcd-loss-$$"
unset FARMEM_CLUSTER
TTL=2
WORK="$(mktemp -d -t farmem-etcd-loss.XXXXXX)"
ETCD_PID=""
SERVER_PID=""
WATCH_PID=""

TEST_NAME=cluster_etcd_loss
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cleanup() {
  local rc=$? pid
  for pid in "$WATCH_PID" "$SERVER_PID" "$ETCD_PID"; do
    [[ -z "$pid" ]] || kill -KILL "$pid" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[[ -x "$FARMEM" && -x "$FARMEMD" ]] || fail "farmem/farmemd not executable: $FARMEM $FARMEMD"
[[ -x "$ETCD" ]] || { echo "SKIP: etcd not found ($ETCD)"; exit 0; }

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}
now_ms() { date +%s%3N; }

CPORT="$(free_port)"
PPORT="$(free_port)"
URL="etcd://127.0.0.1:$CPORT"
start_etcd() {
  "$ETCD" --name loss --data-dir "$WORK/etcd" \
    --listen-client-urls "http://127.0.0.1:$CPORT" --advertise-client-urls "http://127.0.0.1:$CPORT" \
    --listen-peer-urls "http://127.0.0.1:$PPORT" --initial-advertise-peer-urls "http://127.0.0.1:$PPORT" \
    --initial-cluster "loss=http://127.0.0.1:$PPORT" >>"$WORK/etcd.err" 2>&1 </dev/null &
  ETCD_PID=$!
  local out
  for _ in $(seq 100); do
    # Before the cluster exists `list` says NotFound ("no cluster"): etcd answers, which is all
    # this waits for.
    out="$("$FARMEM" cluster list --cluster "$URL" --cluster-name loss 2>&1 || true)"
    [[ "$out" != *Unavailable* && "$out" != *TimedOut* ]] && return 0
    sleep 0.1
  done
  fail "etcd did not come up on port $CPORT"
}

log "starting etcd on $CPORT"
start_etcd
"$FARMEMD" --listen 127.0.0.1:0 --data-port 0 --memory-mib 32 --pool-mib 16 --name mem-a \
  --cluster "$URL" --cluster-name loss --cluster-ttl "$TTL" \
  >"$WORK/farmemd.out" 2>"$WORK/farmemd.err" </dev/null &
SERVER_PID=$!
ready="$(wait_ready "$WORK/farmemd.out" 20 "$SERVER_PID")" || fail "farmemd not ready"
ADDR="$(sed -n 's/.*bootstrap=\([^ ]*\).*/\1/p' <<<"$ready")"
log "farmemd ready at $ADDR"
"$FARMEM" cluster members --cluster "$URL" --cluster-name loss --json >"$WORK/members1.out" ||
  fail "members failed"
grep -q '"mem-a"' "$WORK/members1.out" || fail "mem-a is not a member"

# A watcher that lives through the outage: it must report mem-a's expiry and re-join, once each.
"$FARMEM" cluster watch --cluster "$URL" --cluster-name loss --json --count 2 --timeout 60 \
  >"$WORK/watch.out" 2>"$WORK/watch.err" </dev/null &
WATCH_PID=$!
sleep 0.5

log "killing etcd (SIGKILL) for $((TTL + 2)) s"
kill -KILL "$ETCD_PID"
wait "$ETCD_PID" 2>/dev/null || true
ETCD_PID=""

# The data path does not need the control plane.
"$FARMEM" demo --connect "$ADDR" >"$WORK/demo.out" 2>"$WORK/demo.err" ||
  fail "demo --connect failed while etcd was down"
"$FARMEM" stat "$ADDR" --json >"$WORK/stat.out" 2>"$WORK/stat.err" ||
  fail "stat failed while etcd was down"
log "  demo and stat served while etcd is down"
# Control-plane calls fail cleanly and within their timeout.
t0="$(now_ms)"
rc=0
"$FARMEM" cluster members --cluster "$URL" --cluster-name loss >"$WORK/members_down.out" \
  2>"$WORK/members_down.err" || rc=$?
took=$(($(now_ms) - t0))
((rc == 1)) || fail "members with etcd down exited $rc (want 1)"
((took < 10000)) || fail "members with etcd down took $took ms"
grep -q 'Unavailable\|TimedOut' "$WORK/members_down.err" || fail "members did not say etcd is unavailable"
log "  members with etcd down: exit 1 after $took ms"
sleep $((TTL + 1))

log "restarting etcd"
start_etcd
# etcd 3.4 restores leases with a full TTL when it becomes leader again, so mem-a is still a
# member; it never expired for anyone (nobody could see it expire while etcd was down).
"$FARMEM" cluster members --cluster "$URL" --cluster-name loss --json >"$WORK/members2.out" ||
  fail "members failed after etcd's return"
grep -q '"mem-a"' "$WORK/members2.out" || fail "mem-a is not a member after etcd's return"
log "  mem-a still a member after etcd's return"

# Make its lease expire for real (as a long partition would): the watcher sees the expiry, and
# farmemd's keepalive finds its lease gone and re-joins by itself.
ETCDCTL="$(dirname "$ETCD")/etcdctl"
[[ -x "$ETCDCTL" ]] || fail "etcdctl not found next to $ETCD"
leases="$(ETCDCTL_API=3 "$ETCDCTL" --endpoints "127.0.0.1:$CPORT" lease list | sed -n 's/^ *\([0-9a-f]\{8,\}\)$/\1/p')"
[[ -n "$leases" ]] || fail "no lease in etcd"
for l in $leases; do
  ETCDCTL_API=3 "$ETCDCTL" --endpoints "127.0.0.1:$CPORT" lease revoke "$l" >/dev/null ||
    fail "etcdctl lease revoke $l failed"
done
log "  revoked mem-a's lease ($leases)"
for _ in $(seq 100); do
  if "$FARMEM" cluster members --cluster "$URL" --cluster-name loss --json 2>/dev/null |
    grep -q '"mem-a"'; then
    break
  fi
  sleep 0.1
done
"$FARMEM" cluster members --cluster "$URL" --cluster-name loss --json | grep -q '"mem-a"' ||
  fail "mem-a did not re-join within 10 s of losing its lease"
log "  mem-a re-joined"
"$FARMEM" stat "$ADDR" --json >"$WORK/stat2.out" 2>"$WORK/stat2.err" || fail "stat failed"
grep -q '"rejoins": *[1-9]' "$WORK/stat2.out" || fail "farmemd STAT counts no re-join"

# The watcher resumed: exactly one expire and one join of mem-a, in that order (members present
# when it started are printed as "member" lines, not changes).
for _ in $(seq 100); do
  kill -0 "$WATCH_PID" 2>/dev/null || break
  sleep 0.1
done
wait "$WATCH_PID" || fail "watch exited non-zero"
WATCH_PID=""
events="$(python3 -c 'import json,sys; print(" ".join(e for e in (json.loads(l)["event"] for l in open(sys.argv[1]) if l.strip()) if e != "member"))' "$WORK/watch.out")" ||
  fail "watch printed no JSON lines"
[[ "$events" == "expire join" ]] || fail "watcher saw '$events', want 'expire join'"
log "  watcher resumed: $events"

kill -TERM "$SERVER_PID"
wait "$SERVER_PID" || fail "farmemd exited non-zero after SIGTERM"
SERVER_PID=""
log "PASS"
