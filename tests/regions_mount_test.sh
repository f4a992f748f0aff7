#!/usr/bin/env bash
# Remote regions over FUSE (docs/regions.md "Tests"): `farmem mount` with no flags (embedded
# farmemd, memory:// metadata, a 40 MiB budget), then Unix tools against it, compared with tmpfs:
# random data + sha256 (also read back with O_DIRECT, past the page cache), cp -a + diff -r of the
# repo's src/common, truncate shrink/grow (holes read zero), mv over an existing file, cp over a
# larger one (O_DIRECT read back), chmod/chown/
# utimens and permissions (nobody vs a 0600 file), mkdir/rmdir/readdir, symlink, ONEWRITER (second
# writer EBUSY), ENOSPC with the rest intact and the space reusable after rm, df from the budget,
# fallocate (-l, -n, -p, -z) against tmpfs, the root-only .regions/ reports and `farmem regions
# stat`, OWNERPID/PERSISTENT (a region dies with its creating process unless PERSISTENT), HOSTALLOC,
# clean unmount on SIGTERM and by fusermount3 -u.
# FARMEM_REGIONS_FAULT=no_tail|no_onewriter|no_perms|no_prealloc|no_punch_zero|no_zero_range|no_rollback (passed
# to the daemon) makes a check fail; so do open_intro (.regions/ readable by everyone) and no_reap|
# no_revoke|reap_persistent (OWNERPID).
# SKIP only without /dev/fuse. Labels: regions, integration. Usage: regions_mount_test.sh FARMEM
set -euo pipefail

FARMEM="${1:?usage: $0 path/to/farmem}"
SRC_TREE="$(cd "$(dirname "${BASH_SOURCE[0]}")/../src/common" && pwd)"
WORK="$(mktemp -d -t farmem-regions.XXXXXX)"
MNT="$WORK/mnt"
REF="$(mktemp -d -p /dev/shm farmem-regions-ref.XXXXXX 2>/dev/null || mktemp -d -p "$WORK")"
PID=""

TEST_NAME=regions_mount
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cleanup() {
  local rc=$?
  if grep -qs " $MNT " /proc/mounts; then fusermount3 -uz "$MNT" 2>/dev/null || true; fi
  stop_process "$PID"
  rm -rf "$WORK" "$REF"
  exit "$rc"
}
trap cleanup EXIT

if [[ ! -c /dev/fuse ]]; then
  echo "SKIP: /dev/fuse is missing (no FUSE in this kernel or container)"
  exit 0
fi
command -v fusermount3 >/dev/null || fail "fusermount3 not found (apt install fuse3)"
[[ -n "${FARMEM_REGIONS_FAULT:-}" ]] && log "fault: FARMEM_REGIONS_FAULT=$FARMEM_REGIONS_FAULT"

mount_regions() {
  mkdir -p "$MNT"
  "$FARMEM" mount "$MNT" --memory-mib 40 >"$WORK/mount.out" 2>"$WORK/mount.err" &
  PID=$!
  wait_mounted "$WORK/mount.out" "$MNT" "$PID"
}

# Reads a file with O_DIRECT (every byte from the daemon, none from the page cache).
direct_sum() { dd if="$1" iflag=direct bs=1M status=none | sha256sum | cut -d' ' -f1; }
sum() { sha256sum "$1" | cut -d' ' -f1; }

mount_regions
log "mounted (pid $PID)"

# 1. Random data, sha256 against the tmpfs copy.
head -c $((6 * 1024 * 1024 + 12345)) /dev/urandom >"$REF/random"
cp "$REF/random" "$MNT/random"
[[ "$(sum "$MNT/random")" == "$(sum "$REF/random")" ]] || fail "random data differs (cached read)"
[[ "$(direct_sum "$MNT/random")" == "$(sum "$REF/random")" ]] || fail "random data differs (O_DIRECT)"
log "random 6 MiB: sha256 equal (cached and O_DIRECT)"

# 2. A source tree: cp -a, diff -r (contents, names, modes via cp -a).
cp -a "$SRC_TREE" "$MNT/tree"
diff -r "$SRC_TREE" "$MNT/tree" >"$WORK/diff.err" 2>&1 || fail "diff -r of src/common differs"
[[ "$(find "$MNT/tree" | wc -l)" == "$(find "$SRC_TREE" | wc -l)" ]] || fail "tree entry count"
log "cp -a + diff -r of src/common: equal ($(find "$SRC_TREE" -type f | wc -l) files)"

# 3. truncate shrink then grow: the cut bytes must come back as zeros (holes).
for d in "$REF" "$MNT"; do
  head -c 300000 /dev/zero | tr '\0' '\377' >"$d/trunc"
  truncate -s 150001 "$d/trunc"
  truncate -s 400000 "$d/trunc"
done
[[ "$(direct_sum "$MNT/trunc")" == "$(sum "$REF/trunc")" ]] || fail "truncate shrink/grow: bytes past the shrink are not zero"
[[ "$(stat -c %s "$MNT/trunc")" == 400000 ]] || fail "truncate size"
truncate -s 5G "$MNT/sparse"
[[ "$(stat -c %s "$MNT/sparse")" == 5368709120 && "$(stat -c %b "$MNT/sparse")" == 0 ]] || fail "sparse 5 GiB file"
[[ "$(dd if="$MNT/sparse" bs=1M skip=4000 count=4 status=none | tr -d '\0' | wc -c)" == 0 ]] || fail "hole not zero"
log "truncate shrink/grow equal to tmpfs; 5 GiB sparse file reads zero, 0 blocks"

# 4. mv over an existing file.
echo first >"$MNT/x"
echo second >"$MNT/y"
mv "$MNT/x" "$MNT/y"
[[ "$(cat "$MNT/y")" == first && ! -e "$MNT/x" ]] || fail "mv over an existing file"
# And cp of a small file over a large one (open with O_TRUNC, which the kernel leaves to the
# daemon: FUSE_CAP_ATOMIC_O_TRUNC): the store holds the small file, read past the page cache.
head -c 2500000 /dev/urandom >"$MNT/over"
head -c 70000 /dev/urandom >"$WORK/small"
cp "$WORK/small" "$MNT/over"
[[ "$(dd if="$MNT/over" iflag=direct bs=1M status=none | sha256sum)" == "$(sha256sum <"$WORK/small")" ]] ||
  fail "cp over a larger file: the store kept the old size or bytes ($(grep 'path=/over ' "$MNT/.regions/files" | grep -o 'size=[0-9]*'))"
log "mv over an existing file, cp over a larger one: ok"

# 5. Directories, readdir, symlinks, hard links refused.
mkdir -p "$MNT/d/e/f"
touch "$MNT/d/e/one" "$MNT/d/e/two"
[[ "$(ls "$MNT/d/e" | tr '\n' ' ')" == "f one two " ]] || fail "readdir: $(ls "$MNT/d/e")"
rmdir "$MNT/d/e" 2>/dev/null && fail "rmdir of a non-empty directory succeeded"
rm "$MNT/d/e/one" "$MNT/d/e/two"
rmdir "$MNT/d/e/f" "$MNT/d/e" "$MNT/d" || fail "rmdir"
[[ ! -e "$MNT/d" ]] || fail "directory still there after rmdir"
ln -s random "$MNT/link"
[[ "$(readlink "$MNT/link")" == random && "$(sum "$MNT/link")" == "$(sum "$REF/random")" ]] || fail "symlink"
ln "$MNT/random" "$MNT/hard" 2>/dev/null && fail "hard link succeeded"
log "mkdir/rmdir/readdir, symlink, hard link refused: ok"

# 5b. chmod, chown, utimens (as on tmpfs), and the kernel's permission checks on our modes.
for d in "$REF" "$MNT"; do
  echo secret >"$d/perm"
  chmod 0640 "$d/perm"
  chown 1234:5678 "$d/perm"
  touch -d "2001-02-03 04:05:06.789" "$d/perm"
done
[[ "$(stat -c '%a %u %g %Y %y' "$MNT/perm")" == "$(stat -c '%a %u %g %Y %y' "$REF/perm")" ]] ||
  fail "chmod/chown/touch -d: $(stat -c '%a %u %g %y' "$MNT/perm") vs $(stat -c '%a %u %g %y' "$REF/perm")"
echo top >"$MNT/private"
chmod 0600 "$MNT/private"
if command -v runuser >/dev/null && id nobody >/dev/null 2>&1; then
  chmod 0755 "$WORK"  # mktemp made it 0700: nobody must reach the mount point
  runuser -u nobody -- cat "$MNT/private" >/dev/null 2>&1 && fail "nobody read a 0600 root file"
  runuser -u nobody -- cat "$MNT/random" >/dev/null 2>&1 || fail "nobody cannot read a 0644 file"
  log "chmod/chown/touch -d as on tmpfs; nobody: EACCES on 0600, reads 0644"
else
  log "chmod/chown/touch -d as on tmpfs (no runuser/nobody: permission check not run)"
fi

# 6. ONEWRITER inherited from the directory: the second writer gets EBUSY.
mkdir "$MNT/solo"
python3 - "$MNT/solo" >"$WORK/onewriter.out" 2>&1 <<'PY' || fail "ONEWRITER: $(cat "$WORK/onewriter.out")"
import errno, os, sys
d = sys.argv[1]
os.setxattr(d, "user.region.onewriter", b"1")
f = os.path.join(d, "f")
a = os.open(f, os.O_CREAT | os.O_WRONLY, 0o644)
assert os.getxattr(f, "user.region.onewriter") == b"1", "not inherited"
try:
    os.open(f, os.O_WRONLY)
    sys.exit("second writer was let in")
except OSError as e:
    assert e.errno == errno.EBUSY, e
os.close(os.open(f, os.O_RDONLY))  # readers are fine
os.close(a)
# And a writer again once the first is gone. The kernel sends FUSE's RELEASE after close() has
# returned, so the daemon may still count the first writer for a moment: retry EBUSY (5 s bound).
import time
deadline = time.monotonic() + 5
while True:
    try:
        os.close(os.open(f, os.O_WRONLY))
        break
    except OSError as e:
        if e.errno != errno.EBUSY or time.monotonic() > deadline:
            raise
        time.sleep(0.01)
PY
log "ONEWRITER: second writer EBUSY, reader ok"

# 7. statfs from the budget; ENOSPC with the rest intact; space reusable after rm.
[[ "$(stat -f -c '%b %S' "$MNT")" == "10240 4096" ]] || fail "statfs: $(stat -f -c '%b %S' "$MNT") (want 40 MiB)"
if dd if=/dev/zero of="$MNT/big" bs=1M count=64 conv=fsync status=none 2>"$WORK/dd.err"; then
  fail "64 MiB fit into a 40 MiB budget"
fi
grep -q "No space left" "$WORK/dd.err" || fail "dd did not fail with ENOSPC: $(cat "$WORK/dd.err")"
[[ "$(direct_sum "$MNT/random")" == "$(sum "$REF/random")" ]] || fail "random data damaged by ENOSPC"
diff -r "$SRC_TREE" "$MNT/tree" >/dev/null || fail "tree damaged by ENOSPC"
rm "$MNT/big"
# The chunks come back once the daemon gets the file's RELEASE, which the kernel sends after dd's
# close() returned: wait (5 s bound) until statfs shows room for 16 MiB, then write it.
for _ in $(seq 50); do
  read -r avail bsize < <(stat -f -c '%a %S' "$MNT")
  ((avail * bsize >= 17 << 20)) && break
  sleep 0.1
done
dd if=/dev/zero of="$MNT/again" bs=1M count=16 conv=fsync status=none || fail "space not reusable after rm"
log "ENOSPC at 40 MiB, the rest intact, 16 MiB fit again after rm"

# 8. fallocate against tmpfs: mode 0 (size + blocks), KEEP_SIZE past the end, PUNCH_HOLE of whole
# 128 KiB chunks (blocks drop) and of a partial range (zeroed), other modes EOPNOTSUPP, ENOSPC
# changing nothing, and preallocated space still writable when the budget is exhausted.
rm "$MNT/again"
for d in "$REF" "$MNT"; do
  fallocate -l 1M "$d/fa"
  fallocate -n -o 1M -l 512K "$d/fa"
done
[[ "$(stat -c '%s %b' "$MNT/fa")" == "$(stat -c '%s %b' "$REF/fa")" ]] ||
  fail "fallocate -l / -n: size+blocks $(stat -c '%s %b' "$MNT/fa") vs tmpfs $(stat -c '%s %b' "$REF/fa")"
for d in "$REF" "$MNT"; do
  head -c $((1024 * 1024)) /dev/zero | tr '\0' '\252' | dd of="$d/fa" conv=notrunc status=none
  fallocate -p -o 128K -l 256K "$d/fa"
  fallocate -p -o 600000 -l 1000 "$d/fa"
done
[[ "$(direct_sum "$MNT/fa")" == "$(sum "$REF/fa")" ]] || fail "fallocate -p: contents differ from tmpfs"
[[ "$(stat -c '%s %b' "$MNT/fa")" == "$(stat -c '%s %b' "$REF/fa")" ]] ||
  fail "fallocate -p: size+blocks $(stat -c '%s %b' "$MNT/fa") vs tmpfs $(stat -c '%s %b' "$REF/fa")"
# ZERO_RANGE (tmpfs has none: the reference gets the zeros written with dd, and fallocate -n / -l
# for the parts past the end) over data just written (still in the page cache), over what was the
# punched hole and past the end, with and without KEEP_SIZE: contents and size as on tmpfs.
zeros_at() { head -c "$2" /dev/zero | dd of="$1" bs="$2" seek="$3" oflag=seek_bytes conv=notrunc status=none; }
head -c 300000 /dev/urandom >"$WORK/zr.src"
for d in "$REF" "$MNT"; do
  dd if="$WORK/zr.src" of="$d/fa" bs=300000 seek=300000 oflag=seek_bytes conv=notrunc status=none
done
fallocate -z -o 200000 -l 300000 "$MNT/fa"
fallocate -z -n -o 1000000 -l 300000 "$MNT/fa"
fallocate -z -o 1200000 -l 100000 "$MNT/fa"
zeros_at "$REF/fa" 300000 200000
zeros_at "$REF/fa" $((1048576 - 1000000)) 1000000
fallocate -n -o 1000000 -l 300000 "$REF/fa"
fallocate -o 1200000 -l 100000 "$REF/fa"
[[ "$(direct_sum "$MNT/fa")" == "$(sum "$REF/fa")" ]] || fail "fallocate -z: contents differ from tmpfs"
[[ "$(sum "$MNT/fa")" == "$(sum "$REF/fa")" ]] || fail "fallocate -z: cached contents differ from tmpfs"
[[ "$(stat -c %s "$MNT/fa")" == 1300000 ]] || fail "fallocate -z: size $(stat -c %s "$MNT/fa"), not 1300000"
fallocate -c -o 0 -l 128K "$MNT/fa" 2>"$WORK/fz.err" && fail "fallocate COLLAPSE_RANGE succeeded"
grep -q "Operation not supported" "$WORK/fz.err" || fail "COLLAPSE_RANGE: $(cat "$WORK/fz.err")"
free_before="$(stat -f -c %f "$MNT")"
fallocate -l 64M "$MNT/fhuge" 2>"$WORK/fh.err" && fail "fallocate of 64 MiB fit into 40 MiB"
grep -q "No space left" "$WORK/fh.err" || fail "fallocate 64 MiB: $(cat "$WORK/fh.err")"
[[ "$(stat -c '%s %b' "$MNT/fhuge")" == "0 0" ]] || fail "failed fallocate left $(stat -c '%s %b' "$MNT/fhuge")"
# (Free blocks may only have grown: a RELEASE of fa, whose punched chunk it frees, can still come.)
(($(stat -f -c %f "$MNT") >= free_before)) || fail "failed fallocate kept blocks: $(stat -f -c %f "$MNT") < $free_before"
fallocate -l 2M "$MNT/fpre"
dd if=/dev/zero of="$MNT/ffill" bs=1M count=64 conv=fsync status=none 2>/dev/null && fail "64 MiB fit"
head -c $((2 * 1024 * 1024)) /dev/urandom >"$REF/fpre"
dd if="$REF/fpre" of="$MNT/fpre" bs=1M conv=notrunc,fsync status=none 2>"$WORK/fpre.err" ||
  fail "a write into preallocated space failed with the budget exhausted: $(cat "$WORK/fpre.err")"
[[ "$(direct_sum "$MNT/fpre")" == "$(sum "$REF/fpre")" ]] || fail "preallocated file content"
rm "$MNT/ffill" "$MNT/fhuge"
log "fallocate -l/-n/-p: size, blocks and bytes as on tmpfs; -z EOPNOTSUPP; ENOSPC changed nothing; preallocated space writable when full"

# 9. .regions/ introspection: root reads the reports (and `farmem regions stat` prints them);
# nobody gets EACCES; nothing in it can be written, created or removed.
mkdir "$MNT/intro"
printf abc >"$MNT/intro/one file"
exec 3<"$MNT/intro/one file"  # an open region for the "open" report
grep -Eq "^path=/intro/one%20file ino=[0-9]+ size=3 chunks=1 .* map=0:[0-9]+\.[0-9]+$" "$MNT/.regions/files" ||
  fail ".regions/files: $(cat "$MNT/.regions/files")"
grep -Eq "^ino=[0-9]+ path=/intro/one%20file opens=1 writers=0 mounts=1$" "$MNT/.regions/open" ||
  fail ".regions/open: $(cat "$MNT/.regions/open")"
exec 3<&-
grep -q "^pid=$PID uid=0 mountpoint=$MNT " "$MNT/.regions/daemon" || fail ".regions/daemon: $(cat "$MNT/.regions/daemon")"
grep -q "^server=0 address=127.0.0.1:[0-9]* units=[1-9]" "$MNT/.regions/hosts" || fail ".regions/hosts: $(cat "$MNT/.regions/hosts")"
grep -q "^budget_bytes=41943040 free_bytes=[0-9]* used_bytes=[1-9]" "$MNT/.regions/memusage" || fail ".regions/memusage"
grep -q "^gid=[0-9]* server=0 address=127.0.0.1:[0-9]* key=" "$MNT/.regions/pools" || fail ".regions/pools"
"$FARMEM" regions stat --mount "$MNT" >"$WORK/rstat.out" || fail "farmem regions stat failed"
grep -q "^== files ==" "$WORK/rstat.out" && grep -q "^path=/intro/one%20file " "$WORK/rstat.out" ||
  fail "farmem regions stat: $(cat "$WORK/rstat.out")"
(echo x >"$MNT/.regions/files") 2>/dev/null && fail "root wrote .regions/files"
touch "$MNT/.regions/new" 2>/dev/null && fail "created a file in .regions/"
rm -f "$MNT/.regions/files" 2>/dev/null && fail "removed .regions/files"
mkdir "$MNT/.regions" 2>/dev/null && fail "mkdir .regions over the introspection directory"
if command -v runuser >/dev/null && id nobody >/dev/null 2>&1; then
  runuser -u nobody -- cat "$MNT/.regions/files" >/dev/null 2>&1 && fail "nobody read .regions/files"
  runuser -u nobody -- ls "$MNT/.regions" >/dev/null 2>&1 && fail "nobody listed .regions/"
  runuser -u nobody -- "$FARMEM" regions stat --mount "$MNT" >/dev/null 2>"$WORK/rstat.err" &&
    fail "nobody ran farmem regions stat"
  grep -q "Permission denied (.regions/ is root-only)" "$WORK/rstat.err" || fail "regions stat as nobody: $(cat "$WORK/rstat.err")"
  log ".regions/: reports as documented, read-only, nobody gets EACCES (cat, ls, farmem regions stat)"
else
  log ".regions/: reports as documented, read-only (no runuser/nobody: EACCES not checked)"
fi

# 10. OWNERPID/PERSISTENT: the root (and so every directory) defaults to PERSISTENT; in a directory
# with user.region.persistent=0 a region dies with the process that created it: its name goes, a
# reader that still has it open gets EIO, its chunks are free once that reader closes. A PERSISTENT
# region made by the same process stays.
mkdir "$MNT/eph" "$MNT/keep"
python3 - "$MNT" >"$WORK/owner.out" 2>&1 <<'PY' || fail "OWNERPID: $(cat "$WORK/owner.out")"
import errno, os, subprocess, sys, time
mnt = sys.argv[1]
eph, keep = os.path.join(mnt, "eph"), os.path.join(mnt, "keep")
assert os.getxattr(keep, "user.region.persistent") == b"1", "the default is not PERSISTENT"
os.setxattr(eph, "user.region.persistent", b"0")
# The owner: creates one region in each directory, says so, exits when its stdin closes.
owner = subprocess.Popen([sys.executable, "-c", """
import sys
for d in sys.argv[1:]:
    with open(d + "/f", "wb") as f:
        f.write(b"owned" * 1000)
print("made", flush=True)
sys.stdin.read()
""", eph, keep], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
assert owner.stdout.readline() == b"made\n", "owner did not create its regions"
doomed = os.path.join(eph, "f")
assert os.getxattr(doomed, "user.region.ownerpid") == str(owner.pid).encode(), "ownerpid"
fd = os.open(doomed, os.O_RDONLY)  # another opener
assert os.pread(fd, 5, 0) == b"owned"
def report(name):
    with open(os.path.join(mnt, ".regions", name)) as f:
        return f.read()
line = [l for l in report("files").splitlines() if l.startswith("path=/eph/f ")]
assert len(line) == 1 and " persistent=0 " in line[0], report("files")
chunks = [c.split(":")[1] for c in line[0].split("map=")[1].split(",")]  # gid.index
owner.stdin.close()
owner.wait()
deadline = time.monotonic() + 10
while os.path.exists(doomed):
    if time.monotonic() > deadline:
        sys.exit("non-persistent region still there 10 s after its owner exited")
    time.sleep(0.05)
try:
    os.pread(fd, 5, 0)
    sys.exit("a reader of a region whose owner exited read it (want EIO)")
except OSError as e:
    assert e.errno == errno.EIO, e
os.close(fd)
with open(os.path.join(keep, "f"), "rb") as f:
    assert f.read() == b"owned" * 1000, "persistent region damaged"
# Its chunks are free once the reader's RELEASE arrived (after close() returned: 10 s bound).
def in_use():
    used = {}
    for l in report("pools").splitlines():
        kv = dict(x.split("=", 1) for x in l.split())
        used[kv["gid"]] = int(kv["used_bitmap"], 16)
    return [c for c in chunks if used.get(c.split(".")[0], 0) >> int(c.split(".")[1]) & 1]
deadline = time.monotonic() + 10
while in_use():
    if time.monotonic() > deadline:
        sys.exit("chunks of the deleted region still in use: %s" % in_use())
    time.sleep(0.05)
PY
[[ -f "$MNT/keep/f" ]] || fail "PERSISTENT region gone with its owner"
log "OWNERPID: a non-persistent region died with its owner (name gone, reader EIO, chunks freed); the PERSISTENT one stayed"

# 11. HOSTALLOC: a directory limited to the (one) memory server of this mount passes the list on;
# a server the mount does not have is EINVAL. (Placement over several servers: the engine tests.)
server="$(sed -n 's/^server=0 address=\([^ ]*\) .*/\1/p' "$MNT/.regions/hosts")"
mkdir "$MNT/placed"
python3 - "$MNT/placed" "$server" >"$WORK/hostalloc.out" 2>&1 <<'PY' || fail "HOSTALLOC: $(cat "$WORK/hostalloc.out")"
import errno, os, sys
d, server = sys.argv[1], sys.argv[2].encode()
assert os.getxattr(d, "user.region.hostalloc") == b"", "default is not all servers"
try:
    os.setxattr(d, "user.region.hostalloc", b"192.0.2.1:9")
    sys.exit("a server the mount does not have was accepted")
except OSError as e:
    assert e.errno == errno.EINVAL, e
os.setxattr(d, "user.region.hostalloc", server)
with open(os.path.join(d, "f"), "wb") as f:
    f.write(b"x" * 200000)
assert os.getxattr(os.path.join(d, "f"), "user.region.hostalloc") == server, "not inherited"
PY
grep -q "^path=/placed/f .* hostalloc=$server vaddr=- map=" "$MNT/.regions/files" || fail ".regions/files: no hostalloc=$server for /placed/f"
log "HOSTALLOC: set to the mount's server, inherited, shown in .regions/files; an unknown server EINVAL"

# 12. Clean unmount on SIGTERM, then a second mount unmounted by fusermount3 -u.
kill -TERM "$PID"
for _ in $(seq 100); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
kill -0 "$PID" 2>/dev/null && fail "farmem mount still running 10 s after SIGTERM"
wait "$PID" || fail "farmem mount exited with $? after SIGTERM"
grep -qs " $MNT " /proc/mounts && fail "still mounted after SIGTERM"
mount_regions
echo hi >"$MNT/f"
fusermount3 -u "$MNT" || fail "fusermount3 -u"
for _ in $(seq 100); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
wait "$PID" || fail "farmem mount exited with $? after fusermount3 -u"
grep -q '^regions: unmounted' "$WORK/mount.out" || fail "no unmount line"
log "SIGTERM and fusermount3 -u: clean unmounts"
log "PASS"
