#!/usr/bin/env bash
# The regions sync primitives across three network namespaces (scripts/netns_cluster --etcd): a
# farmemd and etcd in ns1; regions_sync_tests' SyncProcessStress.DISABLED_AcrossThreeNetworkNamespaces
# runs in ns1 and starts its three child processes in ns1, ns2 and ns3: barrier rounds (nobody
# passes round k before all arrived), a mutex-protected non-atomic remote counter exact, bell
# values monotonic (docs/regions_sync.md). Needs root, 'ip netns', etcd and the regions_sync_tests
# binary next to farmem (else SKIP). FARMEM_REGIONS_SYNC_FAULT=mutex_skip|barrier_early|bell_nowait
# must make it fail.
set -euo pipefail

FARMEM="${1:?usage: $0 path/to/farmem path/to/farmemd}"
FARMEMD="${2:?usage: $0 path/to/farmem path/to/farmemd}"
SYNC_TESTS="${FARMEM_REGIONS_SYNC_TESTS:-$(dirname "$FARMEM")/regions_sync_tests}"
TEST_NAME=regions_sync_netns
WORK=""
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
netns_test_start
command -v etcd >/dev/null 2>&1 || [[ -x "${FARMEM_ETCD:-/usr/bin/etcd}" ]] ||
  skip "etcd not found (apt install etcd-server)"
[[ -x "$SYNC_TESTS" ]] || skip "regions_sync_tests not built ($SYNC_TESTS)"

# The test's client nodes use the default cluster token.
# shellcheck disable=SC2016 # expanded inside the cluster's environment
NETNS_TOKEN=farmem netns_case tcp --farmemd "$FARMEMD" --etcd -- bash -c '
  ip netns exec "$NETNS_NS1" env \
    FARMEM_REGIONS_SYNC_NETNS="$NETNS_ETCD ${NETNS_SERVERS%%,*} $NETNS_NS1 $NETNS_NS2 $NETNS_NS3" \
    "$0" --gtest_filter=SyncProcessStress.DISABLED_AcrossThreeNetworkNamespaces \
    --gtest_also_run_disabled_tests 2>&1 | grep -v "\[info\]" | tail -n 40
  exit "${PIPESTATUS[0]}"' "$SYNC_TESTS"
log "PASS"
