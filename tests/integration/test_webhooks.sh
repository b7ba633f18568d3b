#!/usr/bin/env bash
# Completion webhooks against the real server and a python3 http.server
# receiver that checks the HMAC-SHA256 signature (issue 19): a signed POST
# when a job ends in a state it asked for, none otherwise, retried with
# backoff after a 5xx, not after a 4xx, each attempt in the job's history;
# bad "notify" members and --http-allow refused at submit with pointers.
# Prints TAP.
# shellcheck disable=SC2016,SC2034,SC2119
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

SECRET=s3cr3t-for-tests
python3 tests/integration/webhook_receiver.py "$SECRET" "$WORK/port" "$WORK/hooks.log" &
RECV_PID=$!
trap 'kill "$RECV_PID" 2>/dev/null; cleanup' EXIT
for _ in $(seq 1 100); do [ -s "$WORK/port" ] && break; sleep 0.05; done
HOOK=http://127.0.0.1:$(cat "$WORK/port")
: >>"$WORK/hooks.log"

# the receiver's log lines for path $1
hooks() { grep -F "\"path\": \"$1\"" "$WORK/hooks.log"; }
# wait until path $1 got $2 requests
wait_hooks() {
    for _ in $(seq 1 150); do
        [ "$(hooks "$1" | grep -c .)" -ge "$2" ] && return 0
        sleep 0.1
    done
    return 1
}
# wait until job $1's history has a notify completion; BODY is the history
wait_notified() {
    for _ in $(seq 1 150); do
        req GET "/v1/jobs/$1/events"
        body_has '"notify":true' && return 0
        sleep 0.1
    done
    return 1
}

start_server --webhook-secret "$SECRET" || exit 1

json_post /v1/jobs "{\"handler\":\"echo\",\"args\":{\"x\":1},\"notify\":{\"url\":\"$HOOK/ok\"}}"
OK=$(location_id)
wait_job "$OK"
wait_hooks /ok 1
check "a finished job POSTs its webhook, signed with --webhook-secret" \
    eval 'grep -q "\"sig_ok\": true, \"event\": \"job.succeeded\", \"job_id\": \"$OK\", \"body_event\": \"job.succeeded\", \"body_job\": \"$OK\", \"ctype\": \"application/json\"" <<<"$(hooks /ok)"'
wait_notified "$OK"
check "the attempt and its outcome are in the job's history" \
    eval 'body_has "\"kind\":\"dispatch\",\"tag\":0,\"data\":{\"command\":\"notify\",\"attempt\":1,\"url\":\"$HOOK/ok\"}" && body_has "\"notify\":true,\"attempt\":1,\"result\":{\"status\":200}"'

json_post /v1/jobs "{\"handler\":\"fail\",\"args\":{},\"notify\":{\"url\":\"$HOOK/flaky\",\"on\":[\"failed\"]}}"
FL=$(location_id)
wait_job "$FL"
wait_hooks /flaky 2
check "a 5xx answer is retried with backoff (2 requests, both signed)" \
    eval '[ "$(hooks /flaky | grep -c "\"sig_ok\": true, \"event\": \"job.failed\"")" = 2 ]'
wait_notified "$FL"
check "both attempts recorded, then success" \
    eval 'body_has "\"command\":\"notify\",\"attempt\":2" && body_has "\"notify\":true,\"attempt\":2,\"result\":{\"status\":200}"'

json_post /v1/jobs "{\"handler\":\"fail\",\"args\":{},\"notify\":{\"url\":\"$HOOK/bad\"}}"
BAD=$(location_id)
wait_job "$BAD"
wait_notified "$BAD"
check "a 4xx answer is final: one attempt, its error recorded" \
    eval 'body_has "\"notify\":true,\"attempt\":1,\"error\":{\"kind\":\"http_status\"" && [ "$(hooks /bad | grep -c .)" = 1 ]'

json_post /v1/jobs "{\"handler\":\"echo\",\"args\":{},\"notify\":{\"url\":\"$HOOK/never\",\"on\":[\"failed\",\"cancelled\"]}}"
NEVER=$(location_id)
wait_job "$NEVER"
sleep 0.5
check "no webhook for an end state the job did not ask for" \
    eval '[ -z "$(hooks /never)" ] && req GET "/v1/jobs/$NEVER/events" && ! body_has "notify"'

req GET /metrics
check "/metrics counts attempts (4) and outcomes (2 delivered, 1 failed)" \
    eval 'body_has "jackdaw_webhook_attempts_total 4" && body_has "jackdaw_webhooks_total{outcome=\"delivered\"} 2" && body_has "jackdaw_webhooks_total{outcome=\"failed\"} 1"'

json_post /v1/jobs '{"handler":"echo","notify":{"url":"ftp://example.com/x"}}'
check "a non-http url: 422 /notify/url" eval 'is_problem 422 && body_has "\"pointer\":\"/notify/url\""'
json_post /v1/jobs "{\"handler\":\"echo\",\"notify\":{\"url\":\"$HOOK/x\",\"on\":[\"running\"]}}"
check "on: only end states, 422 /notify/on/0" eval 'is_problem 422 && body_has "\"pointer\":\"/notify/on/0\""'
json_post /v1/jobs "{\"handler\":\"echo\",\"notify\":{\"url\":\"$HOOK/x\",\"secret\":\"s\"}}"
check "unknown notify member: 422 /notify/secret" eval 'is_problem 422 && body_has "\"pointer\":\"/notify/secret\""'
json_post /v1/jobs "{\"handler\":\"echo\",\"notify\":\"$HOOK/x\"}"
check "notify must be an object: 422 /notify" eval 'is_problem 422 && body_has "\"pointer\":\"/notify\""'
json_post /v1/jobs "{\"handler\":\"echo\",\"notify\":{\"url\":\"http://a/$(head -c 2100 /dev/zero | tr '\0' a)\"}}"
check "a url over 2048 characters: 422" eval 'is_problem 422 && body_has "\"pointer\":\"/notify/url\""'

stop_server
start_server --http-allow example.com:80 || exit 1
json_post /v1/jobs "{\"handler\":\"echo\",\"notify\":{\"url\":\"$HOOK/ok\"}}"
check "--http-allow applies to webhooks: a host it does not list is 422 at submit" \
    eval 'is_problem 422 && body_has "\"pointer\":\"/notify/url\""'
stop_server
finish
