#!/usr/bin/env bash
# Remote regions, failure of the memory server (docs/regions.md "Failures"): two farmemds on
# loopback and `farmem mount --cluster memory://... --server A --server B --op-timeout 1500`
# (out-of-range timeouts are refused first, and `--help` shows both). A file on B (HOSTALLOC) is
# read after B was SIGSTOPped: EIO after the configured operation timeout (at least 1500 ms and
# under the default 5000 ms: a bound on which timeout applied, not on speed), no hang. Then a helper writes 1 MiB blocks of a pattern of their own with O_DIRECT (every byte
# goes to the daemon and farmemd) and reads each back, checking every byte against its model of
# the file; A is SIGKILLed under it. The helper's reads and writes must then fail with EIO, never
# hang, and never return a byte the model does not hold (also through the page cache); the mount
# itself stays up (stat, readdir, mkdir work) and unmounts cleanly on SIGTERM. Waits are bounded
# by timeout(1), with no timing assertion. FARMEM_REGIONS_FAULT=no_io_errors (failed transfers
# reported as success) makes it fail. SKIP without /dev/fuse.
# Labels: regions, integration. Usage: regions_fail_farmemd_test.sh FARMEM FARMEMD
set -euo pipefail

FARMEM="${1:?usage: $0 path/to/farmem path/to/farmemd}"
FARMEMD="${2:?usage: $0 path/to/farmem path/to/farmemd}"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/regions_fail_lib.sh"
fail_test_start regions_fail_farmemd

# Two farmemds: B, which will stop answering, holds one file (HOSTALLOC); A holds the rest.
start_farmemd
B_PID=$SERVER_PID
B_ADDR=$SERVER_ADDR
HELPER_PIDS+=("$B_PID")
start_farmemd

# The timeouts are options of the mount, shown by --help and refused out of range.
help="$("$FARMEM" mount --help 2>&1)"
[[ "$help" == *"--op-timeout"*"--meta-timeout"* ]] || fail "farmem mount --help lacks the timeouts: $help"
mkdir -p "$WORK/refused"
for bad in "--op-timeout 0" "--op-timeout 999999999" "--meta-timeout 0" "--meta-timeout 50"; do
  rc=0
  # shellcheck disable=SC2086 # word splitting of $bad intended
  out="$(timeout 30 "$FARMEM" mount "$WORK/refused" --cluster "memory://refused-$$" $bad 2>&1)" || rc=$?
  ((rc == 2)) && [[ "$out" == *"range"* ]] || fail "farmem mount $bad: rc $rc: $out (want refused, exit 2)"
  grep -qs " $WORK/refused " /proc/mounts && fail "farmem mount $bad mounted"
done
log "out-of-range timeouts refused: $(echo "$out" | tail -1)"

OP_TIMEOUT_MS=1500
mount_regions "$MNT" mount "memory://regions-fail-$$" --server "$B_ADDR" --op-timeout "$OP_TIMEOUT_MS"
log "mounted (pid $MOUNT_PID), farmemds at $SERVER_ADDR (pid $SERVER_PID) and $B_ADDR (pid $B_PID)"

# 1. B stops answering (SIGSTOP: its connections stay open, nothing is reset). An O_DIRECT read of
# its file fails with EIO after the mount's --op-timeout; timeout(1) only bounds it.
mkdir "$MNT/onb"
python3 -c 'import os, sys; os.setxattr(sys.argv[1], "user.region.hostalloc", sys.argv[2].encode())' \
  "$MNT/onb" "$B_ADDR"
head -c 300000 /dev/urandom >"$MNT/onb/f"
kill -STOP "$B_PID"
t0=$(now_ms)
rc=0
out="$(timeout 60 dd if="$MNT/onb/f" iflag=direct of=/dev/null bs=64k count=1 status=none 2>&1)" || rc=$?
took=$(($(now_ms) - t0))
((rc != 124)) || fail "a read from a farmemd that stopped answering hung for 60 s"
((rc == 1)) && [[ "$out" == *"Input/output error"* ]] ||
  fail "a read from a farmemd that stopped answering: rc $rc: $out (want EIO)"
# Which timeout applied: not before the configured one, and below the default 5000 ms (which a
# mount ignoring --op-timeout could not beat).
((took >= OP_TIMEOUT_MS - 50 && took < 5000)) ||
  fail "a read from the stopped farmemd: EIO after $took ms (want the --op-timeout $OP_TIMEOUT_MS ms, under the default 5000 ms)"
log "a read from the stopped farmemd: EIO after $took ms (--op-timeout $OP_TIMEOUT_MS)"
kill -KILL "$B_PID"
wait "$B_PID" 2>/dev/null || true

# 2. A is SIGKILLed under an IO loop.

# The IO loop: block i (1 MiB at (i % 8) MiB) holds byte (i % 251) + 1 throughout; after the
# first failure, three more calls (O_DIRECT read and write, a buffered read through a new
# descriptor) must fail too, and no read may return a byte the model does not hold.
timeout 120 python3 - "$MNT/data" >"$WORK/io.out" 2>&1 <<'PY' &
import errno, mmap, os, sys, time
path = sys.argv[1]
MiB = 1 << 20
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o644)
wbuf, rbuf = mmap.mmap(-1, MiB), mmap.mmap(-1, MiB)
model = {}  # block -> the byte it holds, or None once a failed write may have changed it

def check(block, data):
    want = model.get(block, 0)
    if want is None:  # a failed write may have left old or new bytes
        return
    bad = next((i for i, b in enumerate(data) if b != want), None)
    if bad is not None:
        print(f"GARBAGE: block {block} byte {bad} is {data[bad]}, the model says {want}", flush=True)
        sys.exit(3)

def call(what, f):
    t0 = time.monotonic()
    try:
        return f(), None
    except OSError as e:
        return None, f"{what} {errno.errorcode.get(e.errno, e.errno)} {(time.monotonic() - t0) * 1000:.0f} ms"

i, failed = 0, None
while failed is None and i < 100000:
    block, val = i % 8, i % 251 + 1
    wbuf[:] = bytes([val]) * MiB
    n, failed = call("write", lambda: os.pwritev(fd, [wbuf], block * MiB))
    if failed:
        model[block] = None
        break
    model[block] = val
    n, failed = call("read", lambda: os.preadv(fd, [rbuf], block * MiB))
    if failed:
        break
    check(block, rbuf[:n])
    i += 1
    if i == 16:
        print("looping", flush=True)
print("first failure after", i, "blocks:", failed, flush=True)
_, e1 = call("read", lambda: os.preadv(fd, [rbuf], 0))
_, e2 = call("write", lambda: os.pwritev(fd, [wbuf], 0))
print("then:", e1, ";", e2, flush=True)
with open(path, "rb") as f:  # buffered: what the page cache holds may come back, nothing else
    for block in range(8):
        n, e3 = call("buffered read", lambda: f.readinto(memoryview(rbuf)))
        if e3:
            print("then:", e3, flush=True)
            break
        check(block, rbuf[:n])
        print("buffered block", block, "read", n, "bytes, all as written", flush=True)
PY
IO=$!
HELPER_PIDS+=("$IO")
for _ in $(seq 200); do
  grep -q '^looping' "$WORK/io.out" && break
  kill -0 "$IO" 2>/dev/null || break
  sleep 0.1
done
grep -q '^looping' "$WORK/io.out" || fail "the IO loop did not start: $(cat "$WORK/io.out")"

log "SIGKILL to farmemd (pid $SERVER_PID) under the IO loop"
kill -KILL "$SERVER_PID"
wait "$SERVER_PID" 2>/dev/null || true
SERVER_PID=""
rc=0
wait "$IO" || rc=$?
((rc != 124)) || fail "the IO loop hung (no answer within 120 s): $(cat "$WORK/io.out")"
sed "s/^/$TEST_NAME:   /" "$WORK/io.out"
if grep -q 'GARBAGE' "$WORK/io.out"; then fail "a read returned bytes that were not written"; fi
((rc == 0)) || fail "the IO loop failed ($rc): $(cat "$WORK/io.out")"
grep -q '^first failure after .*: \(write\|read\) EIO' "$WORK/io.out" ||
  fail "the first failing call did not get EIO: $(cat "$WORK/io.out")"
grep -q '^then: read EIO .* ; write EIO' "$WORK/io.out" ||
  fail "later O_DIRECT calls did not get EIO: $(cat "$WORK/io.out")"
if grep -q '^then: buffered' "$WORK/io.out"; then
  grep -q '^then: buffered read EIO' "$WORK/io.out" || fail "a buffered read failed, but not with EIO"
fi

# The mount is still there: metadata is served from the daemon, new data cannot be placed.
timeout 30 stat "$MNT/data" >/dev/null || fail "stat failed after farmemd died"
timeout 30 ls "$MNT" >/dev/null || fail "readdir failed after farmemd died"
timeout 30 mkdir "$MNT/still" || fail "mkdir failed after farmemd died"
rc=0
out="$(timeout 30 dd if=/dev/zero of="$MNT/new" bs=64k count=1 oflag=direct status=none 2>&1)" || rc=$?
((rc == 1)) && [[ "$out" == *"Input/output error"* ]] ||
  fail "a write needing a new chunk: rc $rc: $out (want EIO)"
log "the mount stays up: stat, readdir and mkdir work, a new write gets EIO"
unmount_regions
log "PASS"
