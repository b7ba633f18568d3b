#!/usr/bin/env bash
# tests/cluster/cluster.sh (`make cluster-test`; the short run in `make test`
# is tests/integration/test_cluster.sh): the cluster's proof (issue 16).
#
# A throwaway PostgreSQL (fsync on) and NODES jackdawd nodes on it
# (--lease 2s) on free loopback ports. CLIENTS loops submit exec workflows
# to random nodes; each step appends "<job id>:<step>:<n>:<wall ms>:<node
# pid>" to a marker file (n counts that step's runs: the side effect). For some jobs a
# ?wait= long-poll and an SSE stream are opened on ANOTHER node. During the
# load, ROUNDS times: SIGKILL one node (restarted later on its port), and
# SIGSTOP another for more than two leases, then SIGCONT: it must come back
# fenced (its log tells of the lost lease; late writes refused, or never
# made when the heartbeat finds out first; SQL shows none of them landed) and
# rejoin as a new incarnation (a new jd_nodes row). The last node is never
# disturbed. Then, printed as TAP:
#   - the undisturbed node kept its lease (another node's stall must not
#     stall its heartbeat);
#   - every acknowledged job is found on every live node, terminal, succeeded;
#   - no completion recorded twice for a (job, tag, run) (SQL on events);
#   - every job's history is seq 1..version; nothing left owned by a dead node;
#   - every step of every job left its side effect, and none ran again after
#     its completion was recorded, except at most one per handler thread
#     by a node SIGSTOPped between its last lease check and the call's
#     start (no lease check can close that window; it is counted);
#   - every long-poll and SSE stream on the undisturbed node returned the
#     job's final state, and every answer that came back from any node did.
#
# Environment: JD_BUILD, NODES (3), CLIENTS (4), ROUNDS (1), LOAD_S (seconds
# of load per round, 12), LEASE (2s), JD_KEEP=1 keeps the work directory.
# With NODES=1 (or a build without --lease, phase 1) the disturbances that
# need other nodes are skipped and said so.
# shellcheck disable=SC2016,SC2034
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/../integration/lib.sh"
# shellcheck source=tests/pg/pg.sh
. tests/pg/pg.sh

NODES=${NODES:-3}
CLIENTS=${CLIENTS:-4}
ROUNDS=${ROUNDS:-1}
LOAD_S=${LOAD_S:-12}
LEASE=${LEASE:-2s}
LEASE_S=${LEASE%s}
MARK=$WORK/markers
ACKED=$WORK/acked
STOPFILE=$WORK/stop
mkdir -p "$WORK/polls" "$WORK/sse" "$WORK/jobs"
: >"$MARK"
declare -a PID PORT STARTS_N
CLIENT_PIDS=()
DISTURBED=" " # node numbers signalled at least once

# The long-polls and streams the clients left running (ours, by pid).
curls_left() {
    local p
    for p in $(cat "$WORK/curls" 2>/dev/null); do
        [ "$(cat "/proc/$p/comm" 2>/dev/null)" = curl ] && echo "$p"
    done
}
curls_stop() {
    local p
    for p in $(curls_left); do kill "$p" 2>/dev/null; done
}

# shellcheck disable=SC2317 # the EXIT trap
cluster_cleanup() {
    touch "$STOPFILE"
    local p
    for p in "${CLIENT_PIDS[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${PID[@]}"; do
        [ -n "$p" ] && kill -CONT "$p" 2>/dev/null && kill -KILL "$p" 2>/dev/null
    done
    curls_stop
    wait 2>/dev/null
    cleanup
}
trap cluster_cleanup EXIT

if ! pg_start; then
    notok "a throwaway PostgreSQL starts (tests/pg/pg.sh)"
    finish
    exit 1
fi
sql() { pg_psql -At -F $'\t' -c "$1"; }

HAVE_LEASE=0
grep -q -- '--lease' <<<"$("$JACKDAWD" --help 2>&1)" && HAVE_LEASE=1
if [ "$HAVE_LEASE" = 0 ] && [ "$NODES" -gt 1 ]; then
    echo "# this jackdawd has no --lease (phase 1): one node only"
    NODES=1
fi

# The step: its side effect under a lock (so n counts runs exactly; the
# parent pid says which node ran it), then a little work, so that kills and
# stops land in the middle of steps.
cat >"$WORK/step.sh" <<EOF
#!/bin/sh
exec 9>>"$MARK.lock"
flock 9
n=\$(grep -c "^\$1:\$2:" "$MARK")
echo "\$1:\$2:\$((n + 1)):\$(date +%s%3N):\$PPID" >>"$MARK"
flock -u 9
sleep \${3:-0.1}
EOF
chmod 755 "$WORK/step.sh"

# node_start I: start node I on its port (a free one the first time: a
# fixed one, since a node that lost its lease re-executes itself and binds
# its --listen address again).
node_start() {
    local i=$1 log
    [ -n "${PORT[i]:-}" ] || PORT[i]=$(pg_free_port)
    STARTS_N[i]=$((${STARTS_N[i]:-0} + 1))
    log=$WORK/node$i.${STARTS_N[i]}.log
    local extra=()
    [ "$HAVE_LEASE" = 1 ] && extra=(--lease "$LEASE")
    "$JACKDAWD" --listen "127.0.0.1:${PORT[i]}" --db "$PG_URL" --plugin-dir "$BUILD/plugins" \
        --exec-allow /bin/sh --workers 2 --grace 1s --max-wait 150s --max-replays 1000 \
        "${extra[@]}" 2>"$log" &
    PID[i]=$!
    local addr=
    for _ in $(seq 1 400); do
        addr=$(sed -n 's/.*"msg":"ready".*"addr":"\([^"]*\)".*/\1/p' "$log" | head -n1)
        [ -n "$addr" ] && break
        kill -0 "${PID[i]}" 2>/dev/null || break
        sleep 0.05
    done
    if [ -z "$addr" ]; then
        notok "node $i starts" "$(tail -n 5 "$log")"
        PID[i]=
        return 1
    fi
    PORT[i]=${addr##*:}
}
url() { echo "http://127.0.0.1:${PORT[$1]}"; }
node_log() { cat "$WORK/node$1".*.log 2>/dev/null; }
ready_count() { node_log "$1" | grep -c '"msg":"ready"'; }
node_ids() { sql "SELECT id FROM jd_nodes ORDER BY id" | tr '\n' ' '; }

for i in $(seq 1 "$NODES"); do
    node_start "$i" || exit 1
done
STEADY_ID=$(sql "SELECT max(id) FROM jd_nodes") # the last node started: never disturbed
ok "$NODES node(s) on one PostgreSQL (fsync on), lease ${LEASE}: $(for i in $(seq 1 "$NODES"); do printf '%s ' "${PORT[i]}"; done)"

# ---- the load ----
wf() { # a workflow of three exec steps with a pause between a and b
    local s=$WORK/step.sh
    printf '{"steps":[{"id":"a","call":"exec","args":{"argv":["/bin/sh","%s","${job.id}","a"]}},{"id":"pause","sleep_ms":50},{"id":"b","call":"exec","args":{"argv":["/bin/sh","%s","${job.id}","b","0.3"]}},{"id":"c","call":"exec","args":{"argv":["/bin/sh","%s","${job.id}","c"]}}],"labels":{"client":"%s","n":"%s"}}' \
        "$s" "$s" "$s" "$1" "$2"
}

# One client: submit to random nodes until told to stop; for every 2nd job a
# long-poll and for every 3rd an SSE stream on another node.
client() {
    local c=$1 i=0 n out code id o
    while [ ! -e "$STOPFILE" ]; do
        i=$((i + 1))
        n=$((RANDOM % NODES + 1))
        out=$(curl -sS -m 5 -o - -w '\n%{http_code}' -XPOST "$(url "$n")/v1/jobs" \
            -H 'content-type: application/json' --data-binary "$(wf "$c" "$i")" 2>/dev/null)
        code=${out##*$'\n'}
        if [ "$code" != 201 ]; then
            sleep 0.05
            continue
        fi
        id=$(printf '%s' "${out%$'\n'*}" | sed -n 's/^{"id":"\([0-9]*\)".*/\1/p')
        [ -n "$id" ] || continue
        echo "$id $n" >>"$ACKED.$c"
        o=$(((n + RANDOM % (NODES > 1 ? NODES - 1 : 1)) % NODES + 1))
        [ "$NODES" = 1 ] && o=1
        if [ $((i % 2)) = 0 ]; then
            curl -sS -m 170 -o "$WORK/polls/$id.$o" "$(url "$o")/v1/jobs/$id?wait=150s" 2>/dev/null &
            echo $! >>"$WORK/curls"
        fi
        if [ $((i % 3)) = 0 ]; then
            curl -sS -N -m 170 -H 'Accept: text/event-stream' -o "$WORK/sse/$id.$o" \
                "$(url "$o")/v1/jobs/$id/events" 2>/dev/null &
            echo $! >>"$WORK/curls"
        fi
        sleep 0.0$((RANDOM % 10))
    done
}
for c in $(seq 1 "$CLIENTS"); do
    client "$c" &
    CLIENT_PIDS+=($!)
done
acked_now() { cat "$ACKED".* 2>/dev/null | wc -l; }

pause() { sleep "$1"; }
rejoined_ok=1
fence_seen=1
for r in $(seq 1 "$ROUNDS"); do
    pause "$(awk -v s="$LOAD_S" 'BEGIN{print s/3}')"
    if [ "$NODES" -ge 2 ]; then
        k=$(((r - 1) % (NODES - 1) + 1)) # never the last node
        DISTURBED+="$k "
        echo "# round $r: SIGKILL node $k ($(acked_now) jobs acknowledged so far)"
        kill -KILL "${PID[k]}"
        wait "${PID[k]}" 2>/dev/null
        PID[k]=
    fi
    pause "$(awk -v s="$LOAD_S" 'BEGIN{print s/3}')"
    if [ "$NODES" -ge 3 ]; then
        s=$((r % (NODES - 1) + 1))
        [ "$s" = "$k" ] && s=$((s % (NODES - 1) + 1))
        DISTURBED+="$s "
        before_ids=$(node_ids)
        before_ready=$(ready_count "$s")
        stop_s=$(awk -v l="$LEASE_S" 'BEGIN{print l*2.5+1}')
        echo "# round $r: SIGSTOP node $s for ${stop_s}s (nodes $before_ids; $(acked_now) acknowledged)"
        echo "${PID[s]}" >>"$WORK/stopped"
        kill -STOP "${PID[s]}"
        # Meanwhile, how long the undisturbed node takes to acknowledge a
        # submit (printed, not asserted: a stalled node's open transaction
        # can hold rows every node's commits need).
        t_end=$(($(date +%s%N) / 1000000 + ${stop_s%.*} * 1000))
        probe_max=0
        while [ $(($(date +%s%N) / 1000000)) -lt "$t_end" ]; do
            t=$(curl -s -o /dev/null -m 15 -w '%{time_total}' -XPOST "$(url "$NODES")/v1/jobs" \
                -H 'content-type: application/json' --data-binary '{"handler":"echo","args":{}}')
            t=$(awk -v t="$t" 'BEGIN{printf "%d", t * 1000}')
            [ "$t" -gt "$probe_max" ] && probe_max=$t
            sleep 0.2
        done
        kill -CONT "${PID[s]}"
        echo "# round $r: during the stop the undisturbed node acknowledged submits in at most ${probe_max} ms"
        # It must find it lost its lease and come back as a new incarnation.
        for _ in $(seq 1 300); do
            [ "$(ready_count "$s")" -gt "$before_ready" ] &&
                [ "$(curl -s -o /dev/null -w '%{http_code}' "$(url "$s")/readyz")" = 200 ] && break
            sleep 0.1
        done
        after_ids=$(node_ids)
        echo "# round $r: node $s back; nodes now $after_ids"
        new=0
        for id in $after_ids; do
            [[ " $before_ids " == *" $id "* ]] || new=1
        done
        if ! kill -0 "${PID[s]}" 2>/dev/null || [ "$new" = 0 ] ||
            [ "$(ready_count "$s")" -le "$before_ready" ]; then
            rejoined_ok=0
            echo "# node $s did not rejoin as a new incarnation; its log:"
            node_log "$s" | tail -n 8 | sed 's/^/#   /'
        fi
        # Its late writes refused: said in its log (its /metrics counters
        # start again with the new incarnation, so they are a second witness
        # only when the refusal came after the restart).
        fenced=$(curl -s "$(url "$s")/metrics" | awk '/^jackdaw_cluster_fenced_writes_total/ {n += $2} END {print n + 0}')
        echo "# node $s: $(node_log "$s" | grep -c 'write refused') refused writes in its log, fenced counter now $fenced"
        # Which comes first after SIGCONT, the heartbeat finding the lease
        # gone or a late write being refused, is a race: either way nothing
        # it writes lands (the SQL checks below), and its log must say so.
        # (the files to grep, not a pipe: with pipefail, cat's SIGPIPE once
        # grep -q has matched in an earlier file failed it on long logs)
        if ! grep -qs 'lost its lease' "$WORK/node$s".*.log; then
            fence_seen=0
            echo "# node $s's log does not tell of its lost lease"
        fi
    fi
    pause "$(awk -v s="$LOAD_S" 'BEGIN{print s/3}')"
    if [ "$NODES" -ge 2 ]; then
        node_start "$k" || exit 1
        echo "# round $r: node $k restarted on port ${PORT[k]}"
    fi
done
touch "$STOPFILE"
for p in "${CLIENT_PIDS[@]}"; do wait "$p" 2>/dev/null; done
CLIENT_PIDS=()
cat "$ACKED".* 2>/dev/null | sort -n | uniq >"$ACKED"
total=$(wc -l <"$ACKED")
check "jobs were acknowledged under the disturbances ($total)" [ "$total" -gt 0 ]
if [ "$NODES" -ge 2 ]; then
    check "SIGKILLed nodes came back on their ports" kill -0 "${PID[1]}"
else
    ok "SIGKILL of one node while others run # SKIP one node"
fi
if [ "$NODES" -ge 3 ]; then
    check "the SIGSTOPped node came back as a new incarnation (new jd_nodes row, ready again)" \
        [ "$rejoined_ok" = 1 ]
    check "the SIGSTOPped node found its lease lost (its log) and dropped its jobs" \
        [ "$fence_seen" = 1 ]
else
    ok "SIGSTOP past two leases, fenced, rejoins # SKIP fewer than 3 nodes"
    ok "fenced writes refused # SKIP fewer than 3 nodes"
fi

steady_now=$(sql "SELECT count(*) FROM jd_nodes WHERE id = $STEADY_ID")
check "the undisturbed node kept its lease throughout (node id $STEADY_ID still live)" \
    [ "$steady_now" = 1 ]

# ---- every acknowledged job: wait on the undisturbed node, find on all ----
last=$NODES
export WORK
U=$(url "$last")
awk '{print $1}' "$ACKED" | xargs -P 8 -I{} sh -c \
    "curl -sS -m 100 '$U/v1/jobs/{}?wait=90s' >'$WORK/jobs/{}.json' 2>/dev/null"
missing_elsewhere=0
for i in $(seq 1 "$NODES"); do
    [ -n "${PID[i]}" ] || continue
    # a plain GET of every job on every live node
    m=$(awk '{print $1}' "$ACKED" | xargs -P 8 -I{} curl -s -o /dev/null -w '%{http_code}\n' \
        "$(url "$i")/v1/jobs/{}" | grep -vc '^200$')
    missing_elsewhere=$((missing_elsewhere + m))
done
# The long-polls and streams end with their jobs; any still open now is on
# a connection its node dropped without closing (counted as no answer).
for _ in $(seq 1 100); do
    [ -z "$(curls_left)" ] && break
    sleep 0.2
done
echo "# long-polls and streams still open after the jobs ended: $(curls_left | wc -l)"
curls_stop
check "every acknowledged job is found on every live node (missing answers: $missing_elsewhere)" \
    [ "$missing_elsewhere" = 0 ]

# ---- the database's own account ----
dup=$(sql "SELECT count(*) FROM (SELECT job_id, tag, data::jsonb->'run' FROM events_all WHERE kind = 2
           GROUP BY 1, 2, 3 HAVING count(*) > 1) d")
check "no completion recorded twice for a (job, tag, run) (SQL on events: $dup)" [ "$dup" = 0 ]
gaps=$(sql "SELECT count(*) FROM jobs j WHERE version <> (SELECT count(*) FROM events_all e WHERE e.job_id = j.id)
            OR version <> (SELECT max(seq) FROM events_all e WHERE e.job_id = j.id)")
check "every job's history is seq 1..version ($gaps off)" [ "$gaps" = 0 ]
orphans=$(sql "SELECT count(*) FROM jobs WHERE state < 3 AND owner_node NOT IN (SELECT id FROM jd_nodes)")
check "no unfinished job is owned by a dead node ($orphans)" [ "$orphans" = 0 ]
sql "SELECT job_id, kind, tag, time_ms, data FROM events_all WHERE kind IN (1, 2) ORDER BY job_id, seq" \
    >"$WORK/events.tsv"

python3 tests/cluster/check.py --acked "$ACKED" --jobs "$WORK/jobs" --markers "$MARK" \
    --events "$WORK/events.tsv" --polls "$WORK/polls" --sse "$WORK/sse" \
    --steady "$last" --stopped "$WORK/stopped" --first $((TAPN + 1))
rc=$?
TAPN=$((TAPN + $(python3 tests/cluster/check.py --count)))
[ "$rc" = 0 ] || FAILED=$((FAILED + 1))

# ---- clean stop ----
bad_exit=0
for i in $(seq 1 "$NODES"); do
    [ -n "${PID[i]}" ] || continue
    kill -TERM "${PID[i]}"
    wait "${PID[i]}" || bad_exit=$((bad_exit + 1))
    PID[i]=
done
check "every node exits 0 on SIGTERM after the run ($bad_exit did not)" [ "$bad_exit" = 0 ]
left=$(sql "SELECT count(*) FROM jd_nodes")
check "clean stops leave no node rows ($left)" [ "$left" = 0 ]
if grep -l -E 'Sanitizer|runtime error:' "$WORK"/node*.log >/dev/null 2>&1; then
    notok "no sanitizer reports in the node logs" "$(grep -h -A 8 -E 'Sanitizer|runtime error:' "$WORK"/node*.log | head -n 20)"
else
    ok "no sanitizer reports in the node logs"
fi
echo "1..$TAPN"
finish
