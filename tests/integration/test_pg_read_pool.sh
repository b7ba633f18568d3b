#!/usr/bin/env bash
# The PostgreSQL read pool's cap and idle close (storage/pg_read.c) seen
# from outside: a node with --db-readers 3 under many concurrent reads
# (long-polls, SSE streams, lists, finds, gets on 8 HTTP threads) never
# has more than 3 read sessions in pg_stat_activity, and every request
# still completes; once the node goes quiet its read sessions fall to the
# 2 it keeps (--db-reader-idle 1s). When every read connection stays
# busy (reads blocked behind a table lock), a read waits 5 s and gets 503
# "busy", not a 404 or a 17th connection, and /metrics counts the waits,
# the time waited and the timeout. Flags out of range are refused. TAP.
# shellcheck disable=SC2016,SC2119
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
# shellcheck source=tests/pg/pg.sh
. tests/pg/pg.sh

pg_test_start
DB=$PG_URL
reads() {
    pg_psql -At -c "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'jackdawd-read'"
}

out=$("$JACKDAWD" --db "$DB" --db-readers 1 2>&1)
check "--db-readers 1 is refused" grep -q -- '--db-readers must be from 2' <<<"$out"

start_server --db-readers 3 --db-reader-idle 1s --http-threads 8 --workers 4 --lease 30s || {
    finish
    exit 1
}

# Jobs that finish in a second or two, each waited on by a long-poll and
# followed by an SSE stream, while lists, finds and gets hammer the reads.
ids=()
for i in $(seq 1 24); do
    json_post /v1/jobs "{\"handler\":\"sleep\",\"args\":{\"ms\":$((800 + i * 40))},\"labels\":{\"pool\":\"t\"}}"
    ids+=("$(location_id)")
done
check "24 jobs submitted" test "${#ids[@]}" = 24

most=0
(
    while :; do
        reads
        sleep 0.05
    done
) >"$WORK/samples" 2>/dev/null &
sampler=$!
pids=()
for id in "${ids[@]}"; do
    curl -s -o "$WORK/wait.$id" -w '%{http_code}\n' --max-time 30 "$BASE/v1/jobs/$id?wait=20s" \
        >"$WORK/wait.$id.code" &
    pids+=($!)
    curl -s -N -o "$WORK/sse.$id" --max-time 4 "$BASE/v1/jobs/$id/events?stream=1" \
        -H 'Accept: text/event-stream' >/dev/null 2>&1 &
done
for k in $(seq 1 6); do
    (
        for _ in $(seq 1 25); do
            curl -s -o /dev/null -w '%{http_code}\n' "$BASE/v1/jobs?limit=50"
            curl -s -o /dev/null -w '%{http_code}\n' "$BASE/v1/jobs?label=pool:t&limit=10"
            curl -s -o /dev/null -w '%{http_code}\n' "$BASE/v1/jobs/${ids[$((k * 3))]}/events"
        done >"$WORK/reads.$k"
    ) &
    pids+=($!)
done
wait "${pids[@]}"
kill "$sampler" 2>/dev/null
wait "$sampler" 2>/dev/null
most=$(sort -n "$WORK/samples" | tail -n 1)
check "read sessions never exceed --db-readers 3 (most seen: $most)" test "${most:-99}" -le 3
check "the pool was used to its cap (most seen: $most)" test "${most:-0}" -ge 2
bad=$(cat "$WORK"/reads.* | grep -cv '^200$')
check "450 list, find and history reads all answered 200 ($bad not)" test "$bad" = 0
succeeded=0
for id in "${ids[@]}"; do
    [ "$(cat "$WORK/wait.$id.code")" = 200 ] && grep -q '"state":"succeeded"' "$WORK/wait.$id" &&
        succeeded=$((succeeded + 1))
done
check "24 long-polls returned their job succeeded ($succeeded did)" test "$succeeded" = 24

# Quiet now: the reads the node makes by itself close the idle sessions
# past the two it keeps.
n=99
for _ in $(seq 1 100); do
    n=$(reads)
    [ "$n" -le 2 ] && break
    sleep 0.1
done
check "idle read sessions fall back to 2 ($n)" test "$n" -le 2
req GET "/v1/jobs/${ids[0]}"
check "reads go on after the close" body_has '"state":"succeeded"'

# All read connections busy: a session holds jobs locked for 9 s, so the
# reads that have a connection wait behind it and the next one finds none.
pg_psql -c "BEGIN; LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(9); COMMIT;" \
    >/dev/null 2>&1 &
locker=$!
for _ in $(seq 1 100); do
    [ "$(pg_psql -At -c "SELECT count(*) FROM pg_locks WHERE relation = 'jobs'::regclass
        AND mode = 'AccessExclusiveLock' AND granted")" = 1 ] && break
    sleep 0.05
done
blocked=()
for i in 1 2 3 4; do
    curl -s -o /dev/null -w '%{http_code}\n' --max-time 30 "$BASE/v1/jobs/${ids[$i]}/events" \
        >"$WORK/blocked.$i" &
    blocked+=($!)
done
sleep 1
REQ_TIMEOUT=30 req GET "/v1/jobs/${ids[0]}/events"
check "a read that finds every connection busy gets 503, not 404 ($STATUS)" is_problem 503
check "... with a problem saying busy" body_has '"busy"'
wait "${blocked[@]}" "$locker"
codes=$(sort "$WORK"/blocked.* | uniq -c | tr -s ' ' | tr '\n' ';')
check "the reads held behind the lock answer 200 or 503, nothing else ($codes)" \
    test -z "$(cat "$WORK"/blocked.* | grep -v '^200$' | grep -v '^503$')"
check "the node logged the busy pool" grep -q 'read connection stayed busy' "$LOG"
req GET "/v1/jobs/${ids[0]}/events"
check "reads go on once the lock is gone" status_is 200

# /metrics shows the pool: the waits, the time waited (the 503 alone
# waited its full 5 s) and the timeouts; and the cap and open connections.
req GET /metrics
metric() { sed -n "s/^$1{node=\"[0-9]*\"[^}]*} //p" <<<"$BODY" | head -n 1; }
timeouts=$(metric jackdaw_db_read_timeouts_total)
waits=$(metric jackdaw_db_read_waits_total)
waited=$(metric jackdaw_db_read_wait_seconds_total)
check "/metrics counts the read that timed out ($timeouts)" test "${timeouts:-0}" -ge 1
check "/metrics counts reads that waited, at least the timeouts ($waits)" \
    test "${waits:-0}" -ge "${timeouts:-1}"
check "/metrics sums the time waited: at least the 5 s of the 503 ($waited s)" \
    awk -v w="${waited:-0}" 'BEGIN { exit !(w >= 4.9) }'
check "/metrics shows the cap, --db-readers 3" \
    grep -q '^jackdaw_db_read_connections_max{node="[0-9]*"} 3$' <<<"$BODY"
open_now=$(sed -n 's/^jackdaw_db_read_connections{node="[0-9]*",state="open"} //p' <<<"$BODY")
check "/metrics shows the open read connections, 1 to 3 ($open_now)" \
    test "${open_now:-0}" -ge 1 -a "${open_now:-9}" -le 3

stop_server
check "the node stops cleanly" test "$SERVER_RC" = 0
finish
