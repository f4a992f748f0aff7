#!/usr/bin/env bash
# Remote regions, several mounts of one namespace on one host (docs/regions.md "Several mounts"):
# `farmem cluster up --nodes 1` (a real etcd and farmemd on loopback) and three `farmem mount
# --cluster etcd://... --server ...` processes A, B, C. The checks of tests/regions_multi_lib.sh:
# disjoint writers see the exact union, close-to-open, a descriptor sees another mount's rewrite,
# racing O_EXCL creates have one winner, ONEWRITER holds across mounts, a file unlinked in A while
# B reads it keeps its bytes and memory until B closes, and a killed (B) and a stopped (C) mount
# let go of what they held once their leases end (C's old handle then reads EIO). After A and C
# unmount, a new mount finds the namespace and the data (persistent units) with the same sha256.
# FARMEM_REGIONS_FAULT=exclusive_caching|no_remote_inval|no_create_cas|no_cluster_onewriter|
# no_open_check|unbound_opens|no_fence makes it fail (docs/regions.md, test table). SKIP without
# /dev/fuse or etcd. Labels: regions, integration. Usage: regions_etcd_test.sh FARMEM FARMEMD
set -euo pipefail

FARMEM="${1:?usage: $0 path/to/farmem path/to/farmemd}"
FARMEMD="${2:?usage: $0 path/to/farmem path/to/farmemd}"
ETCD="${FARMEM_ETCD:-$(command -v etcd || echo /usr/bin/etcd)}"
export FARMEM_TOKEN="regions-etcd-$$"
unset FARMEM_CLUSTER
WORK="$(mktemp -d -t farmem-regions-etcd.XXXXXX)"
DIR="$WORK/cluster"
PIDS=()

TEST_NAME=regions_etcd
LOG_GLOBS="$DIR/*.log"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/regions_multi_lib.sh"
cleanup() {
  local rc=$? m p
  for p in "${PIDS[@]}"; do kill -CONT "$p" 2>/dev/null || true; done
  for m in "$WORK"/m*; do
    if grep -qs " $m " /proc/mounts; then fusermount3 -uz "$m" 2>/dev/null || true; fi
  done
  for p in "${PIDS[@]}"; do stop_process "$p"; done
  if [[ -f "$DIR/cluster.json" ]]; then
    timeout 30 "$FARMEM" cluster down --dir "$DIR" --wait 5 >/dev/null 2>&1 || true
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT

[[ -c /dev/fuse ]] || { echo "SKIP: /dev/fuse is missing"; exit 0; }
[[ -x "$ETCD" ]] || { echo "SKIP: etcd not found ($ETCD)"; exit 0; }
[[ -z "${FARMEM_REGIONS_FAULT:-}" ]] || log "fault: FARMEM_REGIONS_FAULT=$FARMEM_REGIONS_FAULT"

"$FARMEM" cluster up --nodes 1 --dir "$DIR" --etcd "$ETCD" --farmemd "$FARMEMD" --wait 60 \
  >"$WORK/up.out" 2>&1 || fail "cluster up: $(tail -5 "$WORK/up.out")"
URL="$(sed -n 's/^export FARMEM_CLUSTER=//p' "$WORK/up.out")"
SERVER="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["nodes"][0]["listen"])' \
  "$DIR/cluster.json")"
log "etcd at $URL, farmemd at $SERVER"

# mount_at NAME: `farmem mount $WORK/NAME` in the background, waited for; its pid in MOUNT_PID.
mount_at() {
  mkdir -p "$WORK/$1"
  "$FARMEM" mount "$WORK/$1" --cluster "$URL" --server "$SERVER" >"$WORK/$1.out" \
    2>"$WORK/$1.err" &
  MOUNT_PID=$!
  PIDS+=("$MOUNT_PID")
  wait_mounted "$WORK/$1.out" "$WORK/$1" "$MOUNT_PID"
}
unmount() {
  kill -TERM "$1"
  wait "$1" || fail "farmem mount exited with $? after SIGTERM"
}

multi_helpers
mount_at ma
PID_A=$MOUNT_PID
mount_at mb
PID_B=$MOUNT_PID
mount_at mc
PID_C=$MOUNT_PID
MNT_A="$WORK/ma" MNT_B="$WORK/mb" MNT_C="$WORK/mc"
grep -q " shared=1 lease=ok " "$MNT_A/.regions/daemon" || fail "mount A is not shared: $(cat "$MNT_A/.regions/daemon")"
log "three mounts of one namespace (pids $PID_A $PID_B $PID_C)"

multi_union
multi_close_to_open
multi_inval
multi_excl_race
multi_onewriter
multi_unlink_open
multi_kill_and_fence

want="$(sha "$WORK/own_b")"
unmount "$PID_A"
unmount "$PID_C"
mount_at md
[[ "$(sha "$WORK/md/own_b")" == "$want" ]] || fail "data differs after remount"
[[ "$(dd if="$WORK/md/own_b" iflag=direct bs=1M status=none | sha256sum | cut -d' ' -f1)" == "$want" ]] ||
  fail "data differs after remount (O_DIRECT)"
[[ "$(sha "$WORK/md/shared")" == "$(sha "$WORK/union")" ]] || fail "the shared file differs after remount"
unmount "$MOUNT_PID"
log "after every mount went, a new mount finds the namespace and the data (sha256 equal)"
log "PASS"
