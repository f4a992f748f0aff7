#!/usr/bin/env bash
# Remote regions, several mounts of one namespace across three network namespaces
# (scripts/netns_cluster --etcd): a farmemd in each, etcd in ns1; `farmem mount` A in ns1, B in ns3
# and C in ns2 (each daemon in its namespace's network through `nsenter --net`, so the mount
# points stay in this shell's mount namespace), every mount with all three --servers. A writes a
# 7 MiB MULTIHOSTED file whose 2 MiB steps land on all three farmemds (`farmem stat` of each) and
# B reads its sha256 (cached and O_DIRECT); then the two-mount checks of tests/regions_multi_lib.sh
# as on one host (regions_etcd_test.sh): union of disjoint writers, close-to-open, a held
# descriptor sees a rewrite, one winner of racing O_EXCL creates, ONEWRITER, unlink while another
# mount reads, a killed and a stopped mount let go at their lease. After A and C unmount, a mount
# in ns2 reads the data again. Native TCP only (`farmem mount` has no other backend). Needs root,
# 'ip netns', nsenter, /dev/fuse and etcd (else SKIP). The FARMEM_REGIONS_FAULT switches of
# regions_etcd_test.sh make it fail the same way.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BYTES=$((7 * 1024 * 1024 + 7)) # 4 steps of 2 MiB: servers home, +1, +2, home again

# Inside the cluster (netns_cluster run): the mounts, their checks, and their cleanup.
if [[ "${1:-}" == __inside ]]; then
  FARMEM=$2
  WORK=$3
  TEST_NAME=regions_netns
  source "$HERE/lib.sh"
  source "$HERE/regions_multi_lib.sh"
  PIDS=()
  cleanup_inside() {
    local rc=$? p m
    for p in "${PIDS[@]}"; do kill -CONT "$p" 2>/dev/null || true; done
    for m in "$WORK"/m?; do
      if grep -qs " $m " /proc/mounts; then fusermount3 -uz "$m" 2>/dev/null || true; fi
    done
    for p in "${PIDS[@]}"; do stop_process "$p"; done
    exit "$rc"
  }
  trap cleanup_inside EXIT
  servers=()
  for s in ${NETNS_SERVERS//,/ }; do servers+=(--server "$s"); done
  # mount_in NS NAME: `farmem mount $WORK/NAME` with its network in namespace NS; pid in MOUNT_PID.
  mount_in() {
    mkdir -p "$WORK/$2"
    nsenter --net="/run/netns/$1" "$FARMEM" mount "$WORK/$2" --cluster "$NETNS_ETCD" \
      "${servers[@]}" --token "$NETNS_TOKEN" >"$WORK/$2.out" 2>"$WORK/$2.err" &
    MOUNT_PID=$!
    PIDS+=("$MOUNT_PID")
    wait_mounted "$WORK/$2.out" "$WORK/$2" "$MOUNT_PID"
  }
  multi_helpers
  mount_in "$NETNS_NS1" ma
  PID_A=$MOUNT_PID
  mount_in "$NETNS_NS3" mb
  PID_B=$MOUNT_PID
  mount_in "$NETNS_NS2" mc
  PID_C=$MOUNT_PID
  MNT_A="$WORK/ma" MNT_B="$WORK/mb" MNT_C="$WORK/mc"
  log "mounts in ns1, ns3 and ns2 (pids $PID_A $PID_B $PID_C)"

  head -c "$BYTES" /dev/urandom >"$WORK/ref"
  mkdir "$MNT_A/d"
  python3 -c 'import os, sys; os.setxattr(sys.argv[1], "user.region.multihosted", b"1")' "$MNT_A/d"
  cp "$WORK/ref" "$MNT_A/d/data"
  # The file's 2 MiB steps live on every farmemd: each holds persistent memory now.
  for i in 1 2 3; do
    ip="NETNS_IP$i"
    ip netns exec "$NETNS_NS2" timeout 30 "$FARMEM" stat "${!ip}:7300" --token "$NETNS_TOKEN" \
      --data-host "$NETNS_IP2" >"$WORK/stat$i.txt" 2>/dev/null || fail "farmem stat of server $i"
    line="$(grep -E 'persistent [0-9.]+ [KMG]?i?B in [0-9]+' "$WORK/stat$i.txt" || true)"
    log "server $i:${line:- no persistent line}"
    [[ "$line" =~ persistent\ ([0-9.]+)\ [KMG]?i?B\ in\ ([0-9]+) && "${BASH_REMATCH[2]}" -gt 0 ]] ||
      fail "server $i holds none of the file"
  done
  want="$(sha "$WORK/ref")"
  [[ "$(sha "$MNT_B/d/data")" == "$want" ]] || fail "B (ns3) read other bytes"
  [[ "$(dd if="$MNT_B/d/data" iflag=direct bs=1M status=none | sha256sum | cut -d' ' -f1)" == "$want" ]] ||
    fail "B (ns3) read other bytes (O_DIRECT)"
  log "a MULTIHOSTED file written in ns1 is on all three farmemds; ns3 reads the same sha256"

  multi_union
  multi_close_to_open
  multi_inval
  multi_excl_race
  multi_onewriter
  multi_unlink_open
  multi_kill_and_fence

  for p in "$PID_A" "$PID_C"; do
    kill -TERM "$p"
    wait "$p" || fail "farmem mount exited $? after SIGTERM"
  done
  mount_in "$NETNS_NS2" md
  [[ "$(sha "$WORK/md/d/data")" == "$want" ]] || fail "data differs after remount in ns2"
  [[ "$(sha "$WORK/md/shared")" == "$(sha "$WORK/union")" ]] || fail "the shared file differs after remount"
  log "after the mounts went, a new one in ns2 reads the same data"
  exit 0
fi

FARMEM="${1:?usage: $0 path/to/farmem path/to/farmemd}"
FARMEMD="${2:?usage: $0 path/to/farmem path/to/farmemd}"
TEST_NAME=regions_netns
WORK="$(mktemp -d -t farmem-regnetns.XXXXXX)"
source "$HERE/lib.sh"
netns_test_start
[[ -c /dev/fuse ]] || skip "/dev/fuse is missing"
command -v nsenter >/dev/null 2>&1 || skip "nsenter not found (util-linux)"
command -v etcd >/dev/null 2>&1 || [[ -x "${FARMEM_ETCD:-/usr/bin/etcd}" ]] ||
  skip "etcd not found (apt install etcd-server)"
[[ -z "${FARMEM_REGIONS_FAULT:-}" ]] || log "fault: FARMEM_REGIONS_FAULT=$FARMEM_REGIONS_FAULT"

netns_case tcp --farmemd "$FARMEMD" --etcd -- "${BASH_SOURCE[0]}" __inside "$FARMEM" "$WORK"
log "PASS"
