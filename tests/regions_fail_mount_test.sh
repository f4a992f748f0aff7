#!/usr/bin/env bash
# Remote regions, failure of the mount daemon (docs/regions.md "Failures"): etcd and a farmemd on
# loopback, `farmem mount --cluster etcd://... --server ...`; PERSISTENT files are written, a
# helper holds two of them open (O_DIRECT, so nothing comes from the page cache), and the daemon
# is SIGKILLed. The helper's read and write on the open descriptors fail at once (no hang) with
# ENOTCONN (ECONNABORTED for a call queued while the daemon was dying), a stat with ENOTCONN;
# `fusermount3 -u -z` detaches the dead mount, a new `farmem mount` of the same namespace gets in
# at once (etcd mounts are shared: nothing of the dead mount's, whose lease still lives, keeps it
# out) and reads every file back with the same sha256 and attributes, and takes new writes. (What
# the dead mount held, its open files, goes when its lease ends: regions_etcd_test.sh.) SKIP
# without /dev/fuse or etcd. Labels: regions, integration.
# Usage: regions_fail_mount_test.sh FARMEM FARMEMD
set -euo pipefail

FARMEM="${1:?usage: $0 path/to/farmem path/to/farmemd}"
FARMEMD="${2:?usage: $0 path/to/farmem path/to/farmemd}"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/regions_fail_lib.sh"
fail_test_start regions_fail_mount etcd

start_etcd_mount

mkdir -p "$MNT/dir/sub"
head -c $((3 * 1024 * 1024 + 7)) /dev/urandom >"$WORK/big"
cp "$WORK/big" "$MNT/dir/big"
head -c 5000 /dev/urandom >"$MNT/dir/sub/small"
echo hello >"$MNT/note"
chmod 0640 "$MNT/dir/sub/small"
ln -s dir/big "$MNT/link"
python3 -c 'import os, sys; os.setxattr(sys.argv[1], "user.region.onewriter", b"1")' "$MNT/dir/sub"
[[ "$(python3 -c 'import os, sys; print(os.getxattr(sys.argv[1], "user.region.persistent").decode())' \
  "$MNT/dir/big")" == 1 ]] || fail "dir/big is not PERSISTENT"
snapshot "$MNT" >"$WORK/before"

# A process with files open across the kill: O_DIRECT, so the kernel must ask the daemon.
mkfifo "$WORK/go"
timeout 60 python3 - "$MNT" "$WORK/go" >"$WORK/holder.out" 2>&1 <<'PY' &
import errno, mmap, os, sys, time
mnt, go = sys.argv[1], sys.argv[2]
r = os.open(os.path.join(mnt, "dir/big"), os.O_RDONLY | os.O_DIRECT)
w = os.open(os.path.join(mnt, "note"), os.O_WRONLY | os.O_DIRECT)
buf = mmap.mmap(-1, 4096)
os.preadv(r, [buf], 0)
print("open", flush=True)
open(go).read()  # the daemon is dead once this returns
for what, call in (("read", lambda: os.preadv(r, [buf], 4096)),
                   ("write", lambda: os.pwritev(w, [buf], 0))):
    t0 = time.monotonic()
    try:
        call()
        print(what, "succeeded", flush=True)
    except OSError as e:
        print(what, errno.errorcode.get(e.errno, e.errno), f"{(time.monotonic() - t0) * 1000:.0f} ms",
              flush=True)
PY
HOLDER=$!
HELPER_PIDS+=("$HOLDER")
for _ in $(seq 100); do grep -q '^open' "$WORK/holder.out" && break; sleep 0.1; done
grep -q '^open' "$WORK/holder.out" || fail "the holder did not open its files: $(cat "$WORK/holder.out")"

log "SIGKILL to the mount daemon (pid $MOUNT_PID)"
kill -KILL "$MOUNT_PID"
# Waited for only after the remount: the helper's calls may reach the daemon while it is dying.
DEAD_PID=$MOUNT_PID
MOUNT_PID=""
timeout 10 bash -c 'echo go >"$1"' _ "$WORK/go" || fail "the holder did not take the go"
timeout 30 tail --pid="$HOLDER" -f /dev/null || fail "the holder hung on the dead mount"
wait "$HOLDER" || fail "the holder failed: $(cat "$WORK/holder.out")"
log "open descriptors after the kill: $(grep -v '^open' "$WORK/holder.out" | tr '\n' ';')"
# ENOTCONN once the kernel has torn the connection down; ECONNABORTED for a call it had already
# queued to the dying daemon (the kill is not waited for).
grep -qE '^read (ENOTCONN|ECONNABORTED)' "$WORK/holder.out" ||
  fail "read on an open fd: $(cat "$WORK/holder.out") (want ENOTCONN or ECONNABORTED)"
grep -qE '^write (ENOTCONN|ECONNABORTED)' "$WORK/holder.out" ||
  fail "write on an open fd: $(cat "$WORK/holder.out") (want ENOTCONN or ECONNABORTED)"
rc=0
out="$(timeout 10 stat "$MNT/dir/big" 2>&1)" || rc=$?
((rc == 1)) && [[ "$out" == *"not connected"* ]] || fail "stat on the dead mount: rc $rc: $out (want ENOTCONN)"
log "stat on the dead mount: ENOTCONN"

timeout 10 fusermount3 -u -z "$MNT" || fail "fusermount3 -u -z failed"
t0=$(now_ms)
mount_regions "$MNT" mount2 "$CLUSTER_URL"
log "remounted after $(($(now_ms) - t0)) ms ($REFUSALS refusals)"
# The dead mount's membership lease lives on for a while; a shared mount is not kept out by it.
((REFUSALS == 0)) || fail "the remount was refused $REFUSALS times while the killed mount's lease lived"
wait "$DEAD_PID" 2>/dev/null || true
snapshot "$MNT" >"$WORK/after"
diff "$WORK/before" "$WORK/after" >"$WORK/diff.out" || fail "namespace differs after the remount: $(cat "$WORK/diff.out")"
[[ "$(dd if="$MNT/dir/big" iflag=direct bs=1M status=none | sha256sum)" == "$(sha256sum <"$WORK/big")" ]] ||
  fail "dir/big differs (O_DIRECT) after the remount"
log "every file, directory, symlink and attribute intact after the remount (sha256 equal)"
head -c 300000 /dev/urandom >"$WORK/new"
cp "$WORK/new" "$MNT/dir/new"
[[ "$(dd if="$MNT/dir/new" iflag=direct bs=1M status=none | sha256sum)" == "$(sha256sum <"$WORK/new")" ]] ||
  fail "a file written after the remount reads back wrong"
unmount_regions
log "PASS"
