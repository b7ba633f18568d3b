#!/usr/bin/env bash
# Schedules against the real server: the README's examples
# (schedules_tour.sh, which the README quotes verbatim), every route with
# its answers and problem+json pointers, hostile bodies and ids, the count
# bound, and crash safety: kill -9 between ticks and in the middle of a
# catch-up, then count the jobs per fire time through
# GET /v1/jobs?schedule=<id> (none doubled, none lost). Prints TAP.
# shellcheck disable=SC2016,SC2034,SC2119
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

put() { req PUT "/v1/schedules/$1" -H 'Content-Type: application/json' --data-binary "$2"; }

# The fire times of schedule $1's jobs, one per line, sorted ("null" for
# triggered ones).
fire_times() {
    req GET "/v1/jobs?schedule=$1&limit=1000"
    grep -o '"fire_time":[^,}]*' <<<"$BODY" | sed 's/"fire_time"://; s/"//g' | sort
}
# Fire times that appear more than once (a doubled tick).
doubled() { fire_times "$1" | uniq -d | grep -c . ; }
# Neighbouring fire times further apart than $2 ms (a lost tick).
gaps() {
    local prev='' n=0 t ms
    while read -r t; do
        [ "$t" = null ] && continue
        ms=$(date -d "$t" +%s%3N)
        if [ -n "$prev" ] && [ $((ms - prev)) -ne "$2" ]; then n=$((n + 1)); fi
        prev=$ms
    done < <(fire_times "$1")
    echo "$n"
}
count() { fire_times "$1" | grep -c . ; }

start_server || exit 1

# ---- the README's examples ----
JD=$BASE timeout 60 sh tests/integration/schedules_tour.sh >"$WORK/tour.out" 2>"$WORK/tour.err"
rc=$?
BODY=$(cat "$WORK/tour.out")
has() { grep -qF -- "$1" "$WORK/tour.out"; }
check "the schedules tour runs to the end (exit $rc)" eval '[ "$rc" = 0 ] && [ ! -s "$WORK/tour.err" ]'
check "cron in Berlin: next fires at 01:00 or 02:00 UTC" \
    eval 'grep -q "\"id\":\"nightly-report\".*\"next_fire_times\":\[\"[0-9-]*T0[12]:00:00.000Z\"" "$WORK/tour.out"'
check "interval schedule created with its defaults" has '"id":"heartbeat","every":"2s","overlap":"skip","catchup":"latest"'
check "trigger answers with the job, labelled" eval 'has "\"labels\":{\"team\":\"data\",\"schedule\":\"nightly-report\"}"'
check "the heartbeat's jobs carry their fire time" eval 'has "\"schedule\":{\"id\":\"heartbeat\",\"fire_time\":\"20"'
check "its history" eval 'has "{\"events\":[{\"seq\":1," && has "\"kind\":\"created\"" && has "\"kind\":\"fired\""'
check "pause, resume" eval 'has "\"state\":\"paused\"" && has "\"state\":\"active\""'
check "list, by id" has '{"schedules":[{"id":"heartbeat"'
check "delete answers 204" eval 'grep -qx 204 "$WORK/tour.out"'
check "a bad expression: 422 naming the field and reason, pointer /cron" \
    eval 'has "hour: 25 is out of range 0-23" && has "\"pointer\":\"/cron\""'
readme_block() { sed -n '/^## Schedules/,/^## /p' README.md | sed -n '/^```sh$/,/^```$/p' | sed '1d;$d'; }
check "the README quotes the tour verbatim" \
    diff <(readme_block) <(sed -n '/^JD=/,$p' tests/integration/schedules_tour.sh)

req DELETE /v1/schedules/nightly-report

# ---- routes ----
put r1 '{"every":"1h","job":{"handler":"echo"}}'
check "PUT new: 201 with Location" eval 'status_is 201 && header_has "Location: /v1/schedules/r1" && body_has "\"state\":\"active\""'
check "five next fire times, an hour apart" eval '[ "$(grep -o "T[0-9:.]*Z" <<<"${BODY#*next_fire_times}" | head -5 | wc -l)" = 5 ]'
put r1 '{"every":"2h","job":{"handler":"echo"},"paused":true}'
check "PUT again: 200, replaced" eval 'status_is 200 && body_has "\"every\":\"2h\"" && body_has "\"state\":\"paused\"" && body_has "\"next_fire_times\":[]"'
req GET /v1/schedules/r1
check "GET" eval 'status_is 200 && body_has "\"counts\":{\"fires\":0,\"skips\":0}" && body_has "\"last_fire\":null"'
req GET /v1/schedules/nope
check "GET unknown: 404 problem" is_problem 404
req POST /v1/schedules/r1/trigger
check "trigger a paused schedule: 201 with the job's Location" eval 'status_is 201 && header_has "Location: /v1/jobs/"'
jid=$(location_id)
wait_job "$jid"
check "the triggered job ran" body_has '"state":"succeeded"'
req GET /v1/schedules/r1
check "last_fire names it" body_has "\"job_id\":\"$jid\",\"outcome\":\"triggered\""
req GET /v1/schedules/r1/events
check "events: created, replaced, triggered" eval 'body_has "\"kind\":\"created\"" && body_has "\"kind\":\"replaced\"" && body_has "\"kind\":\"triggered\""'
req GET "/v1/schedules/r1/events?after=2&limit=1"
check "events after/limit" eval 'status_is 200 && body_has "\"seq\":3" && ! body_has "\"seq\":2"'
for i in 1 2 3; do put "page$i" '{"cron":"@daily","job":{"handler":"echo"}}'; done
req GET "/v1/schedules?limit=2"
check "list page 1" eval 'status_is 200 && body_has "\"next_cursor\":\"page2\"" && body_has "\"id\":\"page1\""'
req GET "/v1/schedules?limit=2&cursor=page2"
check "list page 2" eval 'body_has "\"id\":\"page3\"" && body_has "\"id\":\"r1\"" && body_has "\"next_cursor\":null"'
req GET "/v1/schedules?limit=0"
check "list limit 0: 400" is_problem 400
req DELETE /v1/schedules/page1
check "DELETE: 204" status_is 204
req DELETE /v1/schedules/page1
check "DELETE again: 404" is_problem 404
req POST /v1/schedules/page1/pause
check "pause unknown: 404" is_problem 404
req GET /v1/schedules/r1/pause
check "GET on a POST route: 405" eval 'status_is 405 && header_has "Allow: POST"'

# ---- bad definitions: 422 with a pointer, the field and the reason ----
bad() { # name body pointer needle
    local ptr=$3 needle=$4
    put bad "$2"
    check "$1" eval 'is_problem 422 && body_has "\"pointer\":\"$ptr\"" && body_has "$needle"'
}
bad "cron field out of range" '{"cron":"61 * * * *","job":{"handler":"echo"}}' /cron 'minute: 61 is out of range 0-59'
bad "cron unknown name" '{"cron":"0 0 * * funday","job":{"handler":"echo"}}' /cron 'day-of-week: unknown name'
bad "cron of 6 fields" '{"cron":"0 0 * * * *","job":{"handler":"echo"}}' /cron 'expected 5 fields'
bad "cron that never fires" '{"cron":"0 0 30 2 *","job":{"handler":"echo"}}' /cron 'never fires'
bad "cron not a string" '{"cron":5,"job":{"handler":"echo"}}' /cron 'must be a string'
bad "every too short" '{"every":"10ms","job":{"handler":"echo"}}' /every 'shorter than 1s'
bad "both cron and every" '{"cron":"@daily","every":"1m","job":{"handler":"echo"}}' /every 'not both'
bad "unknown zone" '{"cron":"@daily","timezone":"Moon/Base","job":{"handler":"echo"}}' /timezone 'unknown time zone'
bad "a zone outside the database" '{"cron":"@daily","timezone":"../../../etc/passwd","job":{"handler":"echo"}}' /timezone 'IANA name'
bad "no job" '{"every":"1m"}' /job 'needs a job'
bad "job not an object" '{"every":"1m","job":"echo"}' /job 'must be a job definition'
bad "unknown handler in the job" '{"every":"1m","job":{"handler":"ech"}}' /job/handler 'ech'
bad "bad workflow step in the job" '{"every":"1m","job":{"steps":[{"id":"a","call":"htp"}]}}' /job/steps/0/call 'htp'
bad "unknown field" '{"every":"1m","evry":"1m","job":{"handler":"echo"}}' /evry 'unknown field'
bad "paused not a bool" '{"every":"1m","paused":"yes","job":{"handler":"echo"}}' /paused 'true or false'
bad "negative jitter" '{"every":"1m","jitter_ms":-1,"job":{"handler":"echo"}}' /jitter_ms 'whole number'
bad "reserved label" '{"every":"1m","labels":{"schedule":"x"},"job":{"handler":"echo"}}' /labels/schedule 'set by Jackdaw'
bad "end before start" '{"every":"1m","start_at":"2030-01-02T00:00:00Z","end_at":"2030-01-01T00:00:00Z","job":{"handler":"echo"}}' /end_at 'after start_at'
put bad '[{"every":"1m"}]'
check "an array body: 422" eval 'is_problem 422 && body_has "JSON object"'
put bad '{"every":'
check "malformed JSON: 400" is_problem 400
req PUT /v1/schedules/bad -H 'Content-Type: text/plain' --data-binary '{}'
check "not JSON: 415" is_problem 415
head -c 100000 /dev/zero | tr '\0' ' ' >"$WORK/big"
printf '{"every":"1m","job":{"handler":"echo"}}' >>"$WORK/big"
req PUT /v1/schedules/bad -H 'Content-Type: application/json' --data-binary @"$WORK/big"
check "a 100 KB body: 413" is_problem 413
deep=$(printf '%.0s[' $(seq 1 5000))$(printf '%.0s]' $(seq 1 5000))
put bad "{\"every\":\"1m\",\"job\":{\"handler\":\"echo\",\"args\":$deep}}"
check "5000 levels deep: 413, no crash" is_problem 413
put 'a%20b' '{"every":"1m","job":{"handler":"echo"}}'
check "an id with a space: 404" is_problem 404
put "$(printf 'x%.0s' $(seq 1 101))" '{"every":"1m","job":{"handler":"echo"}}'
check "a 101-character id: 404" is_problem 404
put ".." '{"every":"1m","job":{"handler":"echo"}}'
check "id '..': 404" eval 'status_is 404'
req GET /v1/schedules/bad
check "nothing was stored for any of them" is_problem 404

# ---- jobs made by a schedule, and GET /v1/jobs?schedule= ----
put fast '{"every":"1s","overlap":"allow","labels":{"env":"it"},"job":{"handler":"echo","args":{"x":1}}}'
sleep 3.5
check "an every-1s schedule made 3 or 4 jobs so far" eval 'n=$(count fast); [ "$n" -ge 3 ] && [ "$n" -le 4 ]'
req GET "/v1/jobs?schedule=fast&limit=1"
check "each labelled with the schedule and its labels" body_has '"labels":{"env":"it","schedule":"fast"}'
check "one job per fire time, one second apart" eval '[ "$(doubled fast)" = 0 ] && [ "$(gaps fast 1000)" = 0 ]'
req GET "/v1/jobs?schedule=fast&state=succeeded&limit=1"
check "?schedule= combines with state and limit" eval 'status_is 200 && [ "$(grep -o "\"fire_time\"" <<<"$BODY" | wc -l)" = 1 ]'
req GET "/v1/jobs?schedule=nope"
check "?schedule= of an unknown schedule: an empty page" body_has '{"jobs":[],"next_cursor":null}'
req GET "/v1/jobs?schedule=fast&queue=default"
check "?schedule= with ?queue=: 400" is_problem 400
json_post /v1/jobs '{"handler":"echo"}' -H 'Idempotency-Key: schedule:fast:1'
check "a client's Idempotency-Key cannot take a fire's place: 400" eval 'is_problem 400 && body_has "reserved for schedules"'
req GET /metrics
check "metrics: fires and the lag histogram" eval 'body_has "jackdaw_schedule_fires_total " && body_has "jackdaw_schedule_fire_lag_seconds_bucket{le=\"0.1\"}"'
req DELETE /v1/schedules/fast

# ---- kill -9 between ticks: nothing lost, nothing doubled ----
put k1 '{"every":"1s","overlap":"allow","catchup":"all","job":{"handler":"echo"}}'
sleep 2.6
stop_server KILL
start_server || exit 1
sleep 3
check "k1 after kill -9 between ticks: no fire time doubled" eval '[ "$(doubled k1)" = 0 ]'
check "k1: no fire time lost" eval '[ "$(gaps k1 1000)" = 0 ] && [ "$(count k1)" -ge 5 ]'

# ---- kill -9 across a catch-up (catchup all): the missed fires all run,
# once, even when the catch-up itself is killed ----
put k2 '{"every":"1s","overlap":"allow","catchup":"all","job":{"handler":"echo"}}'
put k3 '{"every":"1s","overlap":"allow","catchup":"latest","job":{"handler":"echo"}}'
sleep 1.5
stop_server KILL
sleep 9 # every fire more than 5 s late counts as missed
start_server || exit 1
stop_server KILL # in the middle of (or just after) the catch-up
start_server || exit 1
sleep 2
check "k2 across a killed catch-up: no fire time doubled" eval '[ "$(doubled k2)" = 0 ]'
check "k2: every missed fire ran" eval '[ "$(gaps k2 1000)" = 0 ] && [ "$(count k2)" -ge 12 ]'
req GET /v1/schedules/k2/events
check "k2's history says it caught up" eval 'body_has "\"kind\":\"caught_up\"" && body_has "\"policy\":\"all\""'
check "k3 (catchup latest): one job for all the missed fires" \
    eval 'req GET /v1/schedules/k3/events; body_has "\"policy\":\"latest\"" && body_has "\"ran\":1" && [ "$(doubled k3)" = 0 ]'
check "k3: fewer jobs than fire times (the missed ones ran once)" eval '[ "$(gaps k3 1000)" -ge 1 ]'

# ---- the count bound ----
stop_server
start_server --max-schedules 6 || exit 1
req GET "/v1/schedules?limit=1000"
have=$(grep -o '"state":"\(active\|paused\|retired\)"' <<<"$BODY" | wc -l)
for i in $(seq "$have" 5); do put "fill$i" '{"cron":"@yearly","job":{"handler":"echo"}}'; done
put one-too-many '{"cron":"@yearly","job":{"handler":"echo"}}'
check "past --max-schedules: 429" eval 'is_problem 429 && body_has "max-schedules"'
put r1 '{"cron":"@monthly","job":{"handler":"echo"}}'
check "replacing one still works when full" status_is 200
stop_server
check "the server stopped cleanly (exit $SERVER_RC)" eval '[ "$SERVER_RC" = 0 ]'
finish
