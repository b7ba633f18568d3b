#!/usr/bin/env bash
# Every route of api/openapi.yaml against the real server: statuses and
# bodies users rely on, a job of each shape (task, workflow, plugin process
# type, exec) reaching its terminal state with the right output, long-poll
# woken by completion, an SSE client receiving events live, idempotency,
# pagination, queues, batch, and every route listed in /v1/openapi.yaml
# answering. Prints TAP.
# shellcheck disable=SC2016,SC2034,SC2119 # conditions are single-quoted for eval
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

start_server --exec-allow /bin/echo --max-body 64k --heartbeat 200ms || exit 1

# ---- health, metrics, spec ----
req GET /livez
check "livez 200 with a JSON body ending in a newline" eval 'status_is 200 && [ "$BODY" = "{\"status\":\"ok\"}" ] && body_ends_with_newline'
req GET /readyz
check "readyz 200 when ready" status_is 200
# libmicrohttpd's per-connection pool is 16 KiB (api/http.c): 12 KB of
# headers still fit; a header block over the pool is a 431, not a crash.
req GET /livez -H "X-Big: $(head -c 12000 /dev/zero | tr '\0' a)"
check "12 KB of request headers are taken" status_is 200
req GET /livez -H "X-Big: $(head -c 40000 /dev/zero | tr '\0' a)"
check "40 KB of request headers are a 431" status_is 431
req GET /livez
check "and the server still answers" status_is 200
req GET /v1/openapi.yaml
check "openapi.yaml is the file in the repository" eval 'status_is 200 && [ "$BODY" = "$(cat api/openapi.yaml)" ]'
req GET /livez -H 'X-Request-Id: it-req-42'
check "X-Request-Id echoed" header_has "X-Request-Id: it-req-42"
req GET /livez
check "X-Request-Id generated when absent" eval 'header_has "X-Request-Id: " && ! header_has "X-Request-Id: it-req-42"'
req HEAD /livez --head
check "HEAD on a GET route" status_is 200

# ---- one job of each shape ----
json_post /v1/jobs '{"handler":"echo","args":{"v":1},"labels":{"team":"a"}}'
check "task: 201" status_is 201
check "task: Location header" header_has "Location: /v1/jobs/"
check "task: response body ends with a newline" body_ends_with_newline
TASK=$(location_id)
check "task: body is the queued job" body_has "\"id\":\"$TASK\""
wait_job "$TASK"
check "task: succeeded with the handler's output" eval 'body_has "\"state\":\"succeeded\"" && body_has "\"output\":{\"v\":1}" && body_has "\"labels\":{\"team\":\"a\"}"'
check "task: ETag is the version" header_has 'ETag: "'

json_post /v1/jobs '{"steps":[{"id":"one","call":"echo","args":{"to":"${input.name}"}},{"id":"both","parallel":[{"id":"a","call":"echo","args":{"prev":"${steps.one.output.to}"}},{"id":"b","sleep_ms":20}]}],"input":{"name":"ada"}}'
WF=$(location_id)
wait_job "$WF"
check "workflow: succeeded with substituted outputs" eval 'body_has "\"state\":\"succeeded\"" && body_has "\"one\":{\"to\":\"ada\"}" && body_has "\"prev\":\"ada\""'

json_post /v1/jobs '{"process":"counter","method":"count_to","input":{"n":3}}'
PT=$(location_id)
wait_job "$PT"
check "process type: succeeded with its result" eval 'body_has "\"state\":\"succeeded\"" && body_has "\"output\":{\"count\":3}"'

json_post /v1/jobs '{"handler":"exec","args":{"argv":["/bin/echo","hi there"]}}'
EX=$(location_id)
wait_job "$EX"
check "exec: succeeded with stdout" eval 'body_has "\"state\":\"succeeded\"" && body_has "\"stdout\":\"hi there\\n\""'

json_post /v1/jobs '{"handler":"fail","args":{}}'
FAILJ=$(location_id)
wait_job "$FAILJ"
check "failing job: failed with an error" eval 'body_has "\"state\":\"failed\"" && body_has "\"error\":{"'
req POST "/v1/jobs/$FAILJ/retry"
check "retry a failed job: 202" status_is 202
req POST "/v1/jobs/$TASK/retry"
check "retry a succeeded job: 409" is_problem 409

# ---- long-poll woken by completion ----
json_post /v1/jobs '{"handler":"sleep","args":{"ms":700}}'
SL=$(location_id)
t0=$(date +%s%N)
wait_job "$SL" 20s
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
check "long-poll returns when the job finishes (${ms} ms)" eval 'body_has "\"state\":\"succeeded\"" && [ "$ms" -ge 400 ] && [ "$ms" -lt 8000 ]'
json_post /v1/jobs '{"handler":"sleep","args":{"ms":3000}}'
SL2=$(location_id)
t0=$(date +%s%N)
req GET "/v1/jobs/$SL2?wait=300ms"
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
check "long-poll times out with the current state (${ms} ms)" eval 'status_is 200 && ! body_has "\"state\":\"succeeded\"" && [ "$ms" -ge 250 ] && [ "$ms" -lt 3000 ]'
# A long-poll woken by the job's end is answered from the commit, without
# reading the job back: byte for byte what a read gives, ETag included.
same_as_read() {
    json_post /v1/jobs "$1"
    local id body etag
    id=$(location_id)
    wait_job "$id" 20s
    body=$BODY
    etag=$(printf '%s\n' "$HDRS" | grep -i '^etag:')
    req GET "/v1/jobs/$id"
    [ -n "$etag" ] && [ "$body" = "$BODY" ] && [ "$etag" = "$(printf '%s\n' "$HDRS" | grep -i '^etag:')" ] &&
        grep -qE '"state":"(succeeded|failed)"' <<<"$body"
}
check "long-poll answer = a read: a task" \
    same_as_read '{"handler":"sleep","args":{"ms":300},"labels":{"team":"lp"},"priority":3,"queue":"lp"}'
check "long-poll answer = a read: a failing task" same_as_read '{"handler":"fail","args":{"sleep":1}}'
check "long-poll answer = a read: a workflow" \
    same_as_read '{"steps":[{"id":"a","sleep_ms":300},{"id":"b","call":"echo","args":{"s":"\\u00e9\\n"}}]}'
req GET "/v1/jobs/$SL2?wait=10s&since=1"
check "since=<version> returns on the next change" eval 'status_is 200 && ! body_has "\"version\":1,"'
req GET "/v1/jobs/$SL2?wait=forever"
check "bad wait: 400" is_problem 400

# ---- SSE live ----
json_post /v1/jobs '{"steps":[{"id":"w","wait":"go","timeout_ms":30000},{"id":"after","call":"echo","args":{"ok":true}}]}'
SSEJ=$(location_id)
curl -sN --max-time 20 -H 'Accept: text/event-stream' "$BASE/v1/jobs/$SSEJ/events" >"$WORK/sse.out" &
SSE_PID=$!
for _ in $(seq 1 100); do grep -q '"state":"waiting"' "$WORK/sse.out" && break; sleep 0.05; done
check "SSE: events arrive live, before the job finishes" grep -q '"state":"waiting"' "$WORK/sse.out"
for _ in $(seq 1 40); do grep -q '^: heartbeat' "$WORK/sse.out" && break; sleep 0.05; done
check "SSE: heartbeat comments while the job waits (--heartbeat 200ms)" grep -q '^: heartbeat' "$WORK/sse.out"
json_post "/v1/jobs/$SSEJ/messages" '{"topic":"go","data":{"n":1}}'
check "message to a waiting job: 202" status_is 202
wait "$SSE_PID"
SSE_RC=$?
check "SSE: stream ends by itself after the job finishes" eval '[ "$SSE_RC" = 0 ] && grep -q "^event: end" "$WORK/sse.out"'
check "SSE: message, dispatch and final state delivered in order" eval 'grep -n "" "$WORK/sse.out" | grep -E "event: (message|dispatch)" >/dev/null && [ "$(grep "^id: " "$WORK/sse.out" | cut -d" " -f2 | sort -n -c 2>&1; echo ok)" = ok ]'
last=$(grep '^id: ' "$WORK/sse.out" | tail -n 1 | cut -d' ' -f2)
curl -sN --max-time 10 -H 'Accept: text/event-stream' -H "Last-Event-ID: $((last - 1))" "$BASE/v1/jobs/$SSEJ/events" >"$WORK/sse2.out"
check "SSE: Last-Event-ID resumes after that event" eval '[ "$(grep -c "^id: " "$WORK/sse2.out")" = 1 ] && grep -q "^id: $last$" "$WORK/sse2.out"'
req GET "/v1/jobs/$SSEJ/events"
check "events as JSON: the history" eval 'status_is 200 && body_has "\"events\":[" && body_has "\"kind\":\"message\""'
req GET "/v1/jobs/$SSEJ/events?after=$((last - 1))"
check "events ?after= filters" eval 'status_is 200 && body_has "\"seq\":$last" && ! body_has "\"seq\":1,"'
json_post "/v1/jobs/$SSEJ/messages" '{"topic":"go"}'
check "message to a finished job: 409" is_problem 409
json_post "/v1/jobs/999999/messages" '{"topic":"go"}'
check "message to an unknown job: 404" is_problem 404

# ---- cancel ----
json_post /v1/jobs '{"handler":"sleep","args":{"ms":30000}}'
CJ=$(location_id)
req POST "/v1/jobs/$CJ/cancel"
check "cancel a running job: 202" status_is 202
wait_job "$CJ"
check "cancelled job ends cancelled" body_has '"state":"cancelled"'
req POST "/v1/jobs/$CJ/cancel"
check "cancel a finished job: 409" is_problem 409
req POST /v1/jobs/999999/cancel
check "cancel an unknown job: 404" is_problem 404

# ---- idempotency ----
KEYBODY='{"handler":"echo","args":{"k":1}}'
json_post /v1/jobs "$KEYBODY" -H 'Idempotency-Key: key-1'
K1=$(location_id)
json_post /v1/jobs "$KEYBODY" -H 'Idempotency-Key: key-1'
K2=$(location_id)
check "same key, same body: the original job" eval '[ -n "$K1" ] && [ "$K1" = "$K2" ] && status_is 201 && header_has "Idempotent-Replayed: true"'
json_post /v1/jobs '{"handler":"echo","args":{"k":2}}' -H 'Idempotency-Key: key-1'
check "same key, different body: 422" is_problem 422
racers=()
for _ in $(seq 1 8); do
    curl -s -o /dev/null -w '%{http_code}\n' -X POST -H 'Content-Type: application/json' \
        -H 'Idempotency-Key: race-1' --data-binary '{"handler":"echo","args":{"r":1}}' \
        "$BASE/v1/jobs" >>"$WORK/race" &
    racers+=($!)
done
wait "${racers[@]}"
check "same key in parallel: only 201 or 409 (in flight)" eval '! grep -vE "^(201|409)$" "$WORK/race" && grep -q 201 "$WORK/race"'
req GET "/v1/jobs?limit=1000"
n_race=$(printf '%s' "$BODY" | grep -o '"args":{"r":1}' | wc -l)
check "same key in parallel: exactly one job created ($n_race)" [ "$n_race" = 1 ]

# ---- batch ----
json_post /v1/jobs/batch '{"jobs":[{"handler":"echo","args":{"b":1},"queue":"batchq"},{"handler":"echo","args":{"b":2},"queue":"batchq"}]}'
check "batch: 201 with both jobs" eval 'status_is 201 && [ "$(printf "%s" "$BODY" | grep -o "\"queue\":\"batchq\",\"priority\"" | wc -l)" = 2 ]'
json_post /v1/jobs/batch '{"jobs":[{"handler":"echo","queue":"batchbad"},{"handler":"nosuch","queue":"batchbad"}]}'
check "batch with one invalid job: 422 pointing at it" eval 'is_problem 422 && body_has "\"pointer\":\"/jobs/1"'
req GET "/v1/jobs?queue=batchbad"
check "batch with one invalid job: nothing accepted" eval 'status_is 200 && body_has "\"jobs\":[]"'

# ---- list and pagination ----
for i in 1 2 3 4 5; do json_post /v1/jobs "{\"handler\":\"echo\",\"args\":{\"p\":$i},\"queue\":\"pg\"}"; done
seen=""
cursor=""
pages=0
while :; do
    req GET "/v1/jobs?queue=pg&limit=2${cursor:+&cursor=$cursor}"
    status_is 200 || break
    pages=$((pages + 1))
    seen="$seen $(printf '%s' "$BODY" | grep -o '"args":{"p":[0-9]' | cut -d'{' -f2 | tr '\n' ' ')"
    cursor=$(printf '%s' "$BODY" | grep -o '"next_cursor":"[^"]*"' | cut -d'"' -f4)
    [ -n "$cursor" ] || break
    [ "$pages" -lt 10 ] || break
done
seen=$(printf '%s' "$seen" | tr -s ' ' | sed 's/^ //; s/ $//')
check "keyset pagination: 5 jobs over 3 pages, newest first, no repeats ($seen)" \
    eval '[ "$seen" = "\"p\":5 \"p\":4 \"p\":3 \"p\":2 \"p\":1" ] && [ "$pages" = 3 ]'
req GET "/v1/jobs?state=succeeded&limit=1"
check "list by state" eval 'status_is 200 && body_has "\"state\":\"succeeded\""'
req GET "/v1/jobs?state=nonsense"
check "list with an unknown state: 400" is_problem 400
req GET "/v1/jobs?limit=5000"
check "list with limit over 1000: 400" is_problem 400

# ---- queues ----
req POST /v1/queues/pz/pause
check "pause a queue: 200" status_is 200
json_post /v1/jobs '{"handler":"echo","args":{},"queue":"pz"}'
PZ=$(location_id)
req GET "/v1/jobs/$PZ?wait=700ms"
check "a job in a paused queue waits" body_has '"state":"queued"'
req GET /v1/queues
check "queues list shows the paused queue" eval 'status_is 200 && body_has "\"name\":\"pz\",\"paused\":true"'
req POST /v1/queues/pz/resume
check "resume a queue: 200" status_is 200
wait_job "$PZ"
check "the job runs after resume" body_has '"state":"succeeded"'
req POST '/v1/queues/bad%20name/pause'
check "pause a queue with a bad name: 404" is_problem 404

# ---- handlers ----
req GET /v1/handlers
check "handlers list plugins, commands and process types" eval 'status_is 200 && body_has "\"echo\"" && body_has "\"count_to\""'

# ---- error statuses ----
req GET /v1/jobs/999999
check "unknown job: 404 naming the id" eval 'is_problem 404 && body_has "no job with id 999999"'
req GET /v1/jobs/abc
check "non-numeric job id: 404 saying ids are numbers" eval 'is_problem 404 && body_has "decimal numbers"'
req GET /v2/nothing
check "unknown route: 404 pointing at the spec" eval 'is_problem 404 && body_has "/v1/openapi.yaml"'
req POST /v1/jobs -d '{"handler":"echo"}'
check "curl -d without a Content-Type: 415 saying which header to add" \
    eval 'is_problem 415 && body_has "Content-Type: application/json"'

req DELETE "/v1/jobs/$TASK/events"
check "wrong method: 405 with Allow" eval 'is_problem 405 && header_has "Allow: GET, HEAD"'
req PUT /v1/jobs/batch
check "wrong method on batch: 405 Allow POST" eval 'is_problem 405 && header_has "Allow: POST"'
json_post /v1/jobs '{"handler":'
check "malformed JSON: 400" is_problem 400
check "problem+json ends with a newline" body_ends_with_newline
json_post /v1/jobs '{"handler":"nosuch","args":{}}'
check "unknown handler: 422 with a pointer" eval 'is_problem 422 && body_has "\"pointer\":\"/handler\""'
json_post /v1/jobs '{"steps":[{"id":"a","call":"echo"},{"id":"b","call":"htp"}]}'
check "bad step: 422 pointing at the step" eval 'is_problem 422 && body_has "\"pointer\":\"/steps/1"'
req POST /v1/jobs -H 'Content-Type: text/plain' --data-binary '{"handler":"echo"}'
check "text/plain body: 415" is_problem 415
head -c 70000 /dev/zero | tr '\0' ' ' >"$WORK/big"
req POST /v1/jobs -H 'Content-Type: application/json' --data-binary @"$WORK/big"
check "body over --max-body: 413" is_problem 413

# ---- metrics ----
req GET /metrics
for fam in jackdaw_jobs_submitted_total 'jackdaw_jobs{state="running"}' jackdaw_job_duration_seconds_bucket \
    'jackdaw_http_requests_total{route="/v1/jobs",code="201"}' jackdaw_http_request_duration_seconds_bucket \
    jackdaw_store_batch_size_bucket jackdaw_store_commit_seconds_bucket jackdaw_sched_steals_total \
    jackdaw_sched_parks_total 'jackdaw_sched_queue_depth{queue="global"}' jackdaw_sched_stuck_total \
    'jackdaw_plugin_calls_total{result="ok"}' 'jackdaw_queue_jobs{queue="default",state="succeeded"}' \
    'jackdaw_queue_paused{queue="pz"} 0'; do
    check "metrics: $fam" body_has "$fam"
done

# ---- every route in the spec answers ----
awk '/^paths:/{p=1;next} p && /^  \/[^ ]*:$/{sub(/:$/,"");gsub(/^ +/,"");path=$0;next}
     p && /^    (get|post):$/{m=$1;sub(/:$/,"",m);print toupper(m), path}' api/openapi.yaml >"$WORK/routes"
nroutes=$(wc -l <"$WORK/routes")
bad=""
req PUT /v1/schedules/specsched -H 'Content-Type: application/json' \
    --data-binary '{"cron":"@yearly","job":{"handler":"echo"}}'
# a bulk operation to look at (retrying succeeded jobs skips them all)
req POST /v1/jobs/retry -H 'Content-Type: application/json' --data-binary '{"state":"succeeded"}'
OPID=$(sed -n 's/.*"id":"\([0-9]*\)".*/\1/p' <<<"$BODY")
req PUT /v1/commands/speccmd -H 'Content-Type: application/json' --data-binary '{}'
req POST /v1/jobs -H 'Content-Type: application/json' --data-binary '{"handler":"speccmd"}'
req POST /v1/tasks/claim -H 'Content-Type: application/json' \
    --data-binary '{"commands":["speccmd"],"wait_ms":5000}'
SPECTASK=$(sed -n 's/.*"id":"\([0-9]*-[0-9]*-[0-9a-f]\{32\}\)".*/\1/p' <<<"$BODY")
while read -r m p; do
    case $p in
    /v1/schedules/*) p=${p//\{id\}/specsched} ;;
    /v1/commands/*) p=${p//\{name\}/speccmd} ;;
    /v1/tasks/*) p=${p//\{id\}/$SPECTASK} ;;
    /v1/operations/*) p=${p//\{id\}/$OPID} ;;
    *) p=${p//\{id\}/$TASK} ;;
    esac
    p=${p//\{queue\}/specq}
    p=${p//\{path\}/index.html}
    if [ "$m" = POST ]; then
        req POST "$p" -H 'Content-Type: application/json' --data-binary '{}'
    else
        req GET "$p"
    fi
    case $STATUS in 404 | 405 | 5* | 000) bad="$bad $m $p=$STATUS" ;; esac
done <"$WORK/routes"
check "all $nroutes routes in openapi.yaml answer (no 404/405/5xx)" eval '[ "$nroutes" -ge 16 ] && [ -z "$bad" ]'
[ -z "$bad" ] || echo "# failing routes:$bad"

stop_server
check "SIGTERM: exit 0" [ "$SERVER_RC" = 0 ]
reqlines=$(grep '"msg":"request"' "$LOG")
full=$(printf '%s\n' "$reqlines" | grep '"request_id":' | grep '"method":' | grep '"path":' |
    grep '"status":' | grep '"duration_ms":' | grep -c '"time":')
check "one JSON log line per request with time, request id, method, path, status, duration" \
    eval '[ "$full" -ge 90 ] && [ "$full" = "$(printf "%s\n" "$reqlines" | wc -l)" ]'
check "request log lines name the job" eval 'grep -qF "\"job_id\":\"$TASK\"" <<<"$reqlines"'
finish
