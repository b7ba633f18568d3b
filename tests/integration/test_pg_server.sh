#!/usr/bin/env bash
# jackdawd on PostgreSQL (issue 16): `--db postgres://...`
# against a throwaway server (tests/pg/pg.sh). The API tour (submit, wait,
# list, messages, cancel, idempotency, schedules), then SIGKILL in the middle
# of work and a restart on the same database: every acknowledged job is
# found and finishes, waiting workflows still take their message, and the
# database itself checks out (history seq 1..version per job, queue counts
# equal to the rows, nothing owned by a dead node); the database restarting
# under the node is survived. A second node joins the database (the
# cluster) and leaves cleanly. Also: an unreachable database is a clear
# error without the password, a foreign database is refused. A node started
# while PostgreSQL is down retries (--db-connect-wait) and starts once it is
# up; it gives up after the wait, or at once with 0. Prints TAP.
# shellcheck disable=SC2016,SC2034,SC2119
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
# shellcheck source=tests/pg/pg.sh
. tests/pg/pg.sh

pg_test_start
DB=$PG_URL

start_server || exit 1
check "the ready line shows the database URL" grep -qF "\"db\":\"$PG_URL\"" "$LOG"

# ---- the tour ----
json_post /v1/jobs '{"handler":"echo","args":{"hello":"pg"}}'
id=$(location_id)
check "submit: 201 once durable" status_is 201
wait_job "$id"
check "wait: succeeded with its output and 5 history events" \
    eval 'body_has "\"state\":\"succeeded\"" && body_has "\"output\":{\"hello\":\"pg\"}" && body_has "\"version\":5"'
req GET "/v1/jobs/$id/events"
check "history as JSON, seq 1 first" body_has '{"events":[{"seq":1,'
req GET "/v1/jobs?limit=5"
check "list shows it" body_has "\"id\":\"$id\""

json_post /v1/jobs '{"steps":[{"id":"a","call":"echo","args":{"n":1}},{"id":"ok","wait":"approval","timeout_ms":600000}],"labels":{"team":"pg"}}'
wf=$(location_id)
json_post "/v1/jobs/$wf/messages" '{"topic":"approval","data":{"by":"me"}}'
check "message accepted" eval 'status_is 202 || status_is 200'
wait_job "$wf"
check "the workflow finished with the message" body_has '"ok":{"by":"me"}'
req GET "/v1/jobs?label=team:pg"
check "found by its label" body_has "\"id\":\"$wf\""

json_post /v1/jobs '{"handler":"echo","args":{},"delay_ms":60000}'
later=$(location_id)
req POST "/v1/jobs/$later/cancel"
wait_job "$later" 5s
check "a delayed job cancelled" body_has '"state":"cancelled"'

json_post /v1/jobs '{"handler":"echo","args":{"k":1}}' -H 'Idempotency-Key: pg-k1'
k1=$(location_id)
json_post /v1/jobs '{"handler":"echo","args":{"k":1}}' -H 'Idempotency-Key: pg-k1'
check "the same idempotency key returns the same job" body_has "\"id\":\"$k1\""

req PUT /v1/schedules/beat -H 'Content-Type: application/json' \
    --data-binary '{"every":"1s","overlap":"skip","job":{"handler":"echo","args":{"beat":true}}}'
check "schedule created" eval 'status_is 201 || status_is 200'
for _ in $(seq 1 50); do
    req GET "/v1/jobs?schedule=beat&limit=5"
    body_has '"state":"succeeded"' && break
    sleep 0.1
done
check "the schedule fired a job that ran" body_has '"state":"succeeded"'
req DELETE /v1/schedules/beat
check "schedule deleted" status_is 204

# ---- SIGKILL mid-work, restart on the same database ----
ids=()
for i in $(seq 1 40); do
    json_post /v1/jobs "{\"handler\":\"sleep\",\"args\":{\"ms\":$((i % 5 * 100))},\"queue\":\"work\"}"
    ids+=("$(location_id)")
done
json_post /v1/jobs '{"steps":[{"id":"w","wait":"go","timeout_ms":600000}]}'
waiting=$(location_id)
sleep 0.3
stop_server KILL
# The killed node's row stays until its lease lapses and a node takes its
# jobs over (the storage tests wait for a real lapse); here it lapses now.
sql "UPDATE jd_nodes SET expires_at = now() - interval '1 second'" >/dev/null
start_server || exit 1
check "after the restart only the new node's row is left" \
    eval '[ "$(sql "SELECT count(*) FROM jd_nodes")" = 1 ]'
left=0
for j in "${ids[@]}"; do
    wait_job "$j" 20s
    body_has '"state":"succeeded"' || left=$((left + 1))
done
check "all 40 acknowledged jobs finished after the SIGKILL" eval '[ "$left" = 0 ]'
json_post "/v1/jobs/$waiting/messages" '{"topic":"go","data":1}'
wait_job "$waiting"
check "the waiting workflow took its message after the restart" body_has '"state":"succeeded"'
json_post /v1/jobs '{"handler":"echo","args":{}}'
check "ids go on above the ones before the restart" eval '[ "$(location_id)" -gt "$waiting" ]'
req GET /v1/queues/work
check "queue counts: 40 succeeded" body_has '"succeeded":40'

check "every job's history is seq 1..version" \
    eval '[ "$(sql "SELECT count(*) FROM jobs j WHERE version <> (SELECT count(*) FROM events_all e WHERE e.job_id = j.id) OR version <> (SELECT max(seq) FROM events_all e WHERE e.job_id = j.id)")" = 0 ]'
check "queue_counts equal the rows" \
    eval '[ "$(sql "SELECT count(*) FROM (SELECT queue, state, count(*) AS n FROM jobs GROUP BY 1, 2) a FULL JOIN (SELECT queue, state, sum(n) AS n FROM queue_counts GROUP BY 1, 2) c USING (queue, state) WHERE coalesce(a.n, 0) <> coalesce(c.n, 0)")" = 0 ]'
check "no unfinished job is owned by a dead node" \
    eval '[ "$(sql "SELECT count(*) FROM jobs WHERE state < 3 AND owner_node NOT IN (SELECT id FROM jd_nodes)")" = 0 ]'

# ---- the database restarts under the running node ----
pg_as "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/log" -m fast -w restart \
    -o "-c listen_addresses=127.0.0.1 -p $PG_PORT -k $PG_DIR -c fsync=off" >/dev/null
left=0
for i in $(seq 1 5); do
    json_post /v1/jobs "{\"handler\":\"echo\",\"args\":{\"after_restart\":$i}}"
    j=$(location_id)
    wait_job "$j" 20s
    body_has '"state":"succeeded"' || left=$((left + 1))
done
check "after the database restarted, jobs are accepted and run (writer and readers reconnect)" \
    eval '[ "$left" = 0 ]'
# (/readyz follows the heartbeat, which finds the new connection at its
# next beat: every lease/5)
for _ in $(seq 1 100); do
    req GET /readyz
    status_is 200 && break
    sleep 0.1
done
check "readyz after the restart" status_is 200

# ---- a second node joins; then refusals ----
"$JACKDAWD" --listen 127.0.0.1:0 --db "$PG_URL" --plugin-dir "$BUILD/plugins" \
    >"$WORK/second.log" 2>&1 &
second=$!
for _ in $(seq 1 200); do
    grep -q '"msg":"listening"' "$WORK/second.log" && break
    kill -0 "$second" 2>/dev/null || break
    sleep 0.05
done
check "a second node on the same database joins it (two node rows)" \
    eval 'grep -q "\"msg\":\"listening\"" "$WORK/second.log" && [ "$(sql "SELECT count(*) FROM jd_nodes")" = 2 ]'
kill -TERM "$second" 2>/dev/null
wait "$second"
rc=$?
check "the second node stops cleanly (exit $rc) and its row goes" \
    eval '[ "$rc" = 0 ] && [ "$(sql "SELECT count(*) FROM jd_nodes")" = 1 ]'
stop_server
check "clean stop: the node row is gone" eval '[ "$(sql "SELECT count(*) FROM jd_nodes")" = 0 ]'

# ---- a node started before its database (--db-connect-wait) ----
# PostgreSQL down: the node retries with backoff, logging each failure,
# and opens no port until it reaches the database; PostgreSQL comes back
# on the same port and the node becomes ready and runs jobs.
pg_up() {
    pg_as "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/log" -w start \
        -o "-c listen_addresses=127.0.0.1 -p $PG_PORT -k $PG_DIR -c fsync=off" >/dev/null
}
pg_down() { pg_as "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m fast -w stop >/dev/null 2>&1; }
pg_down
LOG=$WORK/early.log
"$JACKDAWD" --listen 127.0.0.1:0 --db "$DB" --plugin-dir "$BUILD/plugins" \
    --db-connect-wait 60s 2>"$LOG" &
SERVER_PID=$!
for _ in $(seq 1 100); do
    [ "$(grep -c 'cannot be reached yet' "$LOG")" -ge 3 ] && break
    sleep 0.1
done
check "with the database down, the node logs each failed attempt and retries" \
    eval '[ "$(grep -c "cannot be reached yet; retrying" "$LOG")" -ge 3 ] && grep -q "\"attempt\":\"2\"" "$LOG"'
check "... and opens no port meanwhile" eval '! grep -q "\"msg\":\"listening\"" "$LOG"'
pg_up
addr=
for _ in $(seq 1 200); do
    addr=$(grep -o '"msg":"listening","addr":"[^"]*"' "$LOG" | head -n 1 | cut -d'"' -f8)
    [ -n "$addr" ] && [ "$(curl -s -o /dev/null -w '%{http_code}' "http://$addr/readyz")" = 200 ] &&
        break
    sleep 0.05
done
BASE=http://$addr
check "once the database is up the node listens and is ready" \
    eval '[ "$(curl -s -o /dev/null -w "%{http_code}" "$BASE/readyz")" = 200 ]'
json_post /v1/jobs '{"handler":"echo","args":{"late":"db"}}'
wait_job "$(location_id)"
check "... and runs jobs" body_has '"output":{"late":"db"}'
stop_server
check "... and stops cleanly" test "$SERVER_RC" = 0

pg_down
"$JACKDAWD" --listen 127.0.0.1:0 --db "$DB" --plugin-dir "$BUILD/plugins" \
    --db-connect-wait 60s >"$WORK/sigterm.log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do
    grep -q 'cannot be reached yet' "$WORK/sigterm.log" && break
    sleep 0.1
done
kill -TERM "$pid"
t0=$(date +%s%N)
wait "$pid"
rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
check "SIGTERM while it waits for the database stops it at once (exit $rc, ${ms} ms)" \
    eval '[ "$rc" = 0 ] && [ "$ms" -lt 2000 ]'
t0=$(date +%s%N)
"$JACKDAWD" --listen 127.0.0.1:0 --db "$DB" --plugin-dir "$BUILD/plugins" \
    --db-connect-wait 2s >"$WORK/giveup.log" 2>&1
rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
check "--db-connect-wait 2s: gives up within it (exit $rc, ${ms} ms) naming the database" \
    eval '[ "$rc" = 1 ] && [ "$ms" -lt 4000 ] && grep -q "cannot open the database" "$WORK/giveup.log"'
check "... after retrying in between" grep -q 'cannot be reached yet; retrying' "$WORK/giveup.log"
JACKDAW_DB_CONNECT_WAIT=0 "$JACKDAWD" --listen 127.0.0.1:0 --db "$DB" \
    --plugin-dir "$BUILD/plugins" >"$WORK/noretry.log" 2>&1
rc=$?
check "JACKDAW_DB_CONNECT_WAIT=0: no retry, the error at once (exit $rc)" \
    eval '[ "$rc" = 1 ] && ! grep -q "retrying" "$WORK/noretry.log"'
pg_up

bad="postgres://jackdaw:s3cret@127.0.0.1:1/jackdaw"
timeout 20 "$JACKDAWD" --listen 127.0.0.1:0 --db "$bad" --plugin-dir "$BUILD/plugins" \
    --db-connect-wait 1s >"$WORK/bad.log" 2>&1
rc=$?
check "an unreachable database: exit $rc, the URL named without its password" \
    eval '[ "$rc" = 1 ] && grep -qF "postgres://jackdaw:***@127.0.0.1:1/jackdaw" "$WORK/bad.log" && ! grep -q s3cret "$WORK/bad.log"'

sql "CREATE DATABASE other" >/dev/null
psql -X -q "${PG_URL%/*}/other" -c "CREATE TABLE accounts(id int)" >/dev/null
timeout 20 "$JACKDAWD" --listen 127.0.0.1:0 --db "${PG_URL%/*}/other" \
    --plugin-dir "$BUILD/plugins" >"$WORK/foreign.log" 2>&1
rc=$?
check "a foreign database is refused and left alone (exit $rc)" \
    eval '[ "$rc" != 0 ] && grep -q "not a Jackdaw database" "$WORK/foreign.log" && [ "$(psql -X -At "${PG_URL%/*}/other" -c "SELECT count(*) FROM pg_tables WHERE schemaname = '"'"'public'"'"'")" = 1 ]'
finish
