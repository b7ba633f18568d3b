#!/usr/bin/env bash
# The queued-job window on PostgreSQL cluster nodes (issue 17 item 4 with
# issue 16): a node keeps in memory only --queue-window queued jobs; a
# submit past it is inserted with no owner, waits in the database, and any
# node with room claims it (by priority, then id). On a throwaway
# PostgreSQL:
#   - one node, --queue-window 20, a paused queue given 300 submits: it
#     holds at most 20 queued jobs (metrics) and owns at most 20 in the
#     database, the rest are unowned; a cancel of an unowned one applies
#     at once; resumed, every other job succeeds, and the jobs it claimed
#     started in priority order;
#   - a second node joins: 400 more submits to the first node's paused
#     queue, then resume: both nodes run part of the backlog, nothing is
#     lost or run twice, and each node started the jobs it claimed in
#     priority order.
# Prints TAP.
# shellcheck disable=SC2016,SC2034,SC2119
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
# shellcheck source=tests/pg/pg.sh
. tests/pg/pg.sh

pg_test_start
W=20

# start_node NAME: a node with a small window; sets BASE_NAME, PID_NAME.
start_node() { pg_node "$1" --listen 127.0.0.1:0 --lease 2s --queue-window "$W"; }
on() {
    local v="BASE_$1"
    BASE=${!v}
    shift
    "$@"
}
# submit Q FIRST COUNT HANDLER ARGS: COUNT jobs in batches of 50,
# priorities 0-3 in turn; 1 if a batch was refused.
submit() {
    local q=$1 first=$2 count=$3 handler=$4 args=$5 b body
    for ((b = first; b < first + count; b += 50)); do
        body=$(awk -v q="$q" -v b="$b" -v h="$handler" -v a="$args" 'BEGIN {
            printf "{\"jobs\":[";
            for (i = 0; i < 50; i++)
                printf "%s{\"handler\":\"%s\",\"queue\":\"%s\",\"priority\":%d,\"args\":%s}",
                       (i ? "," : ""), h, q, (b + i) % 4, a;
            printf "]}";
        }')
        json_post /v1/jobs/batch "$body"
        status_is 201 || status_is 200 || return 1
    done
}
# queued_mem: the jobs{state="queued"} gauge of the node at BASE.
queued_mem() {
    curl -s "$BASE/metrics" | awk '/^jackdaw_jobs\{state="queued"\}/ {print $2}'
}
# drained Q SECONDS: until queue Q has no unfinished job (cluster-wide).
drained() {
    local i
    for ((i = 0; i < $2 * 10; i++)); do
        [ "$(sql "SELECT count(*) FROM jobs WHERE queue = '$1' AND state < 3")" = 0 ] && return 0
        sleep 0.1
    done
    return 1
}
# inversions Q IDS_SQL: per node, jobs among IDS_SQL that started more than
# 50 ms before the last start of a higher priority on the same node.
inversions() {
    sql "WITH s AS (SELECT id, priority, started_ms, owner_node FROM jobs
             WHERE queue = '$1' AND id IN ($2)),
         m AS (SELECT owner_node, priority, max(started_ms) AS last FROM s
             GROUP BY owner_node, priority)
         SELECT count(*) FROM s WHERE s.started_ms + 50 <
             (SELECT max(m.last) FROM m WHERE m.owner_node = s.owner_node
              AND m.priority > s.priority)"
}

start_node A || exit 1

# ---- one node: a backlog past the window waits unowned, then drains ----
on A req POST /v1/queues/one/pause
check "queue paused" status_is 200
submit one 0 300 echo '{"n":1}'
rc=$?
check "300 jobs submitted in batches" eval '[ $rc = 0 ]'
sleep 1.5 # a claim pass or two
held=$(on A queued_mem)
check "the node holds at most its window in memory ($held queued, window $W)" \
    eval '[ -n "$held" ] && [ "$held" -le $W ]'
owned=$(sql "SELECT count(*) FROM jobs WHERE queue = 'one' AND owner_node IS NOT NULL")
unowned=$(sql "SELECT count(*) FROM jobs WHERE queue = 'one' AND owner_node IS NULL")
check "it owns at most its window in the database ($owned), the rest are unowned ($unowned)" \
    eval '[ "$owned" -le $W ] && [ $((owned + unowned)) = 300 ]'
given=$(curl -s "$BASE_A/metrics" | awk '/^jackdaw_window_jobs_unowned_total/ {print $2}')
check "metrics count the submits left unowned ($given)" eval '[ "${given:-0}" -ge 280 ]'
victim=$(sql "SELECT max(id) FROM jobs WHERE queue = 'one' AND owner_node IS NULL")
on A req POST "/v1/jobs/$victim/cancel"
check "cancel of a job waiting unowned: accepted" eval 'status_is 200 || status_is 202'
on A wait_job "$victim" 10s
check "it is cancelled at once, its queue still paused (the node took it)" \
    body_has '"state":"cancelled"'
first=$(sql "SELECT string_agg(id::text, ',') FROM jobs WHERE queue = 'one' AND owner_node IS NULL")
on A req POST /v1/queues/one/resume
check "a backlog larger than the window drains completely on one node" drained one 60
check "all 299 others succeeded" \
    eval '[ "$(sql "SELECT count(*) FROM jobs WHERE queue = '"'one'"' AND state = 3")" = 299 ]'
inv=$(inversions one "$first")
check "the jobs it claimed started in priority order ($inv out of order)" eval '[ "$inv" = 0 ]'

# ---- two nodes: the second one drains part of the first one's backlog ----
start_node B || exit 1
on A req POST /v1/queues/two/pause
sleep 1.5 # B follows the pause
submit two 1000 400 sleep '{"ms":30}'
rc=$?
check "400 more jobs submitted to A" eval '[ $rc = 0 ]'
sleep 1.5
held_a=$(on A queued_mem)
held_b=$(on B queued_mem)
check "each node holds at most its window ($held_a on A, $held_b on B)" \
    eval '[ "$held_a" -le $W ] && [ "$held_b" -le $W ]'
first=$(sql "SELECT string_agg(id::text, ',') FROM jobs WHERE queue = 'two' AND owner_node IS NULL")
on A req POST /v1/queues/two/resume
check "the backlog drains" drained two 90
check "nothing lost: all 400 succeeded" \
    eval '[ "$(sql "SELECT count(*) FROM jobs WHERE queue = '"'two'"' AND state = 3")" = 400 ]'
nodes=$(sql "SELECT count(DISTINCT owner_node) FROM jobs WHERE queue = 'two'")
check "both nodes ran part of it" eval '[ "$nodes" = 2 ]'
check "no job started twice (one start event each)" \
    eval '[ "$(sql "SELECT count(*) FROM events_all e JOIN jobs j ON j.id = e.job_id WHERE j.queue = '"'two'"' AND e.kind = 0 AND e.data::text LIKE '"'%running%'"'")" = 400 ]'
inv=$(inversions two "$first")
check "each node started the jobs it claimed in priority order ($inv out of order)" \
    eval '[ "$inv" = 0 ]'
finish
