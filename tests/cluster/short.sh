#!/usr/bin/env bash
# tests/cluster/short.sh: the cluster's proof (cluster.sh) kept under 90 s
# for `make test`: 3 nodes, one SIGKILL and one SIGSTOP past two leases
# under 3 clients for about 9 s of load. Same assertions as
# `make cluster-test`.
cd "$(dirname "$0")" || exit 1
NODES=3 ROUNDS=1 LOAD_S=9 CLIENTS=3 exec ./cluster.sh
