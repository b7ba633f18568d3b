#!/usr/bin/env bash
# Queue limits hold for the whole cluster (issue 16): three jackdawd nodes
# on one throwaway PostgreSQL. A queue with max_running 2 whose jobs are
# submitted to all three nodes never runs more than 2 at once (each exec
# job records when its process started and stopped; the intervals are
# checked afterwards), and every job finishes; with max_running 1 the
# jobs start in submission order whichever node took them. A rate of 3 per second
# across the nodes spreads 15 starts over at least 4 s (per node it would
# be 3 bursts at once). SIGKILL a node while the queue is busy: once its
# lease lapses the other two run 2 at once again, still never more, and
# every job, its own included, finishes. Prints TAP.
# shellcheck disable=SC2016,SC2034,SC2119
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
# shellcheck source=tests/pg/pg.sh
. tests/pg/pg.sh

pg_test_start
RUNS=$WORK/runs
mkdir -p "$RUNS"

NODE_FLAGS=(--lease 2s --exec-allow /bin/sh --workers 4) # start_node (lib.sh)
for n in A B C; do
    start_node "$n" || exit 1
done
check "three nodes joined" eval '[ "$(sql "SELECT count(*) FROM jd_nodes")" = 3 ]'

# put_limits QUEUE JSON SHOWN: set on A, then wait until every node shows
# SHOWN in the queue (each node follows the stored controls within a
# second; until then it applies what it knew).
put_limits() {
    on A req PUT "/v1/queues/$1" -H 'Content-Type: application/json' --data-binary "$2"
    local n
    for n in A B C; do
        for _ in $(seq 1 50); do
            on "$n" req GET "/v1/queues/$1"
            body_has "$3" && break
            sleep 0.1
        done
    done
}

# submit NODE QUEUE TAG MS: an exec job that sleeps MS and appends
# "<start ns> <stop ns>" of its run to $RUNS/TAG (a run again after a
# takeover appends a second line). Sets JOB.
SCRIPT_JSON=$(python3 -c 'import json,sys; print(json.dumps(sys.argv[1]))' \
    's=$(date +%s%N); sleep "$2"; e=$(date +%s%N); echo "$s $e" >>"$1"')
submit() {
    local secs
    secs=$(awk -v m="$4" 'BEGIN { printf "%.3f", m / 1000 }')
    on "$1" json_post /v1/jobs "{\"queue\":\"$2\",\"handler\":\"exec\",\"args\":{\"argv\":[\"/bin/sh\",\"-c\",$SCRIPT_JSON,\"sh\",\"$RUNS/$3\",\"$secs\"]}}"
    JOB=$(location_id)
}

# submit_round QUEUE N MS: N jobs of MS ms each to A, B, C in turn (the
# runs' files QUEUE.1..N); their ids in ids.
submit_round() {
    local i nodes=(A B C)
    ids=()
    for i in $(seq 1 "$2"); do
        submit "${nodes[$((i % 3))]}" "$1" "$1.$i" "$3"
        ids+=("$JOB")
    done
}

# most_at_once FILES...: the most runs whose [start, stop] overlap.
most_at_once() {
    cat "$@" | python3 -c '
import sys
ev = []
for line in sys.stdin:
    p = line.split()
    if len(p) == 2:
        ev.append((int(p[0]), 1))
        ev.append((int(p[1]), -1))
ev.sort(key=lambda e: (e[0], e[1]))  # a stop before a start at the same ns
cur = most = 0
for _, d in ev:
    cur += d
    most = max(most, cur)
print(most)'
}

# wait_all IDS...: every job terminal; prints how many succeeded.
wait_all() {
    local id good=0
    for id in "$@"; do
        on A wait_job "$id" 60s
        body_has '"state":"succeeded"' && good=$((good + 1))
    done
    echo "$good"
}

# ---- max_running 2 across three nodes ----
put_limits lim '{"max_running":2}' '"max_running":2'
check "every node applies max_running 2" body_has '"max_running":2'
submit_round lim 24 300
check "24 jobs submitted to the three nodes" test "${#ids[@]}" = 24
good=$(wait_all "${ids[@]}")
check "all 24 finished succeeded ($good)" test "$good" = 24
runs=$(cat "$RUNS"/lim.* | wc -l)
most=$(most_at_once "$RUNS"/lim.*)
check "24 runs, never more than 2 at once cluster-wide (most: $most)" \
    eval '[ "$runs" = 24 ] && [ "$most" -le 2 ]'
check "... and the limit was used: 2 at once at some point" test "$most" = 2
check "no grant is left once the queue is idle" eval \
    '[ "$(sql "SELECT count(*) FROM queue_grants g JOIN jobs j ON j.id = g.job_id WHERE j.state = 0")" = 0 ]'

# ---- turns: the next job to start is the queue's next, whichever node ----
# max_running 1 and jobs submitted to A, B and C in turn: they start in
# submission order (run order: priority, then id), so no node's jobs wait
# while another node's later ones run.
put_limits turns '{"max_running":1}' '"max_running":1'
submit_round turns 9 300
good=$(wait_all "${ids[@]}")
check "all 9 jobs of the queue with max_running 1 finished ($good)" test "$good" = 9
order=$(for i in $(seq 1 9); do echo "$(cut -d' ' -f1 "$RUNS/turns.$i") $i"; done |
    sort -n | awk '{ printf "%s ", $2 }')
check "one at a time (most: $(most_at_once "$RUNS"/turns.*))" \
    test "$(most_at_once "$RUNS"/turns.*)" = 1
# (The first two may swap: both nodes ask at once for a queue with no
# demand yet, and the first to ask takes the free slot.)
first_two=$(awk '{ if ($1 < $2) print $1, $2; else print $2, $1 }' <<<"$order")
rest=$(cut -d' ' -f3- <<<"$order")
check "they started in submission order across the nodes ($order)" \
    test "$first_two $rest" = "1 2 3 4 5 6 7 8 9 "

# ---- a rate across three nodes ----
put_limits rl '{"rate":{"limit":3,"per":"1s"}}' '"rate":{"limit":3,"per":"1s"}'
check "every node applies the rate" body_has '"rate":{"limit":3,"per":"1s"}'
submit_round rl 15 10
good=$(wait_all "${ids[@]}")
check "all 15 rate-limited jobs finished ($good)" test "$good" = 15
starts=$(cat "$RUNS"/rl.* | awk '{print $1}' | sort -n)
span=$(awk 'NR == 1 { f = $1 } { l = $1 } END { printf "%d", (l - f) / 1000000 }' <<<"$starts")
# A bucket of 3 refilled at 3/s: 3 at once, then one every 1/3 s: the
# 15th start at least 4 s after the first (per node it would be 3+3+3
# at once and the rest within a second).
check "15 starts at 3/s (bucket 3) take at least 3.8 s cluster-wide (${span} ms)" \
    test "$span" -ge 3800
worst=$(awk '{ t[NR] = $1 } END { m = 0; for (i = 1; i <= NR; i++) { n = 0;
    for (k = i; k <= NR && t[k] - t[i] < 1000000000; k++) n++; if (n > m) m = n }; print m }' <<<"$starts")
check "no 1 s window has more than 3 + 3 starts (burst + refill; most: $worst)" test "$worst" -le 6
on C req GET /v1/queues/rl
check "any node shows the cluster's bucket (rate_available)" body_has '"rate_available":'

# ---- a node killed while the queue is busy frees its part ----
# A queue at max_running 2 with 24 jobs of 1 s on all nodes; A dies
# while it runs one. Its jobs are taken over after its lease (2 s) and
# run again elsewhere (their first run's process, orphaned, ends by
# itself before that); B and C then run 2 at once.
put_limits busy '{"max_running":2}' '"max_running":2'
submit_round busy 24 1000
for _ in $(seq 1 50); do
    [ "$(sql "SELECT count(*) FROM jobs j JOIN jd_nodes n ON n.id = j.owner_node
        WHERE j.queue = 'busy' AND j.state = 1 AND n.id = (SELECT min(id) FROM jd_nodes)")" -ge 1 ] &&
        break
    sleep 0.05
done
killed_at=$(date +%s%N)
kill -KILL "$PID_A"
wait "$PID_A" 2>/dev/null
good=0
for id in "${ids[@]}"; do
    on B wait_job "$id" 60s
    body_has '"state":"succeeded"' && good=$((good + 1))
done
check "all 24 jobs finished succeeded, A's own included ($good)" test "$good" = 24
most=$(most_at_once "$RUNS"/busy.*)
check "never more than 2 at once, before, during and after the loss (most: $most)" \
    test "$most" -le 2
after=$(cat "$RUNS"/busy.* | awk -v k="$killed_at" '$1 > k + 3500000000' | most_at_once /dev/stdin)
check "after A's lease lapsed, B and C ran 2 at once (most: $after)" test "$after" = 2
check "A's node row is gone (taken over)" eval '[ "$(sql "SELECT count(*) FROM jd_nodes")" = 2 ]'

kill -TERM "$PID_B" "$PID_C"
wait "$PID_B"
rc_b=$?
wait "$PID_C"
rc_c=$?
check "B and C stop cleanly (exit $rc_b, $rc_c)" eval '[ "$rc_b" = 0 ] && [ "$rc_c" = 0 ]'
NODES=()
finish
