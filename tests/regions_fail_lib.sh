# Shell helpers of the remote-regions failure tests (tests/regions_fail_*_test.sh; sourced after
# lib.sh, not run): an etcd on free loopback ports that can be stopped and restarted on the same
# data dir, a farmemd, `farmem mount --cluster ... --server ...` (also retried while a namespace
# mounted exclusively is still claimed by a killed mount), namespace snapshots, and a cleanup that unmounts every
# mount and kills only the processes these helpers started. Callers set FARMEM and FARMEMD, call
# fail_test_start first and run under `set -euo pipefail`.

ETCD="${FARMEM_ETCD:-$(command -v etcd || echo /usr/bin/etcd)}"
ETCD_PID=""
SERVER_PID=""
MOUNT_PID=""
HELPER_PIDS=()  # more children to kill on exit (python helpers)
MOUNTS=()       # mount points to detach on exit

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}
now_ms() { date +%s%3N; }

fail_cleanup() {
  local rc=$? m pid
  for m in "${MOUNTS[@]}"; do
    if grep -qs " $m " /proc/mounts; then timeout 10 fusermount3 -uz "$m" 2>/dev/null || true; fi
  done
  for pid in "${HELPER_PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  stop_process "$MOUNT_PID"
  for pid in "$SERVER_PID" "$ETCD_PID"; do [[ -z "$pid" ]] || kill -KILL "$pid" 2>/dev/null || true; done
  # Every child is dead or dying: the wait is bounded by their exit.
  wait 2>/dev/null || true
  rm -rf "$WORK"
  exit "$rc"
}

# Starts etcd (ports chosen on the first call, data in $WORK/etcd: a restart keeps it) and waits up
# to 10 s until it answers; sets ETCD_PID and CLUSTER_URL.
start_etcd() {
  [[ -n "${ETCD_CPORT:-}" ]] || { ETCD_CPORT="$(free_port)"; ETCD_PPORT="$(free_port)"; }
  CLUSTER_URL="etcd://127.0.0.1:$ETCD_CPORT"
  "$ETCD" --name rfail --data-dir "$WORK/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_CPORT" \
    --advertise-client-urls "http://127.0.0.1:$ETCD_CPORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PPORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PPORT" \
    --initial-cluster "rfail=http://127.0.0.1:$ETCD_PPORT" >>"$WORK/etcd.log" 2>&1 </dev/null &
  ETCD_PID=$!
  local out
  for _ in $(seq 100); do
    # Before the cluster exists `list` says NotFound: etcd answers, which is all this waits for.
    out="$(timeout 10 "$FARMEM" cluster list --cluster "$CLUSTER_URL" 2>&1 || true)"
    [[ "$out" != *Unavailable* && "$out" != *TimedOut* ]] && return 0
    kill -0 "$ETCD_PID" 2>/dev/null || fail "etcd exited"
    sleep 0.1
  done
  fail "etcd did not answer on port $ETCD_CPORT within 10 s"
}

# Starts a farmemd (pools only, 64 MiB) on loopback; sets SERVER_PID and SERVER_ADDR.
start_farmemd() {
  "$FARMEMD" --listen 127.0.0.1:0 --data-port 0 --memory-mib 64 --pool-mib 16 --services pools \
    --name rfail-mem >"$WORK/farmemd.out" 2>"$WORK/farmemd.err" </dev/null &
  SERVER_PID=$!
  local ready
  ready="$(wait_ready "$WORK/farmemd.out" 20 "$SERVER_PID")" || fail "farmemd not ready"
  SERVER_ADDR="$(sed -n 's/.*bootstrap=\([^ ]*\).*/\1/p' <<<"$ready")"
}

# fail_test_start NAME [etcd]: what each failure test does first — TEST_NAME, its own cluster
# token, WORK (a new temp dir) and MNT in it, the cleanup trap, and the preconditions: SKIP
# without /dev/fuse (or etcd, when the second argument is "etcd"); logs FARMEM_REGIONS_FAULT.
fail_test_start() {
  TEST_NAME=$1
  export FARMEM_TOKEN="$1-$$"
  unset FARMEM_CLUSTER
  WORK="$(mktemp -d -t "farmem-$1.XXXXXX")"
  MNT="$WORK/mnt"
  trap fail_cleanup EXIT
  [[ -c /dev/fuse ]] || skip "/dev/fuse is missing"
  if [[ "${2:-}" == etcd && ! -x "$ETCD" ]]; then skip "etcd not found ($ETCD)"; fi
  command -v fusermount3 >/dev/null || fail "fusermount3 not found (apt install fuse3)"
  if [[ -n "${FARMEM_REGIONS_FAULT:-}" ]]; then log "fault: FARMEM_REGIONS_FAULT=$FARMEM_REGIONS_FAULT"; fi
}

# start_etcd_mount [ARG...]: starts etcd and a farmemd and mounts MNT with its metadata in that
# etcd (ARG...: more `farmem mount` arguments).
start_etcd_mount() {
  start_etcd
  start_farmemd
  mount_regions "$MNT" mount1 "$CLUSTER_URL" "$@"
  log "mounted (pid $MOUNT_PID), farmemd at $SERVER_ADDR, etcd at $CLUSTER_URL"
}

# mount_regions DIR NAME URL [ARG...]: `farmem mount DIR --cluster URL --server $SERVER_ADDR ARG...` in the
# background (MOUNT_PID, output in $WORK/NAME.out/.err), waited for (10 s). While the namespace
# is still claimed by an exclusive mount that was killed (its membership lease has not expired
# yet: "mounted already") it is started again, for up to 30 s; the number of refusals is left in
# REFUSALS (etcd mounts are shared: never refused).
mount_regions() {
  local dir=$1 name=$2 url=$3 deadline
  shift 3  # the rest: more `farmem mount` arguments
  mkdir -p "$dir"
  MOUNTS+=("$dir")
  REFUSALS=0
  deadline=$(($(now_ms) + 30000))
  while :; do
    "$FARMEM" mount "$dir" --cluster "$url" --server "$SERVER_ADDR" "$@" >"$WORK/$name.out" \
      2>"$WORK/$name.err" </dev/null &
    MOUNT_PID=$!
    for _ in $(seq 100); do
      grep -q '^regions: mounted at' "$WORK/$name.out" 2>/dev/null && grep -qs " $dir " /proc/mounts &&
        return 0
      kill -0 "$MOUNT_PID" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$MOUNT_PID" 2>/dev/null; then fail "$dir not mounted within 10 s"; fi
    wait "$MOUNT_PID" 2>/dev/null || true
    MOUNT_PID=""
    grep -q "mounted already" "$WORK/$name.err" || fail "farmem mount at $dir exited"
    REFUSALS=$((REFUSALS + 1))
    (($(now_ms) < deadline)) || fail "the namespace stayed claimed for 30 s"
    sleep 0.2
  done
}

# Ends the mount with SIGTERM (a clean unmount) within 20 s.
unmount_regions() {
  kill -TERM "$MOUNT_PID"
  local rc=0
  timeout 20 tail --pid="$MOUNT_PID" -f /dev/null || fail "farmem mount did not end within 20 s of SIGTERM"
  wait "$MOUNT_PID" || rc=$?
  MOUNT_PID=""
  ((rc == 0)) || fail "farmem mount exited with $rc after SIGTERM"
}

# snapshot DIR: every entry under DIR, sorted, one line each: path, type, mode, owner, size, link
# target, the region xattrs, and the sha256 of a regular file or the mtime of a directory or symlink
# (a file's mtime is the kernel's to write back with the writeback cache, so it is left out).
snapshot() {
  timeout 60 python3 - "$1" <<'PY' || fail "snapshot of $1 failed"
import hashlib, os, stat, sys
root = sys.argv[1]
for d, dirs, files in os.walk(root):
    dirs.sort()
    for name in sorted(dirs + files):
        p = os.path.join(d, name)
        st = os.lstat(p)
        line = [os.path.relpath(p, root), oct(st.st_mode), f"{st.st_uid}:{st.st_gid}", str(st.st_size)]
        if stat.S_ISLNK(st.st_mode):
            line += ["->" + os.readlink(p), str(st.st_mtime_ns)]
        else:
            line += [f"{x}={os.getxattr(p, x).decode()}" for x in sorted(os.listxattr(p))
                     if x.startswith("user.region.")]
            if stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    line.append(hashlib.sha256(f.read()).hexdigest())
            else:
                line.append(str(st.st_mtime_ns))
        print(" ".join(line))
PY
}
