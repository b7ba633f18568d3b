#!/usr/bin/env bash
# SSE memory: a stream reads the job's history a page at a time as the
# client drains it, so memory per stream does not grow with the history.
# A count_to job with a long history (JD_SSE_N, default 50,000: 100,000
# events, ~16 MB of SSE per stream) and 8 streams from Last-Event-ID: 0 at
# once: every stream gets every event id in order with no gap and the end
# event, and the server's peak RSS grows by less than 20 MB over its RSS
# before the streams (loading the history, as before, took 8 x 100k events
# = hundreds of MB). The peak growth is printed. Prints TAP.
# shellcheck disable=SC2016,SC2034,SC2119
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

N=${JD_SSE_N:-50000}
STREAMS=${JD_SSE_STREAMS:-8}
LIMIT_KB=$((20 * 1024))

start_server --sync normal || exit 1

json_post /v1/jobs "{\"process\":\"counter\",\"method\":\"count_to\",\"input\":{\"n\":$N}}"
JOB=$(location_id)
for _ in $(seq 1 12); do
    wait_job "$JOB" 10s
    body_has '"state":"succeeded"' && break
done
check "count_to n=$N succeeded" body_has "\"count\":$N"
VERSION=$(sed -n 's/.*"version":\([0-9]*\).*/\1/p' <<<"$BODY")
echo "# job version (last event id): $VERSION"

rss_kb() { awk -v k="$1:" '$1 == k {print $2}' "/proc/$SERVER_PID/status"; }
before=$(rss_kb VmRSS)
echo 5 >"/proc/$SERVER_PID/clear_refs" # reset the peak (VmHWM) to now
pids=()
t0=$(date +%s%N)
for i in $(seq 1 "$STREAMS"); do
    # each stream checks its own ids on the fly: consecutive from 1, then "end"
    (curl -s -N --max-time 120 -H 'Accept: text/event-stream' -H 'Last-Event-ID: 0' \
        "$BASE/v1/jobs/$JOB/events" |
        awk '/^id: /{ if ($2 != last + 1) gaps++; last = $2; n++ }
             /^event: end/{ ended = 1 }
             END { printf "%d %d %d %d\n", n, last, gaps, ended }' >"$WORK/stream.$i") &
    pids+=($!)
done
wait "${pids[@]}"
ms=$((($(date +%s%N) - t0) / 1000000))
peak=$(rss_kb VmHWM)
growth=$((peak - before))
echo "# $STREAMS streams x $VERSION events in $ms ms; server RSS before ${before} kB, peak ${peak} kB, growth ${growth} kB ($((growth / STREAMS)) kB per stream)"

good=0
for i in $(seq 1 "$STREAMS"); do
    read -r n last gaps ended <"$WORK/stream.$i"
    if [ "$n" = "$VERSION" ] && [ "$last" = "$VERSION" ] && [ "$gaps" = 0 ] && [ "$ended" = 1 ]; then
        good=$((good + 1))
    else
        echo "# stream $i: $n events, last id $last, $gaps gaps, end $ended"
    fi
done
check "all $STREAMS streams: ids 1..$VERSION in order, no gap, then end" [ "$good" = "$STREAMS" ]
check_perf "server peak RSS growth ${growth} kB < ${LIMIT_KB} kB" [ "$growth" -lt "$LIMIT_KB" ]

# Resuming in the middle still starts at the right place.
curl -s -N --max-time 20 -H 'Accept: text/event-stream' -H "Last-Event-ID: $((VERSION - 3))" \
    "$BASE/v1/jobs/$JOB/events" >"$WORK/tail"
check "resume from Last-Event-ID: $((VERSION - 3)): the last three events, then end" \
    eval '[ "$(grep -c "^id: " "$WORK/tail")" = 3 ] && grep -q "^id: $VERSION\$" "$WORK/tail" && grep -q "^event: end" "$WORK/tail"'
stop_server
check "exit 0" [ "$SERVER_RC" = 0 ]
finish
