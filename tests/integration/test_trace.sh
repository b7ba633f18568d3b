#!/usr/bin/env bash
# W3C trace context against the real server (issue 19): a valid
# traceparent header on submit is stored on the job, sent on its http calls
# (header) and exec calls (TRACEPARENT), and shown in GET /v1/events; an
# invalid header is ignored (as the spec asks); an invalid "traceparent"
# member in the body is 422; the header is not part of the Idempotency-Key
# fingerprint; a remote command's claimed task carries the job's
# traceparent (and none when the job has none, even after a restart); the
# header on POST /v1/jobs/batch applies to each job that has none of its
# own. Prints TAP.
# shellcheck disable=SC2016,SC2034,SC2119
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

python3 tests/integration/webhook_receiver.py unused "$WORK/port" "$WORK/hooks.log" &
RECV_PID=$!
trap 'kill "$RECV_PID" 2>/dev/null; cleanup' EXIT
for _ in $(seq 1 100); do [ -s "$WORK/port" ] && break; sleep 0.05; done
HOOK=http://127.0.0.1:$(cat "$WORK/port")
: >>"$WORK/hooks.log"

TP=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
submit() { req POST /v1/jobs -H 'Content-Type: application/json' --data-binary "$1" "${@:2}"; }
stored_tp() { python3 -c 'import json,sys; print(json.load(sys.stdin)["definition"].get("traceparent",""))' <<<"$BODY"; }

start_server --exec-allow /usr/bin/env || exit 1

submit "{\"handler\":\"http\",\"args\":{\"url\":\"$HOOK/traced\",\"method\":\"POST\",\"body\":{}}}" \
    -H "traceparent: $TP"
H=$(location_id)
check "a valid traceparent header is stored on the job" eval 'status_is 201 && [ "$(stored_tp)" = "$TP" ]'
wait_job "$H"
check "the http call carries it as the traceparent header" \
    eval 'grep -qF "\"traceparent\": \"$TP\"" <<<"$(grep -F "\"path\": \"/traced\"" "$WORK/hooks.log")"'

submit '{"handler":"exec","args":{"argv":["/usr/bin/env"]}}' -H "traceparent: $TP"
E=$(location_id)
wait_job "$E"
check "the exec call gets TRACEPARENT in its environment" body_has "TRACEPARENT=$TP"

req GET '/v1/events?after=0&state=succeeded'
check "GET /v1/events shows the job's traceparent" \
    eval 'body_has "\"job_id\":\"$E\"" && body_has "\"traceparent\":\"$TP\""'

for bad in 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7 \
    ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 \
    00-00000000000000000000000000000000-00f067aa0ba902b7-01 \
    00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01 \
    00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra; do
    submit '{"handler":"echo","args":{}}' -H "traceparent: $bad"
    check "an invalid traceparent header is ignored: ${bad:0:12}..." \
        eval 'status_is 201 && [ -z "$(stored_tp)" ]'
done
FUTURE=01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future
submit '{"handler":"echo","args":{}}' -H "traceparent: $FUTURE"
check "a later version's extra fields are accepted" eval '[ "$(stored_tp)" = "$FUTURE" ]'

submit '{"handler":"echo","args":{},"traceparent":"nope"}'
check "an invalid traceparent member in the body: 422 /traceparent" \
    eval 'is_problem 422 && body_has "\"pointer\":\"/traceparent\""'
submit "{\"handler\":\"echo\",\"args\":{},\"traceparent\":\"$TP\"}" \
    -H 'traceparent: 00-11111111111111111111111111111111-2222222222222222-01'
check "the body's own traceparent wins over the header" eval '[ "$(stored_tp)" = "$TP" ]'

submit '{"handler":"echo","args":{"k":1}}' -H 'Idempotency-Key: trace-1' -H "traceparent: $TP"
FIRST=$(location_id)
submit '{"handler":"echo","args":{"k":1}}' -H 'Idempotency-Key: trace-1' \
    -H 'traceparent: 00-11111111111111111111111111111111-2222222222222222-01'
check "a retried request with a new trace is the same request (Idempotent-Replayed)" \
    eval 'status_is 201 && header_has "Idempotent-Replayed: true" && [ "$(location_id)" = "$FIRST" ]'

# remote commands: the claimed task carries the job's traceparent, unchanged
claim_tp() {
    req POST /v1/tasks/claim -H 'Content-Type: application/json' \
        --data-binary '{"commands":["traced"],"max":1,"lease_ms":30000}'
    python3 -c 'import json,sys; t=json.load(sys.stdin)["tasks"]; print(t[0]["job_id"], t[0].get("traceparent", "-"), t[0]["id"]) if t else print("none")' <<<"$BODY"
}
req PUT /v1/commands/traced -H 'Content-Type: application/json' --data-binary '{}'
submit '{"handler":"traced","args":{}}' -H "traceparent: $TP"
R1=$(location_id)
read -r JID GOT T1 <<<"$(claim_tp)"
check "a claimed task carries its job's traceparent" eval '[ "$JID" = "$R1" ] && [ "$GOT" = "$TP" ]'
submit '{"handler":"traced","args":{}}'
R2=$(location_id)
read -r JID GOT T2 <<<"$(claim_tp)"
check "a task whose job has no traceparent has no traceparent member" \
    eval '[ "$JID" = "$R2" ] && [ "$GOT" = "-" ] && ! body_has traceparent'
req POST "/v1/tasks/$T2/complete" -H 'Content-Type: application/json' --data-binary '{"result":1}'

# after a restart the claimed task is offered again (attempt + 1): still traced
stop_server
start_server --exec-allow /usr/bin/env || exit 1
read -r JID GOT T1 <<<"$(claim_tp)"
check "after a restart the task offered again still carries the traceparent" \
    eval '[ "$JID" = "$R1" ] && [ "$GOT" = "$TP" ]'
req POST "/v1/tasks/$T1/complete" -H 'Content-Type: application/json' --data-binary '{"result":1}'

# batch: the header applies to each job without a traceparent of its own
OWN=00-11111111111111111111111111111111-2222222222222222-01
req POST /v1/jobs/batch -H 'Content-Type: application/json' -H "traceparent: $TP" --data-binary \
    "{\"jobs\":[{\"handler\":\"echo\",\"args\":{}},{\"handler\":\"echo\",\"args\":{},\"traceparent\":\"$OWN\"}]}"
batch_tps() { python3 -c 'import json,sys; print(" ".join(j["definition"].get("traceparent","-") for j in json.load(sys.stdin)["jobs"]))' <<<"$BODY"; }
check "batch: the header is stored on a job without its own, a job's own wins" \
    eval 'status_is 201 && [ "$(batch_tps)" = "$TP $OWN" ]'
req POST /v1/jobs/batch -H 'Content-Type: application/json' -H 'traceparent: nope' \
    --data-binary '{"jobs":[{"handler":"echo","args":{}}]}'
check "batch: an invalid header is ignored" eval 'status_is 201 && [ "$(batch_tps)" = "-" ]'
req POST /v1/jobs/batch -H 'Content-Type: application/json' --data-binary \
    '{"jobs":[{"handler":"echo","args":{}},{"handler":"echo","args":{},"traceparent":"nope"}]}'
check "batch: an invalid traceparent member is 422 at /jobs/1/traceparent" \
    eval 'is_problem 422 && body_has "\"pointer\":\"/jobs/1/traceparent\""'
# the README's example, run as it is: the header lands on the job
sed -n '/^## Trace context/,/^## /p' README.md | sed -n '/^```sh$/,/^```$/p' | sed '1d;$d' \
    >"$WORK/readme_trace.sh"
JD=$BASE H='Content-Type: application/json' timeout 10 sh "$WORK/readme_trace.sh" \
    >"$WORK/readme_trace.out" 2>&1
check "the README's example runs: the job stores the header's traceparent" \
    eval '[ -s "$WORK/readme_trace.sh" ] && grep -q "\"traceparent\":\"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\"" "$WORK/readme_trace.out"'
stop_server

finish
