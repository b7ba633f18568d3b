#!/usr/bin/env bash
# Many large jobs at once (issue 12): what clients send cannot grow the
# server's memory past what --max-job-memory says. JD_BIG_N (default 40)
# clients at once each submit a ~1 MB workflow of 60,000 members that first
# waits for a message, so every accepted job stays live; the server runs
# with --max-job-memory 32m. Checks: some submits are accepted and the rest
# get 503 problem+json with Retry-After (none fails otherwise); the gauge
# jackdaw_job_memory_bytes never passes the bound; the peak RSS (VmHWM)
# stays under 256 MB (before the bound and the slimmed definitions, 40 such
# jobs held ~9 MB each as parsed trees); /livez answers throughout; once
# released every accepted job succeeds with its whole output, the gauge
# comes back to 0, and a large submit is accepted again. Then one job whose
# steps splice a large output over and over fails with output_too_large
# instead of growing the server. Prints TAP.
# shellcheck disable=SC2016,SC2034,SC2119
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

N=${JD_BIG_N:-40}
BOUND=$((32 << 20))
RSS_LIMIT_KB=$((256 * 1024))

start_server --max-body 1m --max-job-memory 32m --sync normal || exit 1
PORT=${BASE##*:}

rss_kb() { awk -v k="$1:" '$1 == k {print $2}' "/proc/$SERVER_PID/status"; }
gauge() { curl -s --max-time 5 "$BASE/metrics" | awk '/^jackdaw_job_memory_bytes /{print $2}'; }
echo 5 >"/proc/$SERVER_PID/clear_refs" # reset the peak (VmHWM) to now
echo "# RSS before: $(rss_kb VmRSS) kB"

# The submitters, a /livez probe and a gauge sampler, all in one script:
# prints "accepted ID" / "busy RETRY-AFTER" / "other STATUS" lines, then
# "livez_failures N" and "gauge_max BYTES".
python3 - "$PORT" "$N" >"$WORK/big.out" 2>"$WORK/big.err" <<'EOF'
import http.client, json, sys, threading, time
port, n = int(sys.argv[1]), int(sys.argv[2])
members = ",".join('"k%d":%d' % (i, i) for i in range(60000))
lock = threading.Lock()
out, done = [], [False]
stats = {"livez_failures": 0, "gauge_max": 0}

def conn():
    return http.client.HTTPConnection("127.0.0.1", port, timeout=120)

def submit(i):
    body = ('{"steps":[{"id":"w","wait":"go"},{"id":"e","call":"echo","args":{"i":%d,%s}}]}'
            % (i, members)).encode()
    c = conn()
    try:
        c.request("POST", "/v1/jobs", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        b = r.read()
        if r.status == 201:
            line = "accepted " + json.loads(b)["id"]
        elif r.status == 503 and r.getheader("Content-Type", "").startswith("application/problem+json"):
            line = "busy %s %s" % (r.getheader("Retry-After"), "max-job-memory" in b.decode())
        else:
            line = "other %d" % r.status
    except Exception as e:
        line = "other %r" % e
    with lock:
        out.append(line)

def probe():
    while not done[0]:
        try:
            c = conn()
            c.request("GET", "/livez")
            ok = c.getresponse().status == 200
            c.close()
            c = conn()
            c.request("GET", "/metrics")
            for l in c.getresponse().read().decode().splitlines():
                if l.startswith("jackdaw_job_memory_bytes "):
                    stats["gauge_max"] = max(stats["gauge_max"], int(l.split()[1]))
            c.close()
        except Exception:
            ok = False
        if not ok:
            stats["livez_failures"] += 1
        time.sleep(0.05)

p = threading.Thread(target=probe)
p.start()
ts = [threading.Thread(target=submit, args=(i,)) for i in range(n)]
for t in ts:
    t.start()
for t in ts:
    t.join()
done[0] = True
p.join()
for l in out:
    print(l)
for k, v in stats.items():
    print(k, v)
EOF
[ -s "$WORK/big.err" ] && sed 's/^/# driver: /' "$WORK/big.err" | head -n 20
accepted=$(grep -c '^accepted ' "$WORK/big.out")
busy=$(grep -c '^busy ' "$WORK/big.out")
others=$(grep -c '^other ' "$WORK/big.out")
peak=$(rss_kb VmHWM)
gmax=$(awk '$1 == "gauge_max" {print $2}' "$WORK/big.out")
echo "# $N submits: $accepted accepted, $busy answered 503, $others other; peak RSS $peak kB;" \
    "gauge max $gmax bytes (bound $BOUND)"
check "some large jobs accepted ($accepted)" [ "$accepted" -gt 0 ]
check "the rest answered 503 ($busy), nothing else ($others)" \
    eval '[ "$busy" -gt 0 ] && [ "$others" = 0 ] && [ $((accepted + busy)) = "$N" ]'
check "each 503 has Retry-After and names --max-job-memory" \
    awk '/^busy / && !/^busy [0-9]+ True$/ {bad = 1} END {exit bad}' "$WORK/big.out"
check "the definitions' gauge stayed within the bound ($gmax <= $BOUND)" \
    eval '[ -n "$gmax" ] && [ "$gmax" -le "$BOUND" ]'
check_perf "peak RSS $peak kB < $RSS_LIMIT_KB kB" [ "$peak" -lt "$RSS_LIMIT_KB" ]
check "/livez answered throughout" grep -qx 'livez_failures 0' "$WORK/big.out"
req GET /metrics
check "/metrics counts the refusals" \
    eval 'grep -q "^jackdaw_jobs_memory_refused_total $busy\$" <<<"$BODY"'

# Release the accepted jobs; each then echoes its 60,000 members.
ok_jobs=0
mapfile -t ids < <(sed -n 's/^accepted //p' "$WORK/big.out")
for id in "${ids[@]}"; do
    json_post "/v1/jobs/$id/messages" '{"topic":"go","data":1}' >/dev/null
done
for id in "${ids[@]}"; do
    wait_job "$id" 60s
    body_has '"state":"succeeded"' && body_has '"k59999":59999' && ok_jobs=$((ok_jobs + 1))
done
check "every accepted job succeeded with its whole output ($ok_jobs/$accepted)" \
    [ "$ok_jobs" = "$accepted" ]
g=
for _ in $(seq 1 50); do
    g=$(gauge)
    [ "$g" = 0 ] && break
    sleep 0.1
done
check "the gauge came back to 0 ($g)" [ "$g" = 0 ]
python3 -c 'import sys; print("{\"handler\":\"echo\",\"args\":{" + ",".join("\"k%d\":%d" % (i, i) for i in range(60000)) + "}}")' >"$WORK/one.json"
req POST /v1/jobs -H 'Content-Type: application/json' --data-binary "@$WORK/one.json"
check "a large job is accepted again" status_is 201

# One job whose 40 steps each echo a ~800 KB output of an earlier step: its
# outputs would pass 16 MiB together (as trees, 200 such steps took main
# past 2 GB and killed it under ulimit -v), so a step fails the job with
# output_too_large and the server stays small.
python3 -c '
import json
a = json.loads("{" + ",".join("\"k%d\":%d" % (i, i) for i in range(55000)) + "}")
steps = [{"id": "a", "call": "echo", "args": a}]
steps += [{"id": "b%d" % i, "call": "echo", "args": {"v": "${steps.a.output}"}} for i in range(40)]
print(json.dumps({"steps": steps}, separators=(",", ":")))' >"$WORK/chain.json"
echo 5 >"/proc/$SERVER_PID/clear_refs"
req POST /v1/jobs -H 'Content-Type: application/json' --data-binary "@$WORK/chain.json"
CHAIN=$(location_id)
wait_job "$CHAIN" 120s
peak=$(rss_kb VmHWM)
echo "# chained outputs: peak RSS $peak kB"
check "a job whose step outputs pile up fails with output_too_large" \
    eval 'body_has "\"state\":\"failed\"" && body_has "\"kind\":\"output_too_large\""'
check_perf "and the peak RSS stays under $RSS_LIMIT_KB kB ($peak kB)" [ "$peak" -lt "$RSS_LIMIT_KB" ]
check "/livez still answers" eval 'req GET /livez && status_is 200'

stop_server
check "stops cleanly: exit 0" [ "$SERVER_RC" = 0 ]
finish
