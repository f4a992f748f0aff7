#!/usr/bin/env bash
# Remote regions across three network namespaces (scripts/netns_cluster --etcd): a farmemd in each,
# metadata in etcd (ns1). `farmem mount` in ns1 (servers: all three) writes a 7 MiB MULTIHOSTED
# file, whose 2 MiB steps land on all three farmemds; a mount from ns2 is refused while that one
# lives (one mount per namespace); after it unmounts, a mount in ns3 reads the same sha256 (cached
# and O_DIRECT). Native TCP only (`farmem mount` has no other backend). Needs root, 'ip netns',
# /dev/fuse and etcd (else SKIP). FARMEM_REGIONS_FAULT=no_claim must make it fail.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BYTES=$((7 * 1024 * 1024 + 7)) # 4 steps of 2 MiB: servers home, +1, +2, home again

# Inside a namespace: <role> <farmem> <mount point>; the files in $NETNS_DIR coordinate the roles.
if [[ "${1:-}" == __mount ]]; then
  ROLE=$2
  FARMEM=$3
  MNT=$4
  TEST_NAME="regions_netns: $ROLE"
  WORK="$NETNS_DIR"
  source "$HERE/lib.sh"
  servers=()
  for s in ${NETNS_SERVERS//,/ }; do servers+=(--server "$s"); done
  mkdir -p "$MNT"
  "$FARMEM" mount "$MNT" --cluster "$NETNS_ETCD" "${servers[@]}" --token "$NETNS_TOKEN" \
    >"$NETNS_DIR/$ROLE.out" 2>"$NETNS_DIR/$ROLE.err" &
  pid=$!
  if [[ "$ROLE" == second ]]; then
    expect_mount_refused "$NETNS_DIR/$ROLE.out" "$NETNS_DIR/$ROLE.err" "$pid"
    log "refused while the first mount lives"
    exit 0
  fi
  wait_mounted "$NETNS_DIR/$ROLE.out" "$MNT" "$pid"
  want="$(sha256sum <"$NETNS_DIR/ref")"
  if [[ "$ROLE" == writer ]]; then
    mkdir "$MNT/d"
    python3 -c 'import os, sys; os.setxattr(sys.argv[1], "user.region.multihosted", b"1")' "$MNT/d"
    cp "$NETNS_DIR/ref" "$MNT/d/data"
    touch "$NETNS_DIR/written"
    for _ in $(seq 600); do
      [[ -f "$NETNS_DIR/go" ]] && break
      sleep 0.1
    done
    [[ -f "$NETNS_DIR/go" ]] || fail "not told to unmount within 60 s"
  fi
  [[ "$(sha256sum <"$MNT/d/data")" == "$want" ]] || fail "data differs"
  [[ "$(dd if="$MNT/d/data" iflag=direct bs=1M status=none | sha256sum)" == "$want" ]] ||
    fail "data differs (O_DIRECT)"
  kill -TERM "$pid"
  wait "$pid" || fail "farmem mount exited $? after SIGTERM"
  log "sha256 equal; unmounted"
  exit 0
fi

# Inside the cluster (netns_cluster run): the three roles in their namespaces.
if [[ "${1:-}" == __inside ]]; then
  FARMEM=$2
  MNT=$3
  TEST_NAME=regions_netns
  WORK="$NETNS_DIR"
  source "$HERE/lib.sh"
  head -c "$BYTES" /dev/urandom >"$NETNS_DIR/ref"
  rm -f "$NETNS_DIR/written" "$NETNS_DIR/go"
  ip netns exec "$NETNS_NS1" "${BASH_SOURCE[0]}" __mount writer "$FARMEM" "$MNT/a" &
  writer=$!
  for _ in $(seq 600); do
    [[ -f "$NETNS_DIR/written" ]] && break
    kill -0 "$writer" 2>/dev/null || fail "the writer in ns1 exited early"
    sleep 0.1
  done
  [[ -f "$NETNS_DIR/written" ]] || fail "the writer did not write within 60 s"
  # The file's 2 MiB steps live on every farmemd: each holds persistent memory now.
  for i in 1 2 3; do
    ip="NETNS_IP$i"
    ip netns exec "$NETNS_NS2" timeout 30 "$FARMEM" stat "${!ip}:7300" --token "$NETNS_TOKEN" \
      --data-host "$NETNS_IP2" >"$NETNS_DIR/stat$i.txt" 2>/dev/null || fail "farmem stat of server $i"
    line="$(grep -E 'persistent [0-9.]+ [KMG]?i?B in [0-9]+' "$NETNS_DIR/stat$i.txt" || true)"
    log "server $i:${line:- no persistent line}"
    [[ "$line" =~ persistent\ ([0-9.]+)\ [KMG]?i?B\ in\ ([0-9]+) && "${BASH_REMATCH[2]}" -gt 0 ]] ||
      fail "server $i holds none of the file"
  done
  ip netns exec "$NETNS_NS2" "${BASH_SOURCE[0]}" __mount second "$FARMEM" "$MNT/b" ||
    { touch "$NETNS_DIR/go"; wait "$writer" || true; exit 1; }
  touch "$NETNS_DIR/go"
  wait "$writer" || fail "the writer failed"
  ip netns exec "$NETNS_NS3" "${BASH_SOURCE[0]}" __mount reader "$FARMEM" "$MNT/c" ||
    fail "the reader failed"
  exit 0
fi

FARMEM="${1:?usage: $0 path/to/farmem path/to/farmemd}"
FARMEMD="${2:?usage: $0 path/to/farmem path/to/farmemd}"
TEST_NAME=regions_netns
WORK="$(mktemp -d -t farmem-regnetns.XXXXXX)"
source "$HERE/lib.sh"
# The mounts live in the namespaces' own mount namespaces (ip netns exec) and end with their
# processes; the harness kills whatever runs inside the namespaces.
netns_test_start
[[ -c /dev/fuse ]] || skip "/dev/fuse is missing"
command -v etcd >/dev/null 2>&1 || [[ -x "${FARMEM_ETCD:-/usr/bin/etcd}" ]] ||
  skip "etcd not found (apt install etcd-server)"

netns_case tcp --farmemd "$FARMEMD" --etcd -- "${BASH_SOURCE[0]}" __inside "$FARMEM" "$WORK"
log "PASS"
