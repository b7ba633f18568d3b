#!/usr/bin/env bash
# tests/integration/test_cluster.sh: the cluster's proof (tests/cluster/
# cluster.sh, `make cluster-test`) kept to about 45 s for `make test`:
# 3 nodes on a throwaway PostgreSQL (fsync on), --lease 2s, one SIGKILL and
# one SIGSTOP past two leases under 3 clients for about 9 s of load. Same
# assertions as `make cluster-test`: nothing acknowledged lost, every job
# succeeded, no completion recorded twice (SQL), every side effect there,
# the stopped node fenced and back as a new incarnation, the undisturbed
# node kept its lease, long-polls and SSE on other nodes ended with the
# final state. Prints TAP.
cd "$(dirname "$0")/../cluster" || exit 1
NODES=3 ROUNDS=1 LOAD_S=9 CLIENTS=3 exec ./cluster.sh
