#!/usr/bin/env bash
# Poison jobs (issue 12, item 1): a job whose every run kills the server
# (its exec step sends SIGKILL to its parent, jackdawd) is run at most three
# times. At the fourth start it is failed with kind "quarantined" instead of
# replayed, the log says so with a WARN naming it, /metrics counts it, and
# the server stays up: a job waiting for a message through all the crashes
# is not blamed and still finishes, and new jobs run. Clean restarts are not
# crashes. Prints TAP.
# shellcheck disable=SC2016,SC2119
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

FLAGS=(--exec-allow /bin/sh)

# Wait up to 30 s for the server to die by itself; false if it is still up.
server_dies() {
    for _ in $(seq 1 300); do
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            { stop_server wait; } 2>/dev/null # not the shell's "Killed" line
            return 0
        fi
        sleep 0.1
    done
    return 1
}

start_server "${FLAGS[@]}" || exit 1

# A job that waits for a message: idle while the crashes happen.
json_post /v1/jobs '{"steps":[{"id":"w","wait":"go"}]}'
check "waiting job: accepted" status_is 201
wid=$(location_id)
for _ in $(seq 1 100); do
    req GET "/v1/jobs/$wid"
    body_has '"state":"waiting"' && break
    sleep 0.05
done
check "waiting job: waiting" body_has '"state":"waiting"'

# A clean restart while it waits is not a crash (it must not add up).
stop_server
start_server "${FLAGS[@]}" || exit 1

# The poison job: its step kills the server a moment after it starts, on
# every run (the dispatch is recorded, the completion never is).
json_post /v1/jobs '{"steps":[{"id":"boom","call":"exec","args":{"argv":["/bin/sh","-c","sleep 1; kill -9 $PPID"]}}]}'
check "poison job: accepted" status_is 201
pid=$(location_id)

deaths=0
for start in 1 2 3; do
    if server_dies; then
        deaths=$((deaths + 1))
    else
        notok "server killed by the poison job on run $start"
        stop_server KILL
    fi
    [ "$start" = 3 ] && break
    start_server "${FLAGS[@]}" || exit 1
done
check "the poison job killed the server 3 times" test "$deaths" = 3

# Fourth start: quarantined, not replayed.
start_server "${FLAGS[@]}" || exit 1
req GET "/v1/jobs/$pid"
check "poison job: failed with kind quarantined" \
    eval 'body_has "\"state\":\"failed\"" && body_has "\"kind\":\"quarantined\""'
check "the error says why" body_has 'stopped 3 times in a row'
check "the log has a WARN naming the job" \
    grep -qE "\"level\":\"warn\".*job $pid quarantined" "$LOG"
sleep 2
check "the server is still up 2 s later" kill -0 "$SERVER_PID"
req GET /metrics
check "/metrics: jackdaw_jobs_quarantined_total 1" body_has 'jackdaw_jobs_quarantined_total 1'

# The waiting job was idle, not running: not quarantined, and it finishes.
req GET "/v1/jobs/$wid"
check "the waiting job is still waiting" body_has '"state":"waiting"'
json_post "/v1/jobs/$wid/messages" '{"topic":"go","data":1}'
check "message to the waiting job: 202" status_is 202
wait_job "$wid"
check "the waiting job succeeds" body_has '"state":"succeeded"'

# Other jobs run.
json_post /v1/jobs '{"handler":"echo","args":{"v":1}}'
nid=$(location_id)
wait_job "$nid"
check "a new job succeeds" body_has '"state":"succeeded"'

# A quarantined job stays failed across a clean restart; the counter is
# per process.
stop_server
check "server stops cleanly" test "$SERVER_RC" = 0
start_server "${FLAGS[@]}" || exit 1
req GET "/v1/jobs/$pid"
check "after a restart the poison job is still quarantined" body_has '"kind":"quarantined"'
stop_server
finish
