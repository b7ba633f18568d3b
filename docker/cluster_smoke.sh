#!/usr/bin/env bash
# docker/cluster_smoke.sh (`make docker-cluster-smoke`): run
# docker/compose.postgres.yaml (PostgreSQL, three jackdawd nodes, nginx on
# one port) in a real container engine and use it only through that port,
# as users do. Prints TAP lines and how long each phase took.
#
#   build   the jackdaw image from docker/Dockerfile (as docker/smoke.sh);
#           where no registry answers, PostgreSQL and nginx images with the
#           public images' contract from Debian's packages on the same local
#           base (docker/local/*.Dockerfile, named by docker/compose.local.yaml)
#   up      the compose file; the database and every node pass their
#           healthchecks; three nodes registered under their own hostnames
#   work    workflows submitted through the port, waited on (?wait= and SSE)
#           through the port
#   stop    node2 stopped (SIGTERM) while it runs workflows: it exits 0 and
#           its unfinished jobs finish on the other nodes
#   back    node2 started again: a new incarnation that nginx sends work to
#   crash   node3's jackdawd SIGKILLed mid-workflow: the restart policy
#           brings it back, its old jobs are taken over after the lease
#   down    `stop` (every container exits 0), then `down`: nothing left
#
# Engine: docker/engine.sh (docker compose with docker; podman-compose with
# podman and the runc runtime). With podman, a containers.conf for this run
# (CONTAINERS_CONF) picks runc and default ulimits this machine allows, and
# an extra override lowers the nodes' nofile ulimit when the hard limit is
# below the compose file's 65536.
#
# Environment: JD_SMOKE_PORT (host port, default: a free one), JD_KEEP=1
# keeps the jackdaw image and the database volume afterwards (the local
# PostgreSQL and nginx images are kept as a cache, like the base image);
# engine.sh's.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=docker/engine.sh
. docker/engine.sh

T0=$(date +%s)
PROJECT="jdcluster$$"
PORT=${JD_SMOKE_PORT:-$(free_port)}
URL="http://127.0.0.1:$PORT"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/jackdaw-cluster-smoke.XXXXXX")
export JACKDAW_PORT=$PORT # the compose file's published port

pick_engine podman-compose
FILES=(-f docker/compose.postgres.yaml)
if [ "${ENGINE[0]}" = podman ]; then
    # podman-compose runs plain `podman`: the runtime and the default
    # ulimits (podman asks for more open files than this sandbox's hard
    # limit by default) come from a containers.conf of this run's own.
    hard=$(ulimit -Hn)
    [ "$hard" = unlimited ] && hard=1048576
    nofile=$((hard < 65536 ? hard : 65536))
    cat >"$TMP/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=4096:4096"]
[engine]
runtime = "runc"
EOF
    export CONTAINERS_CONF=$TMP/containers.conf
    COMPOSE=(podman-compose -p "$PROJECT")
else
    COMPOSE=(docker compose -p "$PROJECT")
fi
C() { "${COMPOSE[@]}" "${FILES[@]}" "$@"; }
phase_t=$(date +%s)
phase() {
    local now
    now=$(date +%s)
    log "phase $1: $((now - phase_t)) s"
    phase_t=$now
}

ANON=() # the anonymous volumes of the images' VOLUMEs (compose down keeps them)
cleanup() {
    C down -t 30 >>"$TMP/compose.log" 2>&1 || true
    # podman-compose 1.0.3's down leaves the project's network
    E network rm -f "${PROJECT}_default" >/dev/null 2>&1 || true
    if [ "${JD_KEEP:-0}" != 1 ]; then
        E volume rm -f "${PROJECT}_pg-data" "${ANON[@]}" >/dev/null 2>&1 || true
        E rmi -f jackdaw:latest >/dev/null 2>&1 || true
        rm -rf "$TMP"
    else
        log "kept $TMP and the volume ${PROJECT}_pg-data"
    fi
}
trap cleanup EXIT

# ---- build ----
base_image
ok "base image $BASE"
build_image jackdaw:latest docker/Dockerfile .
if [ "$BASE" = "$LOCAL_BASE" ]; then
    build_image localhost/jackdaw-postgres:15 docker/local/postgres.Dockerfile docker/local
    build_image localhost/jackdaw-nginx:bookworm docker/local/nginx.Dockerfile docker/local
    FILES+=(-f docker/compose.local.yaml)
fi
if [ "${ENGINE[0]}" = podman ] && [ "$nofile" -lt 65536 ]; then
    cat >"$TMP/compose.limits.yaml" <<EOF
services:
  node1: &limits
    ulimits:
      nofile: { soft: $nofile, hard: $nofile }
      nproc: { soft: 4096, hard: 4096 }
  node2: *limits
  node3: *limits
EOF
    FILES+=(-f "$TMP/compose.limits.yaml")
    log "open-file hard limit here: $hard; nodes run with nofile=$nofile"
fi
phase build

# ---- up ----
ctr() { # the container of service $1
    E ps -a --filter "label=com.docker.compose.project=$PROJECT" \
        --filter "label=com.docker.compose.service=$1" --format '{{.Names}}' | head -n 1
}
sql() { E exec "$(ctr postgres)" psql -U jackdaw -d jackdaw -Atc "$1"; }
healthy() { # service $1 passes its healthcheck (run by hand: podman has no scheduler here)
    local c
    c=$(ctr "$1")
    if [ "${ENGINE[0]}" = podman ]; then
        E healthcheck run "$c" >/dev/null 2>&1
    else
        [ "$(E inspect --format '{{.State.Health.Status}}' "$c")" = healthy ]
    fi
}
wait_for() { # wait_for SECONDS CMD...: until CMD succeeds
    local end=$(($(date +%s) + $1))
    shift
    until "$@"; do
        [ "$(date +%s)" -ge "$end" ] && return 1
        sleep 0.5
    done
}
ready() { [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/readyz")" = 200 ]; }

if C up -d >"$TMP/compose.log" 2>&1; then
    ok "compose up -d (${FILES[*]})"
else
    tail -n 20 "$TMP/compose.log" | sed 's/^/#   /'
    die "compose up -d"
fi
if wait_for 90 ready; then ok "nginx answers /readyz on $URL"; else die "/readyz through $URL"; fi
if wait_for 60 healthy postgres; then
    ok "postgres passes its healthcheck (pg_isready)"
else
    not_ok "postgres healthcheck"
fi
all_nodes_healthy() { healthy node1 && healthy node2 && healthy node3; }
if wait_for 60 all_nodes_healthy; then
    ok "node1..3 pass their healthcheck (/livez)"
else
    not_ok "node healthchecks"
fi
names() { sql "SELECT string_agg(split_part(name, ':', 1), ',' ORDER BY name) FROM jd_nodes"; }
three_nodes() { [ "$(names)" = node1,node2,node3 ]; }
if wait_for 60 three_nodes; then
    ok "three nodes registered under their own hostnames ($(sql "SELECT string_agg(name, ' ' ORDER BY name) FROM jd_nodes"))"
else
    not_ok "three nodes registered (jd_nodes: $(names))"
fi
for s in node1 node2 node3; do
    r=$(E inspect --format '{{.RestartCount}}' "$(ctr "$s")" 2>/dev/null || echo '?')
    log "$s restarts while PostgreSQL started: $r"
done
phase up

# ---- work ----
# submit N BODY: N jobs through the port; their ids appended to IDS.
IDS=()
submit() {
    local count=$1 body=$2 id code
    for _ in $(seq 1 "$count"); do
        code=$(curl -s -o "$TMP/post" -w '%{http_code}' -XPOST "$URL/v1/jobs" \
            -H 'content-type: application/json' -d "$body")
        id=$(sed -n 's/^{"id":"\([0-9]*\)".*/\1/p' "$TMP/post")
        [ "$code" = 201 ] && [ -n "$id" ] || return 1
        IDS+=("$id")
    done
}
# all_succeed ID...: each waited on through the port; the count that succeeded.
all_succeed() {
    local id k=0
    for id in "$@"; do
        curl -s -m 90 "$URL/v1/jobs/$id?wait=60s" | grep -q '"state":"succeeded"' && k=$((k + 1))
    done
    echo "$k"
}
WF='{"steps":[{"id":"a","call":"sleep","args":{"ms":1500}},{"id":"b","call":"sleep","args":{"ms":1500}},{"id":"c","call":"sleep","args":{"ms":1500}},{"id":"d","call":"echo","args":{"done":true}}]}'

if submit 6 '{"handler":"echo","args":{"hello":"cluster"}}'; then
    ok "6 jobs submitted through the port"
else
    die "submit through the port (last answer: $(cat "$TMP/post"))"
fi
first=("${IDS[@]}")
k=$(all_succeed "${first[@]}")
if [ "$k" = 6 ]; then ok "6 jobs waited on through the port (?wait=) succeeded"; else not_ok "$k/6 jobs succeeded"; fi
served=$(sql "SELECT count(DISTINCT owner_node) FROM jobs WHERE id IN ($(
    IFS=,
    echo "${first[*]}"
))")
log "the 6 jobs ran on $served nodes"
IDS=()
submit 1 "$WF" || true
curl -s -N -m 40 -H 'Accept: text/event-stream' -o "$TMP/sse" "$URL/v1/jobs/${IDS[0]}/events" || true
if grep -q 'event: end' "$TMP/sse" && grep -q '"succeeded"' "$TMP/sse"; then
    ok "an SSE stream through the port follows a workflow to its end"
else
    not_ok "SSE through the port (got: $(tail -c 300 "$TMP/sse"))"
fi
log "PostgreSQL sessions of the three nodes: $(sql "SELECT string_agg(a || '=' || n, ' ') FROM
    (SELECT application_name a, count(*) n FROM pg_stat_activity WHERE datname = 'jackdaw'
     AND application_name LIKE 'jackdawd%' GROUP BY 1 ORDER BY 1) s")"
phase work

# ---- stop one node ----
IDS=()
submit 18 "$WF" || not_ok "submit 18 workflows"
wave=("${IDS[@]}")
sleep 2 # every node is in its first steps
old2=$(sql "SELECT id FROM jd_nodes WHERE name LIKE 'node2:%'")
held=$(sql "SELECT string_agg(id::text, ',') FROM jobs WHERE owner_node = ${old2:-0} AND state < 3")
on2=$(echo "$held" | tr ',' '\n' | grep -c . || true)
t=$(date +%s)
C stop -t 30 node2 >>"$TMP/compose.log" 2>&1
code=$(E inspect --format '{{.State.ExitCode}}' "$(ctr node2)")
if [ "$code" = 0 ]; then
    ok "node2 stopped with exit 0 in $(($(date +%s) - t)) s, holding $on2 unfinished workflows"
else
    not_ok "node2 stop exit code $code"
fi
t=$(date +%s)
k=$(all_succeed "${wave[@]}")
if [ "$k" = 18 ]; then
    ok "all 18 workflows succeeded with node2 down ($(($(date +%s) - t)) s)"
else
    not_ok "$k/18 workflows succeeded"
fi
# node2 may finish workflows while it drains (--grace); the rest of what
# it held moved to the other nodes.
mine=$(sql "SELECT count(*) FROM jobs WHERE id IN (${held:-0}) AND owner_node = ${old2:-0} AND state = 3")
moved=$(sql "SELECT count(*) FROM jobs WHERE id IN (${held:-0}) AND owner_node <> ${old2:-0} AND state = 3")
if [ "$on2" -gt 0 ] && [ $((mine + moved)) = "$on2" ]; then
    ok "node2's $on2 unfinished workflows: $mine finished while it drained, $moved on node1/node3"
else
    not_ok "node2's $on2 unfinished workflows ($mine finished on node2, $moved elsewhere)"
fi
phase stop

# ---- bring it back ----
C start node2 >>"$TMP/compose.log" 2>&1
back() { [ -n "$(sql "SELECT id FROM jd_nodes WHERE name LIKE 'node2:%' AND id <> ${old2:-0}")" ]; }
if wait_for 60 back && wait_for 30 healthy node2; then
    ok "node2 is back as a new incarnation and healthy"
else
    not_ok "node2 back"
fi
new2=$(sql "SELECT id FROM jd_nodes WHERE name LIKE 'node2:%' ORDER BY id DESC LIMIT 1")
# nginx learns node2's new address within a few seconds (nginx-nodes.sh
# resolves every 2 s and reloads): submit a few jobs a second until one
# runs there.
t=$(date +%s)
on_new2=0
IDS=()
for _ in $(seq 1 30); do
    submit 3 '{"handler":"echo","args":{"again":true}}' || break
    on_new2=$(sql "SELECT count(*) FROM jobs WHERE owner_node = ${new2:-0}")
    [ "$on_new2" -gt 0 ] && break
    sleep 1
done
k=$(all_succeed "${IDS[@]}")
if [ "$on_new2" -gt 0 ] && [ "$k" = "${#IDS[@]}" ]; then
    ok "nginx sends work to node2 again ($(($(date +%s) - t)) s after it was healthy; $k jobs succeeded)"
else
    not_ok "node2 serves through nginx again ($k/${#IDS[@]} succeeded, $on_new2 on node2)"
fi
phase back

# ---- a crash ----
IDS=()
submit 12 "$WF" || not_ok "submit 12 workflows"
wave=("${IDS[@]}")
sleep 2
old3=$(sql "SELECT id FROM jd_nodes WHERE name LIKE 'node3:%'")
on3=$(sql "SELECT count(*) FROM jobs WHERE owner_node = ${old3:-0} AND state < 3")
# SIGKILL jackdawd (tini's child) inside the container, as a crash would.
# shellcheck disable=SC2016 # expanded by the container's shell
E exec "$(ctr node3)" sh -c 'for p in /proc/[0-9]*; do
    [ "$(cat "$p/comm" 2>/dev/null)" = jackdawd ] && kill -KILL "${p#/proc/}"; done' \
    >>"$TMP/compose.log" 2>&1 || true # (the exec dies with the container)
t=$(date +%s)
k=$(all_succeed "${wave[@]}")
if [ "$k" = 12 ]; then
    ok "all 12 workflows succeeded after node3 was SIGKILLed holding $on3 ($(($(date +%s) - t)) s)"
else
    not_ok "$k/12 workflows succeeded after node3's crash"
fi
back3() { [ -n "$(sql "SELECT id FROM jd_nodes WHERE name LIKE 'node3:%' AND id <> ${old3:-0}")" ]; }
if wait_for 60 back3; then
    ok "the restart policy brought node3 back (restarts: $(E inspect --format '{{.RestartCount}}' "$(ctr node3)"))"
else
    not_ok "node3 restarted after its crash"
fi
dups=$(sql "SELECT count(*) FROM (SELECT job_id, tag, data::jsonb->'attempt' FROM events_all
            WHERE kind = 2 GROUP BY 1, 2, 3 HAVING count(*) > 1) d")
if [ "$dups" = 0 ]; then ok "no step completion recorded twice"; else not_ok "$dups duplicate completions"; fi
phase crash

# ---- down ----
t=$(date +%s)
C stop -t 30 >>"$TMP/compose.log" 2>&1
codes=""
for s in lb node1 node2 node3 postgres; do
    codes="$codes $s=$(E inspect --format '{{.State.ExitCode}}' "$(ctr "$s")")"
done
log "stop: $(($(date +%s) - t)) s;$codes"
if [ "$(echo "$codes" | grep -o '=[0-9]*' | sort -u)" = "=0" ]; then
    ok "compose stop: every container exits 0 ($codes)"
else
    not_ok "compose stop exit codes:$codes"
fi
for s in lb node1 node2 node3 postgres; do
    # shellcheck disable=SC2207 # volume names have no spaces
    ANON+=($(E inspect --format '{{range .Mounts}}{{if eq .Type "volume"}}{{.Name}} {{end}}{{end}}' \
        "$(ctr "$s")" | tr ' ' '\n' | grep -v "^${PROJECT}_pg-data$" || true))
done
C down -t 30 >>"$TMP/compose.log" 2>&1
left=$(E ps -a -q --filter "label=com.docker.compose.project=$PROJECT" | wc -l)
if [ "$left" = 0 ]; then ok "compose down leaves no container"; else not_ok "$left containers left"; fi
phase down
log "total: $(($(date +%s) - T0)) s"
echo "1..$n"
[ "$failures" -eq 0 ]
