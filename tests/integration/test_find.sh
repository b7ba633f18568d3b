#!/usr/bin/env bash
# Finding and acting on many jobs against the real server (issue 19):
# GET /v1/jobs by label, handler and creation time combined with state and
# queue, paging; the bounds on label filters and label values; bulk cancel
# of 10,000 queued jobs in a paused queue while new jobs arrive (every
# matching one ends cancelled, the new ones are untouched); bulk retry;
# nothing matching (200, 0); GET /v1/operations/{id}; DELETE of a finished
# job (and 409 for a live one); labels survive a restart. Prints TAP.
# shellcheck disable=SC2016,SC2034,SC2119
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

jq_n() { python3 -c 'import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1]))' "$1" <<<"$BODY"; }
ids_of() { python3 -c 'import json,sys; print(" ".join(j["id"] for j in json.load(sys.stdin)["jobs"]))' <<<"$BODY"; }

# A batch of $1 jobs in queue $2 with labels $3 (a JSON object), handler echo.
batch() {
    python3 - "$1" "$2" "$3" >"$WORK/batch.json" <<'EOF'
import json, sys
n, q, labels = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
print(json.dumps({"jobs": [{"handler": "echo", "args": {"i": i}, "queue": q, "labels": labels}
                           for i in range(n)]}))
EOF
    req POST /v1/jobs/batch -H 'Content-Type: application/json' --data-binary "@$WORK/batch.json"
}

# Poll operation $1 until it is no longer running (BODY is the operation).
wait_op() {
    for _ in $(seq 1 600); do
        req GET "/v1/operations/$1"
        body_has '"state":"running"' || return 0
        sleep 0.1
    done
    return 1
}

start_server || exit 1

# ---- the README's examples ----
JD=$BASE timeout 60 sh tests/integration/find_tour.sh >"$WORK/tour.out" 2>"$WORK/tour.err"
rc=$?
has() { grep -qF -- "$1" "$WORK/tour.out"; }
check "the find tour runs to the end (exit $rc)" eval '[ "$rc" = 0 ] && [ ! -s "$WORK/tour.err" ]'
check "the tour finds its job by two labels and handler" \
    eval 'has "{\"jobs\":[{\"id\":\"1\"" && has "\"labels\":{\"team\":\"billing\",\"tier\":\"gold\"}"'
check "the tour's bulk cancel ended with its job cancelled" \
    eval 'has "\"kind\":\"cancel\",\"state\":\"succeeded\",\"matched\":1,\"applied\":1"'
check "retry matching nothing: 200 with 0" has '"kind":"retry","state":"succeeded","matched":0'
check "delete answers 204" eval 'grep -qx 204 "$WORK/tour.out"'
readme_block() {
    sed -n '/^## Finding and acting on many jobs/,/^## /p' README.md | sed -n '/^```sh$/,/^```$/p' |
        sed '1d;$d'
}
check "the README quotes the tour verbatim" \
    diff <(readme_block) <(sed -n '/^JD=/,$p' tests/integration/find_tour.sh)

# ---- finding ----
json_post /v1/jobs '{"handler":"echo","args":{},"queue":"find","labels":{"team":"pay","tier":"gold"}}'
GOLD=$(location_id)
json_post /v1/jobs '{"handler":"echo","args":{},"queue":"find","labels":{"team":"pay","tier":"silver"}}'
SILVER=$(location_id)
json_post /v1/jobs '{"handler":"fail","args":{},"queue":"find","labels":{"team":"pay"}}'
FAILING=$(location_id)
json_post /v1/jobs '{"steps":[{"id":"a","call":"echo","args":{"handler":"echo"}}],"queue":"find","labels":{"team":"ops"}}'
FLOW=$(location_id)
wait_job "$GOLD" && wait_job "$SILVER" && wait_job "$FAILING" && wait_job "$FLOW"

req GET '/v1/jobs?label=team:pay'
check "label: every job with it, newest first" eval '[ "$(ids_of)" = "$FAILING $SILVER $GOLD" ]'
req GET '/v1/jobs?label=team:pay&label=tier:gold'
check "two labels: both must match" eval '[ "$(ids_of)" = "$GOLD" ]'
req GET '/v1/jobs?label=team:pay&handler=echo'
check "label and handler" eval '[ "$(ids_of)" = "$SILVER $GOLD" ]'
req GET '/v1/jobs?handler=echo&queue=find&state=succeeded'
check "handler, queue and state together" eval '[ "$(ids_of)" = "$SILVER $GOLD" ]'
req GET '/v1/jobs?label=team:pay&state=failed'
check "label and state" eval '[ "$(ids_of)" = "$FAILING" ]'
req GET '/v1/jobs?handler=echo&queue=find'
check "a workflow has no top-level handler" eval '! grep -qw "$FLOW" <<<"$(ids_of)"'
req GET '/v1/jobs?label=team:pay&limit=2'
CUR=$(jq_n 'd["next_cursor"]')
check "paging: a full page has a cursor" eval '[ "$(ids_of)" = "$FAILING $SILVER" ] && [ "$CUR" = "$SILVER" ]'
req GET "/v1/jobs?label=team:pay&limit=2&cursor=$CUR"
check "paging: the next page ends the list" eval '[ "$(ids_of)" = "$GOLD" ] && body_has "\"next_cursor\":null"'

NOW=$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ)
sleep 0.05
json_post /v1/jobs '{"handler":"echo","args":{},"queue":"find","labels":{"team":"late"}}'
LATE=$(location_id)
req GET "/v1/jobs?created_after=$NOW"
check "created_after: only jobs created since" eval '[ "$(ids_of)" = "$LATE" ]'
req GET "/v1/jobs?created_before=$NOW&queue=find"
check "created_before with queue" eval '[ "$(ids_of)" = "$FLOW $FAILING $SILVER $GOLD" ]'
req GET "/v1/jobs?created_before=$NOW&limit=1"
CUR=$(jq_n 'd["next_cursor"]')
req GET "/v1/jobs?created_before=$NOW&limit=1&cursor=$CUR"
check "creation-time paging goes on from its cursor" eval '[ "$(ids_of)" = "$FAILING" ]'

# ---- hostile filters and labels ----
req GET '/v1/jobs?label=nocolon'
check "label without a colon: 400" eval 'is_problem 400 && body_has "key:value"'
req GET "/v1/jobs?label=team:$(head -c 300 /dev/zero | tr '\0' x)"
check "label value over 256: 400" is_problem 400
req GET '/v1/jobs?label=a:1&label=b:1&label=c:1&label=d:1&label=e:1&label=f:1&label=g:1&label=h:1&label=i:1'
check "nine label filters: 400" eval 'is_problem 400 && body_has "at most 8"'
req GET '/v1/jobs?created_after=yesterday'
check "created_after not RFC 3339: 400" eval 'is_problem 400 && body_has "RFC 3339"'
req GET '/v1/jobs?created_after=2026-01-01T00:00:00Z&cursor=5'
check "a cursor of the other order: 400" is_problem 400
json_post /v1/jobs "{\"handler\":\"echo\",\"labels\":{\"k\":\"$(head -c 257 /dev/zero | tr '\0' v)\"}}"
check "a label value over 256 characters is refused at submit" \
    eval 'is_problem 422 && body_has "\"pointer\":\"/labels/k\""'

# ---- delete ----
req POST /v1/queues/held/pause
json_post /v1/jobs '{"handler":"echo","args":{},"queue":"held"}'
HELD=$(location_id)
req DELETE "/v1/jobs/$HELD"
check "DELETE of a queued job: 409" eval 'is_problem 409 && body_has "has not finished"'
req DELETE "/v1/jobs/$LATE"
[ "$STATUS" = 409 ] && { wait_job "$LATE"; req DELETE "/v1/jobs/$LATE"; }
check "DELETE of a finished job: 204" status_is 204
req GET "/v1/jobs/$LATE"
check "the deleted job is gone" is_problem 404
req DELETE "/v1/jobs/$LATE"
check "DELETE again: 404" is_problem 404
req GET '/v1/jobs?label=team:late'
check "its labels went with it" eval '[ -z "$(ids_of)" ]'

# ---- bulk: nothing, bad bodies ----
json_post /v1/jobs/cancel '{"label":"team:nobody"}'
check "a filter matching nothing: 200 with 0" \
    eval 'status_is 200 && body_has "\"matched\":0" && body_has "\"state\":\"succeeded\""'
json_post /v1/jobs/cancel '{}'
check "an empty filter is refused (it would cancel everything)" is_problem 422
json_post /v1/jobs/cancel '{"label":"team:x","colour":"red"}'
check "unknown filter member: 422 with its pointer" \
    eval 'is_problem 422 && body_has "\"pointer\":\"/colour\""'
json_post /v1/jobs/retry '{"label":["a:1","b:1","c:1","d:1","e:1","f:1","g:1","h:1","i:1"]}'
check "nine labels in a body: 422 at the ninth" \
    eval 'is_problem 422 && body_has "\"pointer\":\"/label/8\""'
json_post /v1/jobs/cancel '{"state":"bogus"}'
check "bad state in a body: 422 /state" eval 'is_problem 422 && body_has "\"pointer\":\"/state\""'
json_post /v1/jobs/cancel '{"label":'
check "malformed body: 400" is_problem 400
req GET /v1/operations/12345
check "unknown operation: 404" is_problem 404

# ---- bulk retry ----
req POST "/v1/jobs/retry" -H 'Content-Type: application/json' \
    --data-binary '{"label":"team:pay","queue":"find"}'
check "bulk retry answers 202 with the operation's Location" \
    eval 'status_is 202 && header_has "Location: /v1/operations/"'
OP=$(jq_n 'd["id"]')
wait_op "$OP"
check "retry: the failed one re-queued, the succeeded ones skipped" \
    eval 'body_has "\"state\":\"succeeded\"" && body_has "\"matched\":3" && body_has "\"applied\":1" && body_has "\"skipped\":2"'
wait_job "$FAILING"
check "the retried job ran again (attempt 2)" \
    eval 'body_has "\"attempts\":2" && body_has "\"state\":\"failed\""'

# ---- bulk cancel of 10,000 while new jobs arrive ----
req POST /v1/queues/bulk/pause
check "pause the queue" eval 'status_is 200 || status_is 202'
for _ in $(seq 1 10); do
    batch 1000 bulk '{"run":"one"}'
    [ "$STATUS" = 201 ] || break
done
check "10,000 jobs queued in the paused queue" status_is 201
json_post /v1/jobs/cancel '{"queue":"bulk","label":"run:one"}'
check "bulk cancel: 202" status_is 202
OP=$(jq_n 'd["id"]')
# new jobs while it runs: the same label (created after the start) and another
NEW_SAME=0
NEW_OTHER=0
for _ in $(seq 1 5); do
    batch 50 bulk '{"run":"one"}' && [ "$STATUS" = 201 ] && NEW_SAME=$((NEW_SAME + 50))
    batch 50 bulk '{"run":"two"}' && [ "$STATUS" = 201 ] && NEW_OTHER=$((NEW_OTHER + 50))
done
req GET "/v1/operations/$OP"
check "the operation shows progress" eval 'status_is 200 && body_has "\"kind\":\"cancel\""'
wait_op "$OP"
check "bulk cancel ends: 10,000 matched, 10,000 cancelled" \
    eval 'body_has "\"state\":\"succeeded\"" && body_has "\"matched\":10000" && body_has "\"applied\":10000" && body_has "\"failed\":0"'
echo "# bulk cancel of 10000: $(jq_n '(__import__("datetime").datetime.fromisoformat(d["finished_at"].replace("Z","+00:00")) - __import__("datetime").datetime.fromisoformat(d["created_at"].replace("Z","+00:00"))).total_seconds()') s"
req GET /metrics
check "/metrics: no bulk operation left running" body_has "jackdaw_bulk_operations_running 0"
req GET /v1/queues
COUNTS=$(python3 -c 'import json,sys
for q in json.load(sys.stdin)["queues"]:
    if q["name"] == "bulk": print(q["counts"].get("cancelled", 0), q["counts"].get("queued", 0))' <<<"$BODY")
check "every matching job is cancelled; the $((NEW_SAME + NEW_OTHER)) new ones are still queued" \
    eval '[ "$COUNTS" = "10000 $((NEW_SAME + NEW_OTHER))" ]'
req GET '/v1/jobs?label=run:two&state=queued&limit=1000'
check "the jobs the filter does not match are untouched" \
    eval '[ "$(jq_n "len(d[\"jobs\"])")" = "$NEW_OTHER" ]'

# ---- restart: labels and operations ----
stop_server
start_server || exit 1
req GET '/v1/jobs?label=team:pay&label=tier:gold'
check "labels are found after a restart" eval '[ "$(ids_of)" = "$GOLD" ]'
if [ "$(ids_of)" != "$GOLD" ]; then
    # seen once in ~30 runs, cause not found yet: say whether it is lasting
    sleep 1
    req GET '/v1/jobs?label=team:pay&label=tier:gold'
    echo "# the same query 1 s later: [$(ids_of)]; by one label: [$(req GET '/v1/jobs?label=team:pay' && ids_of)]"
    req GET "/v1/jobs/$GOLD"
    echo "# the job itself: status $STATUS"
fi
req GET "/v1/operations/$OP"
check "operations are not kept over a restart" is_problem 404
stop_server
finish
