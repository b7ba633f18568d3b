#!/usr/bin/env bash
# docker/smoke.sh (`make docker-smoke`): build the image and prove it works as
# users deploy it. Builds docker/Dockerfile, runs it with a named volume,
# submits a job with curl, waits for it to succeed, stops the container with
# SIGTERM (it must exit 0), starts a new container on the same volume and
# finds the job and its history there. Prints TAP lines.
#
# Engine and base image: docker/engine.sh (docker, else podman with runc on
# a local debootstrap base when no registry answers).
#
# Environment: JD_SMOKE_PORT (host port, default: a free one), JD_KEEP=1
# keeps the image and volume afterwards; engine.sh's.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=docker/engine.sh
. docker/engine.sh

IMAGE=localhost/jackdaw:smoke
NAME="jackdaw-smoke-$$"
VOLUME="jackdaw-smoke-vol-$$"
ENGINE_LOG=${TMPDIR:-/tmp}/jackdaw-smoke-engine.log
: >"$ENGINE_LOG"

# shellcheck disable=SC2119
pick_engine

cleanup() {
    E rm -f "$NAME" >/dev/null 2>&1 || true
    if [ "${JD_KEEP:-0}" != 1 ]; then
        E volume rm -f "$VOLUME" >/dev/null 2>&1 || true
    fi
}
trap cleanup EXIT

# ---- the base image ----
base_image
ok "base image $BASE"

# ---- build ----
build_image "$IMAGE" docker/Dockerfile .

user=$(E image inspect --format '{{.Config.User}}' "$IMAGE")
health=$(E image inspect --format '{{json .Config.Healthcheck}}' "$IMAGE")
stopsig=$(E image inspect --format '{{.Config.StopSignal}}' "$IMAGE")
if [ "$user" = jackdaw ] && [[ "$health" == *livez* ]] && [ "$stopsig" = SIGTERM ]; then
    ok "image runs as jackdaw, health-checks /livez, stops with SIGTERM"
else
    not_ok "image config (user='$user' stopsignal='$stopsig' healthcheck=$health)"
fi
size=$(E image inspect --format '{{.Size}}' "$IMAGE")
log "image size: $((size / 1024 / 1024)) MiB"

# ---- run ----
PORT=${JD_SMOKE_PORT:-$(free_port)}
BASE_URL="http://127.0.0.1:$PORT"
E volume create "$VOLUME" >/dev/null

start_container() {
    # podman without systemd cannot schedule health checks by itself and says
    # so on stderr; the check is run by hand below.
    E run -d --name "$NAME" "${RUN_OPTS[@]}" -p "127.0.0.1:$PORT:8080" \
        -v "$VOLUME:/var/lib/jackdaw" "$IMAGE" --workers 2 --exec-allow /bin/sh >/dev/null 2>>"$ENGINE_LOG"
    for _ in $(seq 1 100); do
        if curl -fsS -o /dev/null "$BASE_URL/livez" 2>/dev/null; then
            return 0
        fi
        sleep 0.2
    done
    E logs "$NAME" 2>&1 | tail -n 20 | sed 's/^/#   /'
    return 1
}

if start_container; then ok "container answers /livez on $BASE_URL"; else die "container answers /livez"; fi

# The image's HEALTHCHECK passes: podman runs it on request; docker's own
# scheduler marks the container healthy.
healthy=no
for _ in $(seq 1 60); do
    if [ "${ENGINE[0]}" = podman ]; then
        E healthcheck run "$NAME" >/dev/null 2>>"$ENGINE_LOG" && healthy=yes
    else
        [ "$(E inspect --format '{{.State.Health.Status}}' "$NAME")" = healthy ] && healthy=yes
    fi
    [ $healthy = yes ] && break
    sleep 0.5
done
if [ $healthy = yes ]; then ok "HEALTHCHECK reports healthy"; else not_ok "HEALTHCHECK reports healthy"; fi

uid=$(E exec "$NAME" id -u)
if [ "$uid" != 0 ]; then ok "server runs as uid $uid, not root"; else not_ok "server runs as root"; fi

resp=$(curl -sS -o /dev/stdout -w '\n%{http_code}' -XPOST "$BASE_URL/v1/jobs" \
    -H 'content-type: application/json' -d '{"handler":"echo","args":{"smoke":"hello"}}')
code=${resp##*$'\n'}
body=${resp%$'\n'*}
id=$(echo "$body" | sed -n 's/.*"id" *: *"\([0-9][0-9]*\)".*/\1/p' | head -n1)
if [ "$code" = 201 ] && [ -n "$id" ]; then
    ok "POST /v1/jobs -> 201 (job $id)"
else
    die "POST /v1/jobs -> 201 (got $code: $body)"
fi

job=$(curl -sS "$BASE_URL/v1/jobs/$id?wait=10s")
if echo "$job" | grep -q '"state" *: *"succeeded"'; then
    ok "job $id succeeded"
else
    not_ok "job $id succeeded (got: $job)"
fi

# PID 1 reaps orphans: an exec job leaves a background child behind, which
# is re-parented to PID 1 when the shell exits; no zombie may remain.
curl -sS -o /dev/null -XPOST "$BASE_URL/v1/jobs" -H 'content-type: application/json' \
    -d '{"handler":"exec","args":{"argv":["/bin/sh","-c","setsid sleep 0.2 </dev/null >/dev/null 2>&1 & exit 0"]}}'
sleep 1.5
pid1=$(E exec "$NAME" cat /proc/1/comm)
zombies=$(E exec "$NAME" sh -c 'cat /proc/[0-9]*/stat 2>/dev/null' | awk '$3 == "Z"' | wc -l)
if [ "$zombies" -eq 0 ]; then
    ok "no zombies after an exec job orphans a child (PID 1 is $pid1)"
else
    not_ok "$zombies zombie processes in the container (PID 1 is $pid1)"
fi

# SIGTERM: the server drains and exits 0; tini passes the status on.
E stop -t 30 "$NAME" >/dev/null 2>>"$ENGINE_LOG"
code=$(E inspect --format '{{.State.ExitCode}}' "$NAME")
if [ "$code" = 0 ]; then ok "SIGTERM stops the container with exit 0"; else not_ok "SIGTERM exit code is $code, not 0"; fi
E rm -f "$NAME" >/dev/null 2>>"$ENGINE_LOG"

if start_container; then ok "a new container starts on the same volume"; else die "restart on the same volume"; fi
job=$(curl -sS "$BASE_URL/v1/jobs/$id")
if echo "$job" | grep -q '"state" *: *"succeeded"'; then
    ok "job $id is still there and succeeded after the restart"
else
    not_ok "job $id after restart (got: $job)"
fi
events=$(curl -sS "$BASE_URL/v1/jobs/$id/events")
nev=$(echo "$events" | grep -o '"seq"' | wc -l)
if [ "$nev" -ge 2 ]; then ok "its history survived ($nev events)"; else not_ok "history after restart (got: $events)"; fi

E stop -t 30 "$NAME" >/dev/null 2>>"$ENGINE_LOG"
if [ "${JD_KEEP:-0}" != 1 ]; then
    E rmi -f "$IMAGE" >/dev/null 2>&1 || true
fi
echo "1..$n"
[ "$failures" -eq 0 ]
