#!/bin/sh
# The load balancer's entrypoint in docker/compose.postgres.yaml: nginx
# with docker/nginx.cluster.conf, its upstream servers kept current.
#
# nginx looks upstream host names up only when it loads its configuration,
# and a node's name does not resolve while its container is stopped (nginx
# would then refuse to start) and may resolve to a new address when it is
# back (nginx would keep sending to the old one). So the servers are
# written as addresses: every 2 s the names in JACKDAW_NODES are resolved
# into /etc/nginx/jackdaw-nodes.conf, which nginx.cluster.conf includes,
# and nginx reloads when that changed (a reload lets requests in flight,
# long-polls and SSE streams, finish on the old workers).
set -eu
NODES=${JACKDAW_NODES:-node1 node2 node3}
PORT=${JACKDAW_NODE_PORT:-8080}
OUT=/etc/nginx/jackdaw-nodes.conf

servers() {
    for name in $NODES; do
        addr=$(getent ahostsv4 "$name" 2>/dev/null | head -n 1 | cut -d' ' -f1) || addr=
        [ -z "$addr" ] || echo "server $addr:$PORT max_fails=2 fail_timeout=5s; # $name"
    done
    # keeps the block valid while no node resolves (requests then get 502)
    echo "server 127.0.0.1:9 down;"
}

servers >"$OUT"
nginx -g 'daemon off;' &
pid=$!
trap 'kill -QUIT "$pid" 2>/dev/null; wait "$pid"; exit 0' QUIT TERM INT
while kill -0 "$pid" 2>/dev/null; do
    sleep 2 &
    wait $! || true
    servers >"$OUT.new"
    if ! cmp -s "$OUT.new" "$OUT"; then
        mv "$OUT.new" "$OUT"
        echo "nginx-nodes: upstream now: $(grep -o '# [a-z0-9-]*' "$OUT" | tr -d '#' | tr '\n' ' ')" >&2
        nginx -s reload || true
    fi
done
wait "$pid"
