#!/usr/bin/env bash
# --pin-workers on: the server runs jobs as usual, and each scheduler worker
# thread may run on exactly one CPU, a different one per worker (when the
# machine has two or more); without it no thread is narrowed. Prints TAP.
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

# Threads of the server whose allowed CPU list is a single CPU, and the
# distinct CPUs among them.
single_cpu_threads() {
    grep -h '^Cpus_allowed_list:' /proc/"$SERVER_PID"/task/*/status |
        awk '$2 ~ /^[0-9]+$/ {n++; seen[$2]=1} END {d=0; for (c in seen) d++; print n+0, d}'
}

ncpu=$(nproc)
start_server --workers 2 --pin-workers on || exit 1
json_post /v1/jobs '{"handler":"echo","args":{"x":1},"timeout_ms":5000}'
check "job accepted with pinned workers" status_is 201
ID=$(location_id)
wait_job "$ID"
check "and it succeeds" body_has '"state":"succeeded"'
read -r pinned distinct <<<"$(single_cpu_threads)"
if [ "$ncpu" -ge 2 ]; then
    check "two worker threads pinned to two different CPUs ($pinned pinned, $distinct CPUs)" \
        eval '[ "$pinned" -eq 2 ] && [ "$distinct" -eq 2 ]'
else
    check "one CPU: every thread runs on it ($pinned single-CPU threads)" [ "$pinned" -ge 2 ]
fi
stop_server
check "pinned server stops cleanly" [ "$SERVER_RC" = 0 ]

if [ "$ncpu" -ge 2 ]; then
    start_server --workers 2 || exit 1
    read -r pinned distinct <<<"$(single_cpu_threads)"
    check "default: no thread is pinned ($pinned)" [ "$pinned" -eq 0 ]
    stop_server
fi
finish
