# Shell helpers of the remote-regions two-mount tests (tests/regions_etcd_test.sh on one host,
# tests/regions_netns_test.sh across network namespaces; sourced after lib.sh, not run): the checks
# every pair of mounts A and B of one namespace must pass (docs/regions.md "Several mounts"), each
# a function on the mount points, and a kill/stop check with a third mount C. Callers set WORK,
# MNT_A, MNT_B (and MNT_C, PID_B, PID_C for multi_kill_and_fence) and run under `set -euo
# pipefail`; every wait is bounded.

# The python helpers the checks run as processes of their own (reading and writing through a
# mount, holding files open).
multi_helpers() {
  cat >"$WORK/multi.py" <<'PY'
import mmap, os, sys, time
cmd = sys.argv[1]

def wait_file(path, secs=60):
    for _ in range(int(secs * 20)):
        if os.path.exists(path):
            return
        time.sleep(0.05)
    sys.exit(f"{cmd}: {path} did not appear within {secs} s")

def direct_read(fd, n):
    # O_DIRECT wants aligned buffers: an anonymous mapping is page-aligned.
    buf = mmap.mmap(-1, (n + 4095) // 4096 * 4096)
    got = os.preadv(fd, [buf], 0)
    return bytes(buf[:min(got, n)])

if cmd == "slices":  # PATH PARITY N SIZE GO: every other slice, tagged with its index + 1
    path, parity, n, size, go = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
    wait_file(go)
    fd = os.open(path, os.O_WRONLY)
    for i in range(parity, n, 2):
        os.pwrite(fd, bytes([i % 251 + 1]) * size, i * size)
    os.close(fd)
elif cmd == "union":  # OUT N SIZE: what both writers together must leave
    out, n, size = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    with open(out, "wb") as f:
        for i in range(n):
            f.write(bytes([i % 251 + 1]) * size)
elif cmd == "race":  # DIR_A DIR_B N: a thread per mount O_CREAT|O_EXCL's r0..r{N-1}, both
    # released together for each name; prints a line per mount, 1 (created) or 0 per name
    import threading
    dirs, n = sys.argv[2:4], int(sys.argv[4])
    barrier = threading.Barrier(2)
    won = [[], []]
    def racer(k):
        for i in range(n):
            barrier.wait(timeout=60)
            try:
                os.close(os.open(f"{dirs[k]}/r{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
                won[k].append("1")
            except FileExistsError:
                won[k].append("0")
    threads = [threading.Thread(target=racer, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(" ".join(won[0]))
    print(" ".join(won[1]))
elif cmd == "sees":  # PATH NEWFILE READY GO: holds PATH open, read once (cached), then waits
    # for GO and rereads through the same descriptor until it holds NEWFILE's bytes (10 s)
    path, new, ready, go = sys.argv[2:6]
    fd = os.open(path, os.O_RDONLY)
    os.pread(fd, 1 << 22, 0)
    open(ready, "w").close()
    wait_file(go)
    want = open(new, "rb").read()
    for _ in range(200):
        if os.pread(fd, len(want) + 1, 0) == want:
            print("saw the new bytes")
            sys.exit(0)
        time.sleep(0.05)
    sys.exit("sees: the descriptor kept showing the old bytes for 10 s")
elif cmd == "hold":  # PATH MODE STEPS...: opens PATH (r: O_DIRECT read, w: write), then for each
    # step file: waits for it and reads again (r), printing "read <sha>" or "read EIO"
    import hashlib
    path, mode = sys.argv[2], sys.argv[3]
    if mode == "w":
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        print("open", flush=True)
    else:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        n = os.fstat(fd).st_size
        print("open", hashlib.sha256(direct_read(fd, n)).hexdigest(), flush=True)
    for step in sys.argv[4:]:
        wait_file(step, 120)
        if mode == "w":
            continue
        try:
            print("read", hashlib.sha256(direct_read(fd, n)).hexdigest(), flush=True)
        except OSError as e:
            print("read", "EIO" if e.errno == 5 else e.strerror, flush=True)
    try:
        os.close(fd)
    except OSError:
        pass
    print("closed", flush=True)
else:
    sys.exit("unknown helper " + cmd)
PY
}

sha() { sha256sum <"$1" | cut -d' ' -f1; }
# held MNT INO: the chunk count .regions/files shows for inode INO ("" once its record is gone:
# an unlinked file keeps it, nameless, while any mount has it open).
held() { sed -n "s/^path=[^ ]* ino=$2 size=[0-9]* chunks=\([0-9]*\) .*/\1/p" "$1/.regions/files"; }
# wait_line FILE REGEX [SECONDS]: until FILE has a matching line.
wait_line() {
  for _ in $(seq $((${3:-20} * 10))); do
    grep -qE "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  fail "no line /$2/ in $1 within ${3:-20} s: $(cat "$1" 2>/dev/null)"
}

# Disjoint writers, one process in each mount at once: every other 96 KiB slice of one file each
# (not chunk-aligned, so both often fill the same 128 KiB hole), and a file of their own; both
# mounts then read the exact union.
multi_union() {
  local n=40 size=$((96 * 1024))
  : >"$MNT_A/shared"
  head -c 1500000 /dev/urandom >"$WORK/own_a"
  head -c 1700000 /dev/urandom >"$WORK/own_b"
  python3 "$WORK/multi.py" union "$WORK/union" "$n" "$size"
  rm -f "$WORK/go_union"
  python3 "$WORK/multi.py" slices "$MNT_A/shared" 0 "$n" "$size" "$WORK/go_union" &
  local wa=$!
  python3 "$WORK/multi.py" slices "$MNT_B/shared" 1 "$n" "$size" "$WORK/go_union" &
  local wb=$!
  cp "$WORK/own_a" "$MNT_A/own_a" &
  local ca=$!
  cp "$WORK/own_b" "$MNT_B/own_b" &
  local cb=$!
  touch "$WORK/go_union"
  for p in $wa $wb $ca $cb; do wait "$p" || fail "a writer failed"; done
  local want m
  want="$(sha "$WORK/union")"
  for m in "$MNT_A" "$MNT_B"; do
    [[ "$(sha "$m/shared")" == "$want" ]] || fail "$m/shared is not the union of both writers"
    [[ "$(sha "$m/own_a")" == "$(sha "$WORK/own_a")" ]] || fail "$m/own_a differs"
    [[ "$(sha "$m/own_b")" == "$(sha "$WORK/own_b")" ]] || fail "$m/own_b differs"
  done
  log "disjoint writers in both mounts at once: both read the exact union ($n slices) and both files"
}

# Close-to-open: a file written and closed in A, opened in B right after, shows A's bytes, over
# rounds that grow and shrink it (B read it before, so its kernel had pages and a size cached);
# a new name made in A is found by B at once.
multi_close_to_open() {
  local r sizes=(300000 2500000 70000 1300000 131072)
  for r in 0 1 2 3 4; do
    head -c "${sizes[$r]}" /dev/urandom >"$WORK/c2o"
    cp "$WORK/c2o" "$MNT_A/c2o"
    [[ "$(sha "$MNT_B/c2o")" == "$(sha "$WORK/c2o")" ]] ||
      fail "round $r: B read other bytes than A wrote and closed (${sizes[$r]} B; B has $(stat -c %s "$MNT_B/c2o") B)"
    cp "$WORK/c2o" "$MNT_A/new$r"
    [[ "$(sha "$MNT_B/new$r")" == "$(sha "$WORK/c2o")" ]] || fail "round $r: B did not find A's new file"
  done
  log "close-to-open: 5 rounds of rewrites (grown and shrunk) and new names seen by B at once"
}

# A file B holds open (its pages cached) and A rewrites in place: B's descriptor shows the new
# bytes (the daemon drops the kernel's pages of what another mount changed).
multi_inval() {
  head -c 600000 /dev/urandom >"$MNT_A/inval"
  head -c 600000 /dev/urandom >"$WORK/inval_new"
  rm -f "$WORK/inval_ready" "$WORK/inval_go"
  python3 "$WORK/multi.py" sees "$MNT_B/inval" "$WORK/inval_new" "$WORK/inval_ready" \
    "$WORK/inval_go" >"$WORK/sees.out" 2>&1 &
  local p=$!
  for _ in $(seq 100); do [[ -f "$WORK/inval_ready" ]] && break; sleep 0.1; done
  dd if="$WORK/inval_new" of="$MNT_A/inval" conv=notrunc status=none
  touch "$WORK/inval_go"
  wait "$p" || fail "B's open descriptor: $(cat "$WORK/sees.out")"
  log "a file open in B and rewritten in A: B's descriptor reads the new bytes"
}

# Racing exclusive creates: two threads, one through each mount, O_CREAT|O_EXCL the same 40 names,
# released together for each; every name has exactly one winner.
multi_excl_race() {
  local n=40
  mkdir "$MNT_A/race"
  timeout 120 python3 "$WORK/multi.py" race "$MNT_A/race" "$MNT_B/race" "$n" >"$WORK/race.out" ||
    fail "the racers failed: $(cat "$WORK/race.out")"
  local a b i both=0 none=0 wa=0
  read -r -a a < <(sed -n 1p "$WORK/race.out")
  read -r -a b < <(sed -n 2p "$WORK/race.out")
  for ((i = 0; i < n; i++)); do
    ((a[i] + b[i] == 2)) && both=$((both + 1))
    ((a[i] + b[i] == 0)) && none=$((none + 1))
    wa=$((wa + a[i]))
  done
  ((both == 0 && none == 0)) ||
    fail "racing O_EXCL creates: $both name(s) created by both mounts, $none by neither (of $n)"
  log "racing O_EXCL creates of $n names: exactly one winner each (A won $wa, B $((n - wa)))"
}

# ONEWRITER across mounts: while a process in A has a file open for writing, a writer in B gets
# EBUSY and a reader in B gets in; once A's writer closes, B may write.
multi_onewriter() {
  mkdir "$MNT_A/ow"
  python3 -c 'import os, sys; os.setxattr(sys.argv[1], "user.region.onewriter", b"1")' "$MNT_A/ow"
  echo first >"$MNT_A/ow/f"
  rm -f "$WORK/ow_go"
  python3 "$WORK/multi.py" hold "$MNT_A/ow/f" w "$WORK/ow_go" >"$WORK/ow_hold.out" 2>&1 &
  local p=$!
  wait_line "$WORK/ow_hold.out" '^open'
  local out rc=0
  out="$(bash -c 'echo second >>"$1"' _ "$MNT_B/ow/f" 2>&1)" || rc=$?
  ((rc != 0)) && [[ "$out" == *"busy"* ]] || fail "a second writer in B: rc $rc $out (want EBUSY)"
  [[ "$(cat "$MNT_B/ow/f")" == first ]] || fail "a reader in B was refused or read other bytes"
  touch "$WORK/ow_go"
  wait "$p" || fail "A's writer: $(cat "$WORK/ow_hold.out")"
  echo third >>"$MNT_B/ow/f" || fail "B could not write after A's writer closed"
  log "ONEWRITER: a writer in B gets EBUSY while A's is open, a reader gets in; B writes after"
}

# A file unlinked in A while a process in B reads it (O_DIRECT: every read reaches B's daemon):
# B keeps reading its bytes while A fills new files (reusing freed memory if it were freed), and
# A still shows the nameless file with its 32 chunks until B closes it; then it goes.
multi_unlink_open() {
  head -c $((4 * 1024 * 1024)) /dev/urandom >"$MNT_A/held"
  local want ino
  want="$(sha "$MNT_A/held")"
  ino="$(stat -c %i "$MNT_A/held")"
  rm -f "$WORK/uo_1" "$WORK/uo_2"
  python3 "$WORK/multi.py" hold "$MNT_B/held" r "$WORK/uo_1" "$WORK/uo_2" >"$WORK/uo.out" 2>&1 &
  local p=$!
  wait_line "$WORK/uo.out" '^open'
  rm "$MNT_A/held"
  head -c $((6 * 1024 * 1024)) /dev/zero | tr '\0' '\356' >"$MNT_A/tags"
  touch "$WORK/uo_1"
  wait_line "$WORK/uo.out" '^read'
  [[ "$(grep -m1 '^read' "$WORK/uo.out")" == "read $want" ]] ||
    fail "B read other bytes from a file A unlinked: $(grep '^read' "$WORK/uo.out")"
  [[ "$(held "$MNT_A" "$ino")" == 32 ]] ||
    fail "the unlinked file's record or chunks went while B had it open: chunks '$(held "$MNT_A" "$ino")'"
  touch "$WORK/uo_2"
  wait "$p" || fail "B's reader: $(cat "$WORK/uo.out")"
  for _ in $(seq 100); do
    [[ -z "$(held "$MNT_A" "$ino")" ]] && break
    sleep 0.1
  done
  [[ -z "$(held "$MNT_A" "$ino")" ]] || fail "the unlinked file stayed 10 s after B's close"
  rm "$MNT_A/tags"
  log "unlinked in A while B reads it: B reads its bytes, its 32 chunks stay until B closes, then go"
}

# A mount killed (B: SIGKILL) and one stopped past its lease (C: SIGSTOP), each holding a file A
# unlinks: A keeps working; the chunks stay in use until the dead and the stopped mount's leases
# end (5 s), then return; B's ONEWRITER claim goes with its lease too. When C resumes, a read
# through the file it held fails with EIO (its lease ran out, the memory may be another region's
# by then) instead of returning the bytes A wrote meanwhile.
multi_kill_and_fence() {
  head -c $((2 * 1024 * 1024)) /dev/urandom >"$MNT_A/held2"
  # C's file (2 chunks) between two one-chunk keepers: A hands out the lowest free chunks first, so
  # every unit it lands in keeps a keeper, is not given back when it goes, and A's next file takes
  # its chunks again (what C must then not read).
  echo keep >"$MNT_A/keep1"
  head -c 200000 /dev/urandom >"$MNT_A/held3"
  echo keep >"$MNT_A/keep2"
  echo x >"$MNT_A/ow/f2"
  rm -f "$WORK/kf_never" "$WORK/kf_read"
  python3 "$WORK/multi.py" hold "$MNT_B/held2" r "$WORK/kf_never" >"$WORK/kf_b.out" 2>&1 &
  local pb=$!
  python3 "$WORK/multi.py" hold "$MNT_B/ow/f2" w "$WORK/kf_never" >"$WORK/kf_bw.out" 2>&1 &
  local pbw=$!
  python3 "$WORK/multi.py" hold "$MNT_C/held3" r "$WORK/kf_read" >"$WORK/kf_c.out" 2>&1 &
  local pc=$!
  wait_line "$WORK/kf_b.out" '^open'
  wait_line "$WORK/kf_bw.out" '^open'
  wait_line "$WORK/kf_c.out" '^open'
  local i2 i3
  i2="$(stat -c %i "$MNT_A/held2")"
  i3="$(stat -c %i "$MNT_A/held3")"
  rm "$MNT_A/held2" "$MNT_A/held3"
  kill -KILL "$PID_B"
  kill -STOP "$PID_C"
  local t0
  t0=$(date +%s%3N)
  # A keeps working meanwhile.
  head -c 300000 /dev/urandom >"$WORK/alive"
  cp "$WORK/alive" "$MNT_A/alive"
  [[ "$(sha "$MNT_A/alive")" == "$(sha "$WORK/alive")" ]] || fail "A stopped working with B dead and C stopped"
  [[ "$(held "$MNT_A" "$i2") $(held "$MNT_A" "$i3")" == "16 2" ]] ||
    fail "the killed or stopped mount's file went before its lease ended: '$(held "$MNT_A" "$i2") $(held "$MNT_A" "$i3")'"
  for _ in $(seq 200); do
    [[ -z "$(held "$MNT_A" "$i2")$(held "$MNT_A" "$i3")" ]] && break
    sleep 0.1
  done
  [[ -z "$(held "$MNT_A" "$i2")$(held "$MNT_A" "$i3")" ]] ||
    fail "the dead and the stopped mount's files still held after 20 s (chunks '$(held "$MNT_A" "$i2")' '$(held "$MNT_A" "$i3")')"
  log "B killed, C stopped: the files they held went $(($(date +%s%3N) - t0)) ms later (their leases)"
  echo y >>"$MNT_A/ow/f2" || fail "the killed mount's ONEWRITER claim outlived its lease"
  # The freed memory goes to a new file of A's; then C resumes and reads what it held.
  head -c $((6 * 1024 * 1024)) /dev/zero | tr '\0' '\356' >"$MNT_A/tags2"
  kill -CONT "$PID_C"
  touch "$WORK/kf_read"
  wait_line "$WORK/kf_c.out" '^read' 30
  [[ "$(grep -m1 '^read' "$WORK/kf_c.out")" == "read EIO" ]] ||
    fail "C, stopped past its lease, read through its old handle: $(grep '^read' "$WORK/kf_c.out") (want EIO)"
  log "C resumed after its lease ran out: a read through its old handle gets EIO"
  kill -KILL "$pb" "$pbw" 2>/dev/null || true
  wait "$pb" "$pbw" "$pc" 2>/dev/null || true
  wait "$PID_B" 2>/dev/null || true
  fusermount3 -uz "$MNT_B" 2>/dev/null || true
  rm "$MNT_A/tags2" "$MNT_A/keep1" "$MNT_A/keep2"
}
