#!/usr/bin/env bash
# The network-namespace harness (scripts/netns_cluster) checks itself: three namespaces on one
# bridge, etcd in the first, a farmemd in each; every namespace reaches every farmemd and etcd
# lists all three; nothing is left after success, a failed command, a failed start or SIGTERM.
# Needs root, 'ip netns' and etcd (else SKIP). NETNS_CLUSTER_FAULT=no_teardown must make it fail.
set -euo pipefail

FARMEM="${1:?usage: $0 path/to/farmem path/to/farmemd}"
FARMEMD="${2:?usage: $0 path/to/farmem path/to/farmemd}"
TEST_NAME=harness_netns
WORK="" # nothing of its own: the harness keeps the daemons' logs
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
netns_test_start # whatever the selftest leaves (it fails then), `down` removes
command -v etcd >/dev/null 2>&1 || [[ -x "${FARMEM_ETCD:-/usr/bin/etcd}" ]] ||
  skip "etcd not found (apt install etcd-server)"

start=$(date +%s%N)
"$NETNS_HARNESS" selftest --farmem "$FARMEM" --farmemd "$FARMEMD" || fail "selftest failed"
log "PASS in $((($(date +%s%N) - start) / 1000000)) ms"
