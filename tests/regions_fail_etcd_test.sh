#!/usr/bin/env bash
# Remote regions, etcd stopped and restarted under a mount (docs/regions.md "Failures"): etcd and a
# farmemd on loopback, `farmem mount --cluster etcd://... --server ...` with a namespace of
# directories, files (sha256), a symlink, modes and region xattrs, and a file that was unlinked
# while a helper holds it open. etcd is SIGKILLed. During the outage reads of the namespace work
# (served by the daemon's mirror); opening a file fails with EIO (the open cannot be recorded, and
# other mounts could free its chunks once etcd is back: docs/regions.md "Several mounts"), and so
# does every change, none hangs (timeout(1)); the helper closes the unlinked file then (its record
# can only be removed later). Once etcd is back a file opened then reads its bytes again.
# etcd is restarted on the same data dir: the live namespace equals the one before the outage and
# takes changes again; after an unmount a new mount opens the namespace (the unlinked file's
# leftover record must not keep it from opening) and it is again the one before the outage.
# FARMEM_REGIONS_FAULT=no_meta_rollback (failed changes kept in memory) makes it fail ("the live
# namespace changed"), keep_orphans ("farmem mount ... exited": the remount refuses the unlinked
# file's leftover record). SKIP without /dev/fuse or etcd. Labels: regions, integration.
# Usage: regions_fail_etcd_test.sh FARMEM FARMEMD
set -euo pipefail

FARMEM="${1:?usage: $0 path/to/farmem path/to/farmemd}"
FARMEMD="${2:?usage: $0 path/to/farmem path/to/farmemd}"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/regions_fail_lib.sh"
fail_test_start regions_fail_etcd etcd
LOG_GLOBS="$WORK/etcd.log"

META_TIMEOUT_MS=1500
start_etcd_mount --meta-timeout "$META_TIMEOUT_MS"

mkdir -p "$MNT/d/e" "$MNT/multi"
python3 -c 'import os, sys; os.setxattr(sys.argv[1], "user.region.multihosted", b"1")' "$MNT/multi"
head -c 300000 /dev/urandom >"$MNT/d/f"
chmod 0600 "$MNT/d/f"
echo hello >"$MNT/d/e/g"
python3 -c 'import os, sys; os.setxattr(sys.argv[1], "user.region.onewriter", b"1")' "$MNT/d/e/g"
head -c 300005 /dev/urandom >"$MNT/multi/m"
ln -s d/f "$MNT/s"
chown 1234:5678 "$MNT/d/e"
# A file unlinked while a helper holds it open: its memory and record go at the last close.
head -c 200000 /dev/urandom >"$MNT/gone"
mkfifo "$WORK/go"
timeout 60 python3 - "$MNT/gone" "$WORK/go" >"$WORK/holder.out" 2>&1 <<'PY' &
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
print("open", flush=True)
open(sys.argv[2]).read()
os.close(fd)
print("closed", flush=True)
PY
HOLDER=$!
HELPER_PIDS+=("$HOLDER")
for _ in $(seq 100); do grep -q '^open' "$WORK/holder.out" && break; sleep 0.1; done
grep -q '^open' "$WORK/holder.out" || fail "the holder did not open gone: $(cat "$WORK/holder.out")"
rm "$MNT/gone"
snapshot "$MNT" >"$WORK/before"

# etcd that stops answering (SIGSTOP: connections stay open): a create waits for the mount's
# --meta-timeout, then fails with EIO; timeout(1) only bounds it, and the time is checked against
# the configured timeout and the default 2000 ms (which timeout applied, not speed). (Its inode record may still
# be written when etcd resumes: a record no name leads to, which the remount below drops.) A stat of
# the new name first: its lookup asks etcd too (a name another mount may just have made) and waits
# for the timeout; after that the mount knows etcd is away and answers lookups from memory, so the
# create's own time is measured.
kill -STOP "$ETCD_PID"
timeout 60 stat "$MNT/d/during_stop" >/dev/null 2>&1 || true
t0=$(now_ms)
rc=0
out="$(timeout 60 touch "$MNT/d/during_stop" 2>&1)" || rc=$?
took=$(($(now_ms) - t0))
kill -CONT "$ETCD_PID"
((rc != 124)) || fail "a create hung for 60 s while etcd was stopped"
((rc == 1)) && [[ "$out" == *"Input/output error"* ]] ||
  fail "a create while etcd was stopped: rc $rc: $out (want EIO)"
((took >= META_TIMEOUT_MS - 50 && took < 2000)) ||
  fail "a create while etcd was stopped: EIO after $took ms (want the --meta-timeout $META_TIMEOUT_MS ms, under the default 2000 ms)"
log "a create while etcd does not answer: EIO after $took ms (--meta-timeout $META_TIMEOUT_MS)"

log "SIGKILL to etcd (pid $ETCD_PID)"
kill -KILL "$ETCD_PID"
wait "$ETCD_PID" 2>/dev/null || true
ETCD_PID=""

# try WHAT WANT CMD...: runs CMD under timeout 30; WANT is ok or EIO (the message must say
# "Input/output error"); logs the time it took.
try() {
  local what=$1 want=$2 t0 rc=0 out
  shift 2
  t0=$(now_ms)
  out="$(timeout 30 "$@" 2>&1)" || rc=$?
  ((rc != 124)) || fail "$what hung during the outage"
  if [[ "$want" == ok ]]; then
    ((rc == 0)) || fail "$what failed during the outage: $out"
  else
    ((rc != 0)) || fail "$what succeeded during the outage (want EIO)"
    [[ "$out" == *"Input/output error"* ]] || fail "$what during the outage: $out (want EIO)"
  fi
  log "  outage: $what: ${want} in $(($(now_ms) - t0)) ms"
}
try "stat" ok stat "$MNT/d/f"
try "ls -R" ok ls -R "$MNT"
try "open+read d/f" EIO dd if="$MNT/d/f" iflag=direct of=/dev/null bs=64k status=none
try "create" EIO touch "$MNT/d/new"
try "mkdir" EIO mkdir "$MNT/newdir"
try "rm" EIO rm "$MNT/d/e/g"
try "mv" EIO mv "$MNT/d/f" "$MNT/d/f2"
try "chmod" EIO chmod 0644 "$MNT/d/f"
try "chown" EIO chown 42 "$MNT/d/f"
try "truncate" EIO truncate -s 1000 "$MNT/d/f"
try "write past the end" EIO dd if=/dev/zero of="$MNT/d/f" bs=4k count=1 seek=100 oflag=direct \
  conv=notrunc status=none
try "setxattr" EIO python3 -c 'import os, sys; os.setxattr(sys.argv[1], "user.region.onewriter", b"1")' "$MNT/d/f"
timeout 10 bash -c 'echo go >"$1"' _ "$WORK/go" || fail "the holder did not take the go"
timeout 30 tail --pid="$HOLDER" -f /dev/null || fail "the holder hung closing gone"
wait "$HOLDER" || fail "the holder failed: $(cat "$WORK/holder.out")"
sleep 0.5  # RELEASE is asynchronous: let the daemon handle it while etcd is still down
log "  outage: the unlinked file was closed"

log "restarting etcd on the same data dir"
start_etcd
# The mount's etcd client reconnects by itself: a change goes through within 10 s.
ok=0
for _ in $(seq 100); do
  if timeout 10 mkdir "$MNT/probe" 2>/dev/null; then ok=1; break; fi
  sleep 0.1
done
((ok)) || fail "no change went through within 10 s of etcd's return"
rmdir "$MNT/probe" || fail "rmdir after etcd's return"
snapshot "$MNT" >"$WORK/live"
diff "$WORK/before" "$WORK/live" >"$WORK/diff.out" || fail "the live namespace changed: $(cat "$WORK/diff.out")"
log "after etcd's return the live namespace is the one before the outage and takes changes"

unmount_regions
mount_regions "$MNT" mount2 "$CLUSTER_URL"
snapshot "$MNT" >"$WORK/after"
diff "$WORK/before" "$WORK/after" >"$WORK/diff.out" || fail "the namespace differs after a remount: $(cat "$WORK/diff.out")"
log "a new mount finds the same namespace (files, dirs, modes, owners, xattrs, sha256)"
unmount_regions
log "PASS"
