#!/usr/bin/env bash
# Unique jobs ("unique" on a job definition) against the real server: the
# three conflict answers, the "while" and "for_ms" windows, keys released
# when their job ends (succeeded, failed, cancelled), held across a
# restart, hostile bodies; and crash safety: clients submit jobs with a
# few keys while jackdawd is SIGKILLed again and again, and the database
# (read directly after each kill) never has two active jobs with one key
# nor a key held by a finished job.
# shellcheck disable=SC2016,SC2034
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

job() { # handler-args-json extra-members
    json_post /v1/jobs "{\"handler\":\"sleep\",\"args\":{\"ms\":$1}${2:+,$2}}"
}
state_of() {
    req GET "/v1/jobs/$1"
    python3 -c 'import json,sys; print(json.loads(sys.argv[1])["state"])' "$BODY"
}
wait_state() { # id state
    for _ in $(seq 1 100); do
        [ "$(state_of "$1")" = "$2" ] && return 0
        sleep 0.1
    done
    return 1
}

start_server || exit 1

# ---- bad definitions ----
bad() { # name unique-json pointer
    job 10 "\"unique\":$2"
    local want="\"pointer\":\"$3\""
    check "$1: 422 at $3" eval 'is_problem 422 && body_has "$want"'
}
bad "unique not an object" '"k"' /unique
bad "no key" '{}' /unique/key
bad "an empty key" '{"key":""}' /unique/key
bad "a key that is a number" '{"key":42}' /unique/key
bad "a key over 256 bytes" "{\"key\":\"$(printf 'k%.0s' $(seq 1 257))\"}" /unique/key
bad "while unknown" '{"key":"a","while":"running"}' /unique/while
bad "for_ms 0" '{"key":"a","for_ms":0}' /unique/for_ms
bad "for_ms negative" '{"key":"a","for_ms":-5}' /unique/for_ms
bad "for_ms fractional" '{"key":"a","for_ms":1.5}' /unique/for_ms
bad "for_ms huge" '{"key":"a","for_ms":1e300}' /unique/for_ms
bad "on_conflict unknown" '{"key":"a","on_conflict":"ignore"}' /unique/on_conflict
bad "an unknown member" '{"key":"a","ttl":5}' /unique/ttl
job 10 '"unique":{"key":"'"$(printf 'k%.0s' $(seq 1 256))"'"}'
check "a key of 256 bytes is fine" status_is 201
json_post /v1/jobs/batch '{"jobs":[{"handler":"echo"},{"handler":"echo","unique":{"key":"b"}}]}'
check "unique in a batch: 422 at /jobs/1/unique" eval 'is_problem 422 && body_has "\"pointer\":\"/jobs/1/unique\""'
req PUT /v1/schedules/u1 -H 'Content-Type: application/json' \
    --data-binary '{"every":"1h","job":{"handler":"echo","unique":{"key":"s"}}}'
check "unique in a schedule's job: 422 at /job/unique" eval 'is_problem 422 && body_has "\"pointer\":\"/job/unique\""'

# ---- the conflict answers ----
job 1500 '"unique":{"key":"sync-42"}'
check "the first job with a key: 201" status_is 201
first=$(location_id)
job 1500 '"unique":{"key":"sync-42"}'
check "again (return_existing, the default): 200 with the first job" \
    eval 'status_is 200 && body_has "\"id\":\"$first\"" && header_has "Location: /v1/jobs/$first"'
job 1500 '"unique":{"key":"sync-42","on_conflict":"return_existing"}'
check "return_existing said: 200 with the first job" eval 'status_is 200 && body_has "\"id\":\"$first\""'
job 1500 '"unique":{"key":"sync-42","on_conflict":"reject"}'
check "reject: 409 problem naming the holder" \
    eval 'is_problem 409 && body_has "\"existing_job_id\":\"$first\"" && body_has "\"pointer\":\"/unique/key\""'
job 1500 '"unique":{"key":"sync-42","on_conflict":"replace"}'
check "replace while the holder runs: 409 (only a queued one is replaced)" \
    eval 'is_problem 409 && body_has "\"existing_job_id\":\"$first\""'
job 10 '"unique":{"key":"other"}'
check "another key is independent: 201" status_is 201
wait_job "$first"
job 10 '"unique":{"key":"sync-42","on_conflict":"reject"}'
check "once the holder succeeded the key is free: 201" eval 'status_is 201 && [ "$(location_id)" != "$first" ]'

# replace: the queued holder is cancelled in the commit of the new job.
job 10 '"delay_ms":60000,"unique":{"key":"nightly"}'
old=$(location_id)
job 10 '"unique":{"key":"nightly","on_conflict":"replace"}'
check "replace a queued holder: 201, a new job" eval 'status_is 201 && [ "$(location_id)" != "$old" ]'
new=$(location_id)
req GET "/v1/jobs/$old"
check "the replaced job is cancelled, kind replaced" \
    eval 'body_has "\"state\":\"cancelled\"" && body_has "\"kind\":\"replaced\"" && body_has "replaced by job $new"'
wait_job "$new"
check "the new one runs" body_has '"state":"succeeded"'

# Released when the job fails or is cancelled.
json_post /v1/jobs '{"handler":"fail","args":{},"unique":{"key":"f"}}'
f=$(location_id)
wait_job "$f"
json_post /v1/jobs '{"handler":"fail","args":{},"unique":{"key":"f"}}'
check "a failed holder released its key" eval 'status_is 201 && [ "$(location_id)" != "$f" ]'
job 10 '"delay_ms":60000,"unique":{"key":"c"}'
c=$(location_id)
req POST "/v1/jobs/$c/cancel"
wait_state "$c" cancelled
job 10 '"unique":{"key":"c"}'
check "a cancelled holder released its key" eval 'status_is 201 && [ "$(location_id)" != "$c" ]'

# "while": "queued": held until the job starts.
job 1200 '"delay_ms":300,"unique":{"key":"q","while":"queued"}'
q1=$(location_id)
job 10 '"unique":{"key":"q","while":"queued"}'
check "while queued: a second submit gets the queued one" eval 'status_is 200 && body_has "\"id\":\"$q1\""'
wait_state "$q1" running
job 10 '"unique":{"key":"q","while":"queued"}'
check "once it runs the key is free: 201" eval 'status_is 201 && [ "$(location_id)" != "$q1" ]'

# "for_ms": the hold ends after that long, even while the job still runs.
job 3000 '"unique":{"key":"t","for_ms":400}'
t1=$(location_id)
job 10 '"unique":{"key":"t","for_ms":400}'
check "within for_ms: the holder" eval 'status_is 200 && body_has "\"id\":\"$t1\""'
sleep 0.6
job 10 '"unique":{"key":"t","for_ms":400}'
check "after for_ms: 201 although the holder still runs" \
    eval 'status_is 201 && [ "$(state_of "$t1")" = running ]'

# Held across a restart.
job 10 '"delay_ms":60000,"unique":{"key":"durable"}'
d=$(location_id)
stop_server
start_server || exit 1
job 10 '"unique":{"key":"durable"}'
check "after a restart the key is still held" eval 'status_is 200 && body_has "\"id\":\"$d\""'
req POST "/v1/jobs/$d/cancel"

# ---- SIGKILL around unique-key inserts ----
# Every active job (not a manual retry) with a unique key per key, and key
# rows held by jobs that are not active; read from the database itself.
db_check() {
    python3 - "$DB" <<'EOF'
import json, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
active = {}
for jid, text in db.execute(
        "SELECT j.id, d.definition FROM jobs j JOIN job_definitions d ON d.job_id = j.id"
        " WHERE j.state < 3 AND j.attempts <= 1"):
    u = json.loads(text).get("unique")
    if u:
        active.setdefault(u["key"], []).append(jid)
dup = {k: v for k, v in active.items() if len(v) > 1}
stale = db.execute("SELECT count(*) FROM unique_keys u LEFT JOIN jobs j ON j.id = u.job_id"
                   " WHERE j.id IS NULL OR j.state >= 3").fetchone()[0]
missing = [k for k, v in active.items()
           if not db.execute("SELECT 1 FROM unique_keys WHERE key = ? AND job_id = ?",
                             (k, v[0])).fetchone()]
if dup or stale or missing:
    print("two active jobs for", dup, "| keys of finished jobs:", stale, "| unheld:", missing)
    sys.exit(1)
EOF
}
submitter() { # a client loop; stops when the server is gone for good
    local i=0 modes=(return_existing reject replace)
    while :; do
        i=$((i + 1))
        curl -s -o /dev/null --max-time 2 -X POST "$BASE/v1/jobs" -H 'Content-Type: application/json' \
            --data-binary "{\"handler\":\"sleep\",\"args\":{\"ms\":$((i % 4 * 60))},\"delay_ms\":$((i % 3 * 100)),\"unique\":{\"key\":\"crash-$((i % 3))\",\"on_conflict\":\"${modes[i % 3]}\"}}"
    done
}
ok_rounds=0
for round in 1 2 3 4 5 6; do
    submitter &
    s1=$!
    submitter &
    s2=$!
    sleep "0.$((RANDOM % 6 + 3))"
    stop_server KILL
    kill "$s1" "$s2" 2>/dev/null
    wait "$s1" "$s2" 2>/dev/null
    if db_check; then ok_rounds=$((ok_rounds + 1)); fi
    start_server || exit 1
done
check "after each of 6 SIGKILLs: one active job per key, no key of a finished job" \
    eval '[ "$ok_rounds" = 6 ]'
for k in 0 1 2; do
    json_post /v1/jobs "{\"handler\":\"echo\",\"args\":{},\"unique\":{\"key\":\"crash-$k\",\"on_conflict\":\"replace\"}}"
    id=$(location_id)
    [ -n "$id" ] || id=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1]).get("id") or json.loads(sys.argv[1]).get("existing_job_id"))' "$BODY")
    wait_job "$id" 20s
done
for _ in $(seq 1 100); do
    req GET /v1/queues/default
    python3 -c 'import json,sys; c=json.loads(sys.argv[1])["counts"]; sys.exit(0 if c["queued"]+c["running"]==0 else 1)' "$BODY" && break
    sleep 0.2
done
stop_server
check "once every job ended no key is held" \
    eval '[ "$(python3 -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute(\"SELECT count(*) FROM unique_keys\").fetchone()[0])" "$DB")" = 0 ]'
check "and the database checks out" db_check

finish
