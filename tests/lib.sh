# Shell helpers shared by the integration tests in this folder (sourced, not run): log, fail and
# skip, waiting for farmemd's ready line or a `farmem mount`, and for the network-namespace tests
# their preconditions, veth links, reachability probe and scripts/netns_cluster runs. Callers run under `set -euo pipefail` and set, before sourcing,
# TEST_NAME (the prefix of every line) and WORK (their scratch folder); LOG_GLOBS, when set at
# failure time, names more files for fail to show (unquoted: it is globbed then).

log() { echo "$TEST_NAME: $*"; }

# The last 40 lines of every non-empty *.out and *.err in $WORK (and $LOG_GLOBS), on stderr.
dump_logs() {
  local f
  # shellcheck disable=SC2086 # LOG_GLOBS is a list of globs
  for f in "$WORK"/*.out "$WORK"/*.err ${LOG_GLOBS:-}; do
    [[ -s "$f" ]] || continue
    echo "----- $(basename "$f") -----" >&2
    tail -n 40 "$f" >&2
  done
}

# descendants <pid>: the pid and every process below it, one per line.
descendants() {
  local c
  echo "$1"
  for c in $(pgrep -P "$1" 2>/dev/null); do descendants "$c"; done
}

# dump_stuck <pid>: what a process that should have moved on (and everything below it) is doing:
# state, kernel wait channel and, with gdb, every thread's stack, so a failure in CI explains itself.
dump_stuck() {
  local p
  for p in $(descendants "$1"); do
    [[ -d /proc/$p ]] || continue
    echo "----- pid $p: $(tr '\0' ' ' <"/proc/$p/cmdline" | cut -c1-200)" >&2
    echo "state $(awk '/^State:/ {print $2, $3}' "/proc/$p/status"), wchan $(cat "/proc/$p/wchan" 2>/dev/null)" >&2
    if [[ "$(readlink "/proc/$p/exe" 2>/dev/null)" == */farmem* ]] && command -v gdb >/dev/null 2>&1; then
      timeout 60 gdb -p "$p" -batch -nx -ex 'set pagination off' -ex 'thread apply all bt' 2>&1 |
        grep -E '^(Thread|#)' | head -n 200 >&2 || true
    fi
  done
}

fail() {
  echo "$TEST_NAME: FAIL: $*" >&2
  dump_logs
  exit 1
}

skip() {
  echo "SKIP: $*"
  exit 0
}

# Skips the test (with the reason) unless network namespaces can be made: root, iproute2, `ip netns`.
netns_require() {
  ((EUID == 0)) || skip "network namespaces need root (running as uid $EUID)"
  command -v ip >/dev/null 2>&1 || skip "'ip' (iproute2) not installed"
  ip netns list >/dev/null 2>&1 || skip "'ip netns' is not available"
}

NETNS_HARNESS="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/scripts/netns_cluster"

# netns_case <label> <scripts/netns_cluster run arguments...>: one timed run of the three-namespace
# cluster (its options, --, the command); fails the test when the run fails.
netns_case() {
  local label=$1 start
  shift
  start=$(date +%s%N)
  "$NETNS_HARNESS" run "$@" || fail "$label failed"
  log "$label: OK in $((($(date +%s%N) - start) / 1000000)) ms"
}

# netns_wait_all <what> <out prefix> <result regex> <pid>...: waits for the clients started one per
# namespace (i = 1, 2, ...), logs each one's result line (the first line of <prefix>i.out that
# matches the regex) and its exit code when not 0; returns 1 when any exited non-zero.
netns_wait_all() {
  local what=$1 prefix=$2 re=$3 i=0 rc bad=0 pid line
  shift 3
  for pid in "$@"; do
    i=$((i + 1))
    rc=0
    wait "$pid" || rc=$?
    line="$(grep -m1 -E "$re" "$prefix$i.out" 2>/dev/null || true)"
    log "$what $i: ${line:-no result line}"
    if ((rc != 0)); then
      log "$what $i exited $rc" >&2
      bad=1
    fi
  done
  return "$bad"
}

# Stops process $1 if it still runs: SIGTERM, up to 5 s to exit, then SIGKILL. For cleanup traps.
stop_process() {
  local pid=$1
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
}

# Waits up to $2 seconds for the ready line in file $1 while process $3 lives; prints the line.
wait_ready() {
  local file=$1 secs=$2 pid=$3 line
  for _ in $(seq $((secs * 10))); do
    line="$(grep -m1 '^farmemd ready: ' "$file" 2>/dev/null || true)"
    if [[ -n "$line" ]]; then echo "$line"; return 0; fi
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# netns_link <hub-ns> <hub-if> <other-if> <other-ns> <hub-ip> <other-ip>: a veth pair between the
# hub namespace (the client host) and another one, /24 addresses, both ends up, and the other
# namespace's default route through the hub — a routed network: libfabric tcp;ofi_rxm servers open
# their own connections back to the client's fabric address, and namespaces behind the hub reach
# each other through it (the hub forwards when ip_forward is on).
netns_link() {
  local hub=$1 hub_if=$2 other_if=$3 other=$4 hub_ip=$5 other_ip=$6
  ip link add "$hub_if" netns "$hub" type veth peer name "$other_if" netns "$other" ||
    fail "veth $hub_if<->$other_if"
  ip -n "$hub" addr add "$hub_ip/24" dev "$hub_if" || fail "addr $hub_ip on $hub_if"
  ip -n "$other" addr add "$other_ip/24" dev "$other_if" || fail "addr $other_ip on $other_if"
  ip -n "$hub" link set "$hub_if" up || fail "link up $hub_if"
  ip -n "$other" link set "$other_if" up || fail "link up $other_if"
  ip -n "$other" route add default via "$hub_ip" || fail "default route in $other"
}

# netns_probe <ns> <ip>: reachable without ping (not always installed) — bash's /dev/tcp to a port
# nothing listens on must be *refused*, not time out.
netns_probe() {
  local ns=$1 ip=$2 out
  out="$(ip netns exec "$ns" timeout 5 bash -c "exec 3<>/dev/tcp/$ip/9" 2>&1 || true)"
  grep -qi 'refused' <<<"$out" || fail "no route from $ns to $ip ($out)"
}

# expect_root_refused <script> <arg>...: the script, run as `nobody`, must exit 1 at once saying it
# needs root (before it creates anything). Not checked (said in the log) without a `nobody` user
# that can run it.
expect_root_refused() {
  local script=$1 rc=0 out="$WORK/nonroot.out"
  if ! id nobody >/dev/null 2>&1 || ! runuser -u nobody -- test -x "$script" 2>/dev/null; then
    log "no 'nobody' user that can run $script: the non-root refusal is not checked"
    return 0
  fi
  runuser -u nobody -- "$@" >"$out" 2>&1 || rc=$?
  ((rc == 1)) || fail "as nobody: exit $rc, want 1"
  grep -q 'need root' "$out" || fail "as nobody: no reason given: $(cat "$out")"
  log "as nobody: $(cat "$out")"
}

# netns_test_start: what every scripts/netns_cluster test does first (after sourcing this file):
# its own set of namespace names (fm-test-ns1..3, or $NETNS_TEST_PREFIX: a cluster someone started
# with `netns_cluster up` is not disturbed), `down` and removing $WORK on exit, and the
# preconditions (else SKIP).
netns_test_start() {
  export NETNS_PREFIX="${NETNS_TEST_PREFIX:-fm-test-ns}"
  # shellcheck disable=SC2064 # WORK is fixed by now
  trap "\"$NETNS_HARNESS\" down >/dev/null 2>&1 || true; [[ -z \"$WORK\" ]] || rm -rf \"$WORK\"" EXIT
  netns_require
}

# Waits up to 10 s until `farmem mount` (pid $3, stdout in file $1) printed its mounted line and
# $2 is in /proc/mounts; fails if the process exits first or the time runs out.
wait_mounted() {
  local out=$1 mnt=$2 pid=$3
  for _ in $(seq 100); do
    grep -q '^regions: mounted at' "$out" 2>/dev/null && grep -qs " $mnt " /proc/mounts && return 0
    kill -0 "$pid" 2>/dev/null || fail "farmem mount at $mnt exited"
    sleep 0.1
  done
  fail "$mnt not mounted within 10 s"
}
