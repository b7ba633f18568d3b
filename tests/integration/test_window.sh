#!/usr/bin/env bash
# The queued-job window (--queue-window) against the real server, with a
# window of 4 so that every backlog crosses its boundary again and again:
# run order across the boundary is priority, then age (jobs submitted to a
# paused queue, in batches and one by one, then resumed, and more submitted
# while it drains); delayed jobs beyond the window run when due; cancel,
# message, DELETE and unique keys work on jobs that are only in the store;
# and a SIGKILL while a backlog drains loses nothing and ends nothing twice.
#
# Order is read from what the server recorded (start times of jobs run one
# at a time), so a slow machine makes the test slower, not flaky.
# shellcheck disable=SC2016,SC2034
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

put_queue() { req PUT "/v1/queues/$1" -H 'Content-Type: application/json' --data-binary "$2"; }
pause() { req POST "/v1/queues/$1/pause"; }
resume() { req POST "/v1/queues/$1/resume"; }
# Batch-submit to queue $1 sleep jobs of $2 ms with the priorities $3...
batch_prio() {
    local q=$1 ms=$2 jobs=
    shift 2
    for p in "$@"; do
        jobs="$jobs${jobs:+,}{\"queue\":\"$q\",\"handler\":\"sleep\",\"args\":{\"ms\":$ms},\"priority\":$p}"
    done
    json_post /v1/jobs/batch "{\"jobs\":[$jobs]}"
}
one() { # queue priority [extra members]
    json_post /v1/jobs "{\"queue\":\"$1\",\"handler\":\"sleep\",\"args\":{\"ms\":3},\"priority\":$2${3:+,$3}}"
}
counts() { # queue -> "queued running succeeded failed cancelled"
    req GET "/v1/queues/$1"
    python3 -c 'import json,sys; c=json.loads(sys.argv[1])["counts"]; print(c["queued"], c["running"], c["succeeded"], c["failed"], c["cancelled"])' "$BODY"
}
# Wait until no job of queue $1 is queued or running (up to $2 s).
drain_queue() {
    local queued running rest
    for _ in $(seq 1 $(($2 * 10))); do
        read -r queued running rest <<<"$(counts "$1")"
        [ "$queued" = 0 ] && [ "$running" = 0 ] && return 0
        sleep 0.1
    done
    return 1
}
# The jobs of queue $1 in the order they started: "id priority" per line.
run_order() {
    req GET "/v1/jobs?queue=$1&limit=1000"
    python3 -c '
import json, sys
js = [j for j in json.loads(sys.argv[1])["jobs"] if j["state"] == "succeeded"]
for j in sorted(js, key=lambda j: (j["started_at"], j["id"])):
    print(j["id"], j["priority"])' "$BODY"
}
# stdin ("id priority" lines in run order) is priority desc, then id asc,
# within each run of lines that were queued together (all of them here).
in_priority_order() {
    python3 -c '
import sys
rows = [tuple(map(int, l.split())) for l in sys.stdin if l.strip()]
want = sorted(rows, key=lambda r: (-r[1], r[0]))
if rows != want:
    print("got ", rows[:40]); print("want", want[:40]); sys.exit(1)'
}

start_server --queue-window 4 || exit 1
# One job at a time per queue, so start times give the run order.
for q in w w2 r; do
    put_queue "$q" '{"max_running":1}'
done

# ---- order across the window boundary ----
pause w
batch_prio w 3 0 1 2 0 3 1 0 2 2 1 3 0 0 1 2 3 1 0
check "a batch of 18 to a paused queue: 201" status_is 201
for p in 2 0 3 1 1 0 2 3; do one w "$p" >/dev/null; done
batch_prio w 3 1 1 1 1 1 1 0 0 0 0 3 3 3 3
resume w
check "40 jobs drain" drain_queue w 60
read -r queued running succeeded failed cancelled <<<"$(counts w)"
check "all 40 succeeded" test "$succeeded" = 40
run_order w >"$WORK/order.w"
check "they ran by priority, then id, across the window" in_priority_order <"$WORK/order.w"

# Submitted while it drains: a higher priority overtakes the backlog.
pause w2
batch_prio w2 40 0 0 0 0 0 0 0 0 0 0 0 0
resume w2
sleep 0.05
batch_prio w2 3 5 5 5
check "late high-priority batch: 201" status_is 201
check "w2 drains" drain_queue w2 60
run_order w2 >"$WORK/order.w2"
check "the late high-priority jobs ran before the older low ones still queued" python3 -c '
import sys
rows = [tuple(map(int, l.split())) for l in open(sys.argv[1])]
hi = [i for i, r in enumerate(rows) if r[1] == 5]
# the few low jobs started before they arrived precede them, then they run
# one after the other, then the rest of the backlog
sys.exit(0 if len(hi) == 3 and hi[2] - hi[0] == 2 and hi[2] < len(rows) - 1 else 1)' "$WORK/order.w2"
check "low jobs kept their id order" python3 -c '
import sys
rows = [tuple(map(int, l.split())) for l in open(sys.argv[1])]
lo = [r[0] for r in rows if r[1] == 0]
sys.exit(0 if lo == sorted(lo) else 1)' "$WORK/order.w2"

# ---- delayed jobs beyond the window ----
now_ms=$(python3 -c 'import time; print(int(time.time()*1000))')
jobs=
for k in $(seq 1 12); do
    jobs="$jobs${jobs:+,}{\"queue\":\"d\",\"handler\":\"echo\",\"delay_ms\":$((1000 + k * 150)),\"priority\":$((k % 3))}"
done
json_post /v1/jobs/batch "{\"jobs\":[$jobs]}"
check "12 delayed jobs: 201" status_is 201
check "the delayed jobs all run" drain_queue d 30
req GET "/v1/jobs?queue=d&limit=100"
check "none started before its run_at, none more than 3 s late" python3 -c '
import json, sys
from datetime import datetime
t = lambda s: datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()
js = json.loads(sys.argv[1])["jobs"]
late = [t(j["started_at"]) - t(j["run_at"]) for j in js]
sys.exit(0 if len(js) == 12 and all(j["state"] == "succeeded" for j in js) and min(late) >= -0.002 and max(late) < 3 else 1)' "$BODY"

# ---- actions on jobs only in the store ----
pause a
batch_prio a 3 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
ids=$(python3 -c 'import json,sys; print(" ".join(str(j["id"]) for j in json.loads(sys.argv[1])["jobs"]))' "$BODY")
read -r -a A <<<"$ids"
req POST "/v1/jobs/${A[15]}/cancel"
check "cancel of a job past the window: cancelled" eval '[ "${STATUS:0:1}" = 2 ] && body_has "\"state\":\"cancelled\""'
req POST "/v1/jobs/${A[15]}/cancel"
check "cancelling it again: 409" is_problem 409
json_post "/v1/jobs/${A[16]}/messages" '{"topic":"t","data":1}'
check "a message to a job past the window: 2xx" eval '[ "${STATUS:0:1}" = 2 ]'
req DELETE "/v1/jobs/${A[17]}"
check "DELETE of a queued job past the window: 409" is_problem 409
req DELETE "/v1/jobs/${A[15]}"
check "DELETE of the cancelled one: 204" status_is 204
one a 0 '"unique":{"key":"win-u"}'
check "a unique job past the window: 201" status_is 201
uid=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["id"])' "$BODY")
one a 0 '"unique":{"key":"win-u","on_conflict":"reject"}'
check "reject: 409 naming the holder past the window" \
    eval 'is_problem 409 && body_has "\"existing_job_id\":\"$uid\""'
one a 0 '"unique":{"key":"win-u"}'
check "return_existing answers the holder past the window" body_has "\"id\":\"$uid\""
one a 0 '"unique":{"key":"win-u","on_conflict":"replace"}'
check "replace of the holder past the window: 201, a new job" \
    eval 'status_is 201 && ! body_has "\"id\":\"$uid\""'
req GET "/v1/jobs/$uid"
check "the replaced holder is cancelled" body_has '"state":"cancelled"'
one a 0 '"unique":{"key":"win-u","on_conflict":"reject"}'
check "the new job holds the key" is_problem 409
req GET "/v1/jobs/${A[18]}"
check "GET of a job past the window: queued" body_has '"state":"queued"'
resume a
check "queue a drains" drain_queue a 60
read -r queued running succeeded failed cancelled <<<"$(counts a)"
req GET /metrics
metric() { sed -n "s/^$1 //p" <<<"$BODY"; }
check "/metrics: jobs past the window were left to the store and paged back in" \
    eval '[ "$(metric jackdaw_window_jobs_out_total)" -gt 0 ] && [ "$(metric jackdaw_window_pages_total)" -gt 0 ] && [ "$(metric jackdaw_window_jobs_in_total)" -ge "$(metric jackdaw_window_jobs_out_total)" ]'
check "queue a: 20 succeeded, the replaced one cancelled (got $succeeded/$cancelled)" eval '[ "$succeeded" = 20 ] && [ "$cancelled" = 1 ]'

# A bulk cancel reaches every queued job, in memory or not.
pause b
batch_prio b 3 0 1 0 1 0 1 0 1 0 1
json_post /v1/jobs/cancel '{"queue":"b","state":"queued"}'
check "bulk cancel of a queue past its window: 202" status_is 202
op=$(printf '%s\n' "$HDRS" | sed -n 's|^[Ll]ocation: ||p' | tr -d '\r')
for _ in $(seq 1 100); do
    req GET "$op"
    body_has '"state":"running"' || break
    sleep 0.1
done
check "the operation applied to all 10" body_has '"applied":10'
read -r queued running succeeded failed cancelled <<<"$(counts b)"
check "queue b: 10 cancelled, none queued" eval '[ "$cancelled" = 10 ] && [ "$queued" = 0 ]'

# ---- a restart with a backlog, killed while it drains ----
pause r
for _ in 1 2 3 4; do
    batch_prio r 2 0 1 2 3 0 1 2 3 0 1 2 3 0 1 2 3 0 1 2 3 0 1 2 3 0 1 2 3 0 1 2 3 0 1 2 3 0 1 2 3 0 1 2 3 0 1 2 3 0 1
done
check "200 jobs queued in r" eval '[ "$(counts r | cut -d" " -f1)" = 200 ]'
stop_server KILL
start_server --queue-window 4 || exit 1
check "after a SIGKILL, 200 still queued" eval '[ "$(counts r | cut -d" " -f1)" = 200 ]'
resume r
sleep 0.4
stop_server KILL
start_server --queue-window 4 || exit 1
read -r queued running succeeded failed cancelled <<<"$(counts r)"
check "killed while draining: none lost ($queued queued, $running running, $succeeded done)" test $((queued + running + succeeded)) = 200
check "r drains after the restart" drain_queue r 60
read -r queued running succeeded failed cancelled <<<"$(counts r)"
check "all 200 succeeded, none failed or twice" eval '[ "$succeeded" = 200 ] && [ "$failed" = 0 ]'
req GET "/v1/jobs?queue=r&limit=1000"
check "each job ended once (one succeeded event, attempts 1)" python3 -c '
import json, sys
js = json.loads(sys.argv[1])["jobs"]
sys.exit(0 if len(js) == 200 and all(j["attempts"] == 1 for j in js) else 1)' "$BODY"

# ---- the same with every queued job in memory (--queue-window 0): recovery
# reads the queued, running and waiting jobs together, merged by id ----
put_queue nw '{"max_running":4}'
pause nw
batch_prio nw 50 $(for i in $(seq 0 39); do echo $((i % 4)); done)
batch_prio nw 50 $(for i in $(seq 0 39); do echo $((i % 4)); done)
stop_server KILL
start_server --queue-window 0 || exit 1
check "no window: after a SIGKILL, 80 still queued" eval '[ "$(counts nw | cut -d" " -f1)" = 80 ]'
resume nw
sleep 0.3
stop_server KILL
start_server --queue-window 0 || exit 1
read -r queued running succeeded failed cancelled <<<"$(counts nw)"
check "no window, killed while draining: none lost ($queued queued, $running running, $succeeded done)" test $((queued + running + succeeded)) = 80
check "some were still queued at the kill" test "$queued" -gt 0
check "nw drains after the restart" drain_queue nw 60
read -r queued running succeeded failed cancelled <<<"$(counts nw)"
check "all 80 succeeded, none failed" eval '[ "$succeeded" = 80 ] && [ "$failed" = 0 ]'
stop_server
finish
