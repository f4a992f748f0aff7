#!/usr/bin/env bash
# Remote regions with shared metadata (docs/regions.md): `farmem cluster up --nodes 1` (a real
# etcd and farmemd on loopback), `farmem mount --cluster etcd://... --server ...`: a second mount
# of the same namespace is refused while the first lives (one mount per namespace until the
# multi-mount protocol exists); after the first unmounts, a new mount finds the namespace and the
# data in etcd and the farmemd (persistent units) with the same sha256. SKIP without /dev/fuse or
# etcd. Labels: regions, integration. Usage: regions_etcd_test.sh FARMEM FARMEMD
set -euo pipefail

FARMEM="${1:?usage: $0 path/to/farmem path/to/farmemd}"
FARMEMD="${2:?usage: $0 path/to/farmem path/to/farmemd}"
ETCD="${FARMEM_ETCD:-$(command -v etcd || echo /usr/bin/etcd)}"
export FARMEM_TOKEN="regions-etcd-$$"
unset FARMEM_CLUSTER
WORK="$(mktemp -d -t farmem-regions-etcd.XXXXXX)"
DIR="$WORK/cluster"
PID=""

TEST_NAME=regions_etcd
LOG_GLOBS="$DIR/*.log"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cleanup() {
  local rc=$? m
  for m in "$WORK/a" "$WORK/b"; do
    if grep -qs " $m " /proc/mounts; then fusermount3 -uz "$m" 2>/dev/null || true; fi
  done
  stop_process "$PID"
  if [[ -f "$DIR/cluster.json" ]]; then
    timeout 30 "$FARMEM" cluster down --dir "$DIR" --wait 5 >/dev/null 2>&1 || true
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT

[[ -c /dev/fuse ]] || { echo "SKIP: /dev/fuse is missing"; exit 0; }
[[ -x "$ETCD" ]] || { echo "SKIP: etcd not found ($ETCD)"; exit 0; }

"$FARMEM" cluster up --nodes 1 --dir "$DIR" --etcd "$ETCD" --farmemd "$FARMEMD" --wait 60 \
  >"$WORK/up.out" 2>&1 || fail "cluster up: $(tail -5 "$WORK/up.out")"
URL="$(sed -n 's/^export FARMEM_CLUSTER=//p' "$WORK/up.out")"
SERVER="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["nodes"][0]["listen"])' \
  "$DIR/cluster.json")"
log "etcd at $URL, farmemd at $SERVER"

# mount_at DIR NAME: starts `farmem mount` in the background (PID) and waits for it.
mount_at() {
  mkdir -p "$1"
  "$FARMEM" mount "$1" --cluster "$URL" --server "$SERVER" >"$WORK/$2.out" 2>"$WORK/$2.err" &
  PID=$!
  wait_mounted "$WORK/$2.out" "$1" "$PID"
}
unmount() {
  kill -TERM "$PID"
  wait "$PID" || fail "farmem mount exited with $? after SIGTERM"
  PID=""
}

mount_at "$WORK/a" a
mkdir "$WORK/a/dir"
head -c $((3 * 1024 * 1024 + 7)) /dev/urandom >"$WORK/ref"
cp "$WORK/ref" "$WORK/a/dir/data"
want="$(sha256sum <"$WORK/ref")"

mkdir -p "$WORK/b"
"$FARMEM" mount "$WORK/b" --cluster "$URL" --server "$SERVER" >"$WORK/second.out" \
  2>"$WORK/second.err" &
second=$!
expect_mount_refused "$WORK/second.out" "$WORK/second.err" "$second"
log "a second mount is refused while the first lives"

unmount
mount_at "$WORK/b" b
[[ "$(sha256sum <"$WORK/b/dir/data")" == "$want" ]] || fail "data differs after remount"
[[ "$(dd if="$WORK/b/dir/data" iflag=direct bs=1M status=none | sha256sum)" == "$want" ]] ||
  fail "data differs after remount (O_DIRECT)"
unmount
log "after unmount, a new mount finds the namespace and the data (sha256 equal)"
log "PASS"
