#!/usr/bin/env bash
# tests/cluster/lb.sh: docker/nginx.cluster.conf (the load balancer of
# docker/compose.postgres.yaml) in front of three local nodes on a
# throwaway PostgreSQL, since no container engine runs here: the config
# with node1..3 pointed at loopback ports. Through the one port: workflows
# that wait for a message are submitted, long-polled (?wait=) and streamed
# (SSE), and sent their message, each request landing on whichever node
# nginx picks; every wait and stream must end with the final state. Skips
# when nginx is not installed (apt-get install nginx-light). Prints TAP.
# shellcheck disable=SC2016,SC2034
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/../integration/lib.sh"
# shellcheck source=tests/pg/pg.sh
. tests/pg/pg.sh

NGINX=$(command -v nginx || ls /usr/sbin/nginx 2>/dev/null)
if [ -z "$NGINX" ]; then
    ok "nginx in front of three nodes # SKIP nginx is not installed"
    finish
    exit 0
fi
if ! pg_start nofsync; then
    notok "a throwaway PostgreSQL starts (tests/pg/pg.sh)"
    finish
    exit 1
fi
declare -a PID PORT
NGX_PID=
# shellcheck disable=SC2317 # the EXIT trap
lb_cleanup() {
    [ -n "$NGX_PID" ] && kill "$NGX_PID" 2>/dev/null
    local p
    for p in "${PID[@]}"; do [ -n "$p" ] && kill -KILL "$p" 2>/dev/null; done
    wait 2>/dev/null
    cleanup
}
trap 'lb_cleanup; pg_stop' EXIT

for i in 1 2 3; do
    PORT[i]=$(pg_free_port)
    "$JACKDAWD" --listen "127.0.0.1:${PORT[i]}" --db "$PG_URL" --plugin-dir "$BUILD/plugins" \
        --lease 2s 2>"$WORK/node$i.log" &
    PID[i]=$!
    for _ in $(seq 1 200); do
        grep -q '"msg":"ready"' "$WORK/node$i.log" && break
        sleep 0.05
    done
done
LBPORT=$(pg_free_port)
mkdir -p "$WORK/ngx/logs"
# the servers docker/nginx-nodes.sh would write, as loopback ports
for i in 1 2 3; do
    echo "server 127.0.0.1:${PORT[i]} max_fails=2 fail_timeout=5s; # node$i"
done >"$WORK/ngx/jackdaw-nodes.conf"
sed -e "s|/etc/nginx/jackdaw-nodes.conf|$WORK/ngx/jackdaw-nodes.conf|" \
    -e "s/listen 8080;/listen 127.0.0.1:$LBPORT;/" docker/nginx.cluster.conf >"$WORK/ngx/nginx.conf"
check "docker/nginx.cluster.conf passes nginx -t" "$NGINX" -q -t -p "$WORK/ngx" -c "$WORK/ngx/nginx.conf" \
    -g "pid $WORK/ngx/nginx.pid; error_log $WORK/ngx/logs/error.log;"
"$NGINX" -p "$WORK/ngx" -c "$WORK/ngx/nginx.conf" \
    -g "pid $WORK/ngx/nginx.pid; error_log $WORK/ngx/logs/error.log; daemon off;" &
NGX_PID=$!
BASE=http://127.0.0.1:$LBPORT
for _ in $(seq 1 100); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$BASE/readyz")" = 200 ] && break
    sleep 0.05
done
req GET /readyz
check "the load balancer answers /readyz" status_is 200

N=9
ids=()
for n in $(seq 1 $N); do
    json_post /v1/jobs '{"steps":[{"id":"w","wait":"go","timeout_ms":60000},{"id":"e","call":"echo","args":{"n":1}}]}'
    id=$(location_id)
    ids+=("$id")
    curl -s -N -m 30 -H 'Accept: text/event-stream' -o "$WORK/sse.$n" "$BASE/v1/jobs/$id/events" &
    curl -s -m 30 -o "$WORK/wait.$n" "$BASE/v1/jobs/$id?wait=25s" &
done
sleep 0.5
sent=0
for id in "${ids[@]}"; do
    json_post "/v1/jobs/$id/messages" '{"topic":"go","data":true}'
    { status_is 202 || status_is 200; } && sent=$((sent + 1))
done
check "messages through the load balancer accepted ($sent/$N)" [ "$sent" = "$N" ]
# the long-polls and streams end with their jobs
for _ in $(seq 1 200); do
    [ "$(cat "$WORK"/wait.* 2>/dev/null | grep -c '"state":"succeeded"')" = "$N" ] &&
        [ "$(cat "$WORK"/sse.* 2>/dev/null | grep -c 'event: end')" = "$N" ] && break
    sleep 0.1
done
w=$(cat "$WORK"/wait.* 2>/dev/null | grep -c '"state":"succeeded"')
s=$(cat "$WORK"/sse.* 2>/dev/null | grep -c 'event: end')
check "every ?wait= through the load balancer returned the final state ($w/$N)" [ "$w" = "$N" ]
check "every SSE stream through the load balancer ended ($s/$N)" [ "$s" = "$N" ]
served=0
for i in 1 2 3; do
    grep -q '"path":"/v1/jobs"' "$WORK/node$i.log" && served=$((served + 1))
done
check "submits were spread over the nodes ($served of 3 took some)" [ "$served" -ge 2 ]
finish
