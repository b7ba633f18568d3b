#!/usr/bin/env bash
# Queue controls (PUT /v1/queues/{q}) and --command-limit against the real
# server: max_running is never exceeded under a backlog, a rate limit holds
# (also across a SIGKILL and restart), retention per queue and state
# overrides --retention both ways, a limited command's calls wait without
# holding a worker, the controls survive a restart and show in /metrics,
# and bad bodies get problem+json with a pointer.
#
# Behaviour is read from what the server recorded (job and event times), so
# a slow machine makes the test slower, not flaky.
# shellcheck disable=SC2016,SC2034
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

put_queue() { req PUT "/v1/queues/$1" -H 'Content-Type: application/json' --data-binary "$2"; }
# Submit n copies of a job definition in one batch (one commit).
batch() {
    local n=$1 def=$2 jobs=
    for _ in $(seq 1 "$n"); do jobs="$jobs${jobs:+,}$def"; done
    json_post /v1/jobs/batch "{\"jobs\":[$jobs]}"
}
# Wait until no job of queue $1 is queued, running or waiting (up to $2 s).
drain_queue() {
    for _ in $(seq 1 $(($2 * 10))); do
        req GET "/v1/queues/$1"
        python3 -c 'import json,sys; c=json.loads(sys.argv[1])["counts"]; sys.exit(0 if c["queued"]+c["running"]+c["waiting"]==0 else 1)' "$BODY" && return 0
        sleep 0.1
    done
    return 1
}
# The most intervals open at once, from stdin: one "start end" pair of
# RFC 3339 times per line (an end at the same ms as a start closes first).
peak() {
    python3 -c '
import sys
from datetime import datetime
t = lambda s: datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()
ev = []
for line in sys.stdin:
    a, b = line.split()
    ev += [(t(a), 1), (t(b), -1)]
ev.sort()
cur = best = 0
for _, d in ev:
    cur += d
    best = max(best, cur)
print(best)'
}
# Most jobs of queue $1 whose [started_at, finished_at) overlap.
max_overlap() {
    req GET "/v1/jobs?queue=$1&limit=1000"
    python3 -c 'import json,sys
for j in json.loads(sys.argv[1])["jobs"]: print(j["started_at"], j["finished_at"])' "$BODY" | peak
}
# The started_at of queue $1's jobs conform to a token bucket of $2 per $3 ms
# that starts full (10 ms of slack for the gap between admitting and
# stamping a start).
rate_conforms() {
    req GET "/v1/jobs?queue=$1&limit=1000"
    python3 - "$BODY" "$2" "$3" <<'EOF'
import json, sys
from datetime import datetime
t = lambda s: datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp() * 1000
starts = sorted(t(j["started_at"]) for j in json.loads(sys.argv[1])["jobs"])
n, per = int(sys.argv[2]), float(sys.argv[3])
tokens, prev = float(n), starts[0]
for s in starts:
    tokens = min(n, tokens + (s - prev) * n / per)
    prev = s
    if tokens < 1 - 10 * n / per:
        print("start at", s - starts[0], "ms found", round(tokens, 3), "tokens")
        sys.exit(1)
    tokens -= 1
EOF
}

start_server --command-limit sleep=2 || exit 1

# ---- the README's examples ----
JD=$BASE timeout 60 sh tests/integration/queues_tour.sh >"$WORK/tour.out" 2>"$WORK/tour.err"
rc=$?
has() { grep -qF -- "$1" "$WORK/tour.out"; }
check "the queue controls tour runs to the end (exit $rc)" eval '[ "$rc" = 0 ] && [ ! -s "$WORK/tour.err" ]'
check "PUT answers with the controls" \
    has '"max_running":2,"rate":{"limit":10,"per":"1s"},"retention":{"succeeded":"1d","failed":"30d"}'
check "GET shows them with the live numbers" eval 'has "\"active\":" && has "\"rate_available\":"'
check "a second PUT replaces the set" has '"max_running":5,"rate":null,"retention":null'
check "out of range: 422 with a pointer" has '"pointer":"/rate/limit"'
check "a unique job: 201, then 200 with it" eval 'has "\"unique\":{\"key\":\"user-42-sync\"}" && grep -qx 200 "$WORK/tour.out"'
check "reject: 409 naming it" has '"existing_job_id":'
readme_block() { sed -n '/^## Queue controls/,/^## /p' README.md | sed -n '/^```sh$/,/^```$/p' | sed '1d;$d'; }
check "the README quotes the tour verbatim" \
    diff <(readme_block) <(sed -n '/^JD=/,$p' tests/integration/queues_tour.sh)

# ---- bad bodies ----
bad() { # name body pointer
    put_queue q "$2"
    local want="\"pointer\":\"$3\""
    [ -n "$3" ] || want='"status":422'
    check "$1: 422 at $3" eval 'is_problem 422 && body_has "$want"'
}
put_queue q '{"max_running":'
check "malformed JSON: 400" is_problem 400
bad "not an object" '[1]' ''
bad "max_running 0" '{"max_running":0}' /max_running
bad "max_running negative" '{"max_running":-3}' /max_running
bad "max_running fractional" '{"max_running":1.5}' /max_running
bad "max_running huge" '{"max_running":1e300}' /max_running
bad "max_running as a string" '{"max_running":"5"}' /max_running
bad "unknown field" '{"max_runing":5}' /max_runing
bad "rate not an object" '{"rate":5}' /rate
bad "rate without per" '{"rate":{"limit":5}}' /rate/per
bad "rate limit 0" '{"rate":{"limit":0,"per":"1s"}}' /rate/limit
bad "rate limit beyond a million" '{"rate":{"limit":1000001,"per":"1s"}}' /rate/limit
bad "rate per not a duration" '{"rate":{"limit":1,"per":"soon"}}' /rate/per
bad "rate per negative" '{"rate":{"limit":1,"per":"-1s"}}' /rate/per
bad "rate per below a millisecond" '{"rate":{"limit":1,"per":"0.1ms"}}' /rate/per
bad "rate per over a day" '{"rate":{"limit":1,"per":"2d"}}' /rate/per
bad "rate per overflowing" '{"rate":{"limit":1,"per":"99999999999999d"}}' /rate/per
bad "rate unknown field" '{"rate":{"limit":1,"per":"1s","burst":3}}' /rate/burst
bad "retention unknown state" '{"retention":{"running":"1d"}}' /retention/running
bad "retention under a second" '{"retention":{"failed":"10ms"}}' /retention/failed
bad "retention a number" '{"retention":{"failed":86400}}' /retention/failed
req PUT "/v1/queues/$(printf 'x%.0s' $(seq 1 65))" -H 'Content-Type: application/json' --data-binary '{}'
check "a queue name over 64 characters: 404" is_problem 404
req PUT "/v1/queues/a%20b" -H 'Content-Type: application/json' --data-binary '{}'
check "a queue name with a space: 404" is_problem 404
req GET /v1/queues/nosuch
check "GET a queue never used: 200, zero counts, no controls" \
    eval 'status_is 200 && body_has "\"queued\":0" && body_has "\"max_running\":null"'
req GET /v1/queues/q
check "a refused PUT left nothing behind" eval 'status_is 200 && body_has "\"max_running\":null,\"rate\":null,\"retention\":null"'

# ---- max_running ----
put_queue capped '{"max_running":2}'
check "PUT max_running: 200 with it" eval 'status_is 200 && body_has "\"max_running\":2" && body_has "\"rate\":null"'
batch 10 '{"handler":"sleep","args":{"ms":150},"queue":"capped"}'
check "10 jobs submitted to the capped queue" status_is 201
req GET /metrics
check "/metrics shows the cap" body_has 'jackdaw_queue_max_running{queue="capped"} 2'
check "and at most 2 of the queue active" eval 'grep -Eq "^jackdaw_queue_active\{queue=\"capped\"\} [012]$" <<<"$BODY"'
batch 6 '{"handler":"sleep","args":{"ms":400},"queue":"free"}'
check "drains" drain_queue capped 60
check "never more than 2 of the capped queue ran at once" eval '[ "$(max_overlap capped)" = 2 ]'
check "a queue without a cap is not held to it" drain_queue free 60
check "its jobs ran more than 2 at once" eval '[ "$(max_overlap free)" -gt 2 ]'

# ---- command limit: calls wait in order without holding a worker ----
batch 6 '{"handler":"sleep","args":{"ms":300},"queue":"cmd"}'
req GET /metrics
check "/metrics: the command's limit" body_has 'jackdaw_command_limit{command="sleep"} 2'
check "/metrics: calls beyond it wait" eval 'grep -Eq "^jackdaw_command_waiting\{command=\"sleep\"\} [1-4]$" <<<"$BODY"'
json_post /v1/jobs '{"handler":"echo","args":{"x":1},"queue":"cmd2"}'
echo_id=$(location_id)
wait_job "$echo_id" 10s
check "another command runs while sleep calls wait" body_has '"state":"succeeded"'
req GET /v1/queues/cmd
check "the sleep jobs are still at it then" eval 'body_has "\"succeeded\":" && ! body_has "\"succeeded\":6"'
check "the waiting calls all ran" drain_queue cmd 60
# Most sleep calls in flight at once, by each job's dispatch and complete
# events (one call per job).
calls_overlap() {
    req GET "/v1/jobs?queue=cmd&limit=100"
    local id
    for id in $(python3 -c 'import json,sys; print(" ".join(j["id"] for j in json.loads(sys.argv[1])["jobs"]))' "$BODY"); do
        req GET "/v1/jobs/$id/events"
        python3 -c 'import json,sys
e = {x["kind"]: x["time"] for x in json.loads(sys.argv[1])["events"]}
print(e["dispatch"], e["complete"])' "$BODY"
    done | peak
}
check "never more than 2 sleep calls at once" eval '[ "$(calls_overlap)" = 2 ]'
req GET /metrics
check "no call left waiting" body_has 'jackdaw_command_waiting{command="sleep"} 0'

# A job cancelled while its call waits ends without the call ever running.
batch 3 '{"handler":"sleep","args":{"ms":2500},"queue":"cmdc"}'
sleep 0.5
waiting_id=
req GET "/v1/jobs?queue=cmdc&limit=10"
for id in $(python3 -c 'import json,sys; print(" ".join(j["id"] for j in json.loads(sys.argv[1])["jobs"]))' "$BODY"); do
    req GET "/v1/jobs/$id/events"
    body_has '"kind":"dispatch"' || waiting_id=$id
done
check "with 2 places one of 3 sleep calls waits" eval '[ -n "$waiting_id" ]'
req POST "/v1/jobs/$waiting_id/cancel"
wait_job "$waiting_id" 10s
check "cancelling it ends the job cancelled" body_has '"state":"cancelled"'
req GET "/v1/jobs/$waiting_id/events"
check "its call was never dispatched" eval '! body_has "\"kind\":\"dispatch\""'
req GET /metrics
check "and it left the line" body_has 'jackdaw_command_waiting{command="sleep"} 0'

# ---- rate ----
put_queue rl '{"rate":{"limit":2,"per":"2s"}}'
check "PUT rate: 200 with it" eval 'status_is 200 && body_has "\"rate\":{\"limit\":2,\"per\":\"2s\"}"'
batch 6 '{"handler":"echo","args":{"x":1},"queue":"rl"}'
req GET /v1/queues/rl
check "jobs beyond the burst wait queued" eval 'body_has "\"queued\":" && ! body_has "\"queued\":0"'
check "the rate-limited queue drains" drain_queue rl 60
check "its starts conform to 2 per 2 s" rate_conforms rl 2 2000
req GET /metrics
check "/metrics: the rate" body_has 'jackdaw_queue_rate_limit_per_second{queue="rl"} 1'

# A rate over a crash: two starts, SIGKILL, restart, two more.
put_queue rr '{"rate":{"limit":2,"per":"3s"}}'
batch 2 '{"handler":"echo","args":{"x":1},"queue":"rr"}'
drain_queue rr 20
stop_server KILL
start_server --command-limit sleep=2 || exit 1
batch 2 '{"handler":"echo","args":{"x":2},"queue":"rr"}'
check "after the restart the queue drains" drain_queue rr 30
check "starts conform to 2 per 3 s across the restart" rate_conforms rr 2 3000

# ---- controls are durable ----
req GET /v1/queues/capped
check "max_running survived the restart" body_has '"max_running":2'
req GET /v1/queues
check "GET /v1/queues lists the controls" eval 'body_has "\"name\":\"rl\"" && body_has "\"per\":\"2s\""'
put_queue capped '{}'
check "PUT {} clears them" eval 'status_is 200 && body_has "\"max_running\":null"'

# ---- retention per queue and state ----
# No --retention (keep forever): a queue's own shorter one still applies.
put_queue short '{"retention":{"succeeded":"1s"}}'
json_post /v1/jobs '{"handler":"echo","args":{"x":1},"queue":"short"}'
short_ok=$(location_id)
json_post /v1/jobs '{"handler":"fail","args":{},"queue":"short"}'
short_failed=$(location_id)
json_post /v1/jobs '{"handler":"echo","args":{"x":1}}'
default_ok=$(location_id)
wait_job "$short_ok"
wait_job "$short_failed"
wait_job "$default_ok"
gone() {
    for _ in $(seq 1 100); do
        req GET "/v1/jobs/$1"
        status_is 404 && return 0
        sleep 0.1
    done
    return 1
}
check "a succeeded job of a queue with 1s retention goes" gone "$short_ok"
req GET "/v1/jobs/$short_failed"
check "its failed job (no retention for failed) stays" status_is 200
req GET "/v1/jobs/$default_ok"
check "a job of another queue stays" status_is 200

# --retention 1s, and a queue that keeps its succeeded jobs a day.
stop_server
start_server --retention 1s || exit 1
put_queue keep '{"retention":{"succeeded":"1d"}}'
json_post /v1/jobs '{"handler":"echo","args":{"x":1},"queue":"keep"}'
keep_ok=$(location_id)
json_post /v1/jobs '{"handler":"fail","args":{},"queue":"keep"}'
keep_failed=$(location_id)
wait_job "$keep_ok"
wait_job "$keep_failed"
check "with --retention 1s the queue's failed job goes" gone "$keep_failed"
check "and so does the earlier default-queue job" gone "$default_ok"
req GET "/v1/jobs/$keep_ok"
check "its succeeded job (kept a day) stays" status_is 200

# ---- a bad --command-limit stops the start with a clear message ----
stop_server
for spec in "http=0" "http=5,http=6" "=3" "http=5x" "http=99999999999"; do
    timeout 20 "$JACKDAWD" --listen 127.0.0.1:0 --db "$DB" --plugin-dir "$BUILD/plugins" \
        --command-limit "$spec" >/dev/null 2>"$WORK/bad.log"
    rc=$?
    check "--command-limit $spec: refused at start (exit $rc)" \
        eval '[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -q -- "--command-limit" "$WORK/bad.log"'
done

finish
