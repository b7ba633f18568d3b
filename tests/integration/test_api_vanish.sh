#!/usr/bin/env bash
# Clients that vanish: with --max-parked 4, clients that close (or reset)
# their connection while parked in a long-poll, while an SSE stream waits
# for the job or is in the middle of sending its history, or half-way
# through sending a request body, give back their parked slot and watch at
# once: the parked gauge returns to 0 within a short bounded time (well
# before any wait or heartbeat would end) and later long-polls and streams
# are served, not 429. Prints TAP.
# shellcheck disable=SC2016,SC2034,SC2119
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

# --max-wait and --heartbeat far beyond the bound below: only noticing the
# hang-up can bring the gauge back in time.
start_server --max-parked 4 --max-wait 60s --heartbeat 60s --sync normal || exit 1
PORT=${BASE##*:}

parked() { curl -s --max-time 5 "$BASE/metrics" | awk '/^jackdaw_http_parked_connections /{print $2}'; }
# Poll the gauge until it is $1, for at most 3 s; GAUGE_MS says how long it took.
gauge_back_to() {
    local t0 v
    t0=$(date +%s%N)
    for _ in $(seq 1 60); do
        v=$(parked)
        GAUGE_MS=$((($(date +%s%N) - t0) / 1000000))
        [ "$v" = "$1" ] && return 0
        sleep 0.05
    done
    return 1
}
# Four long-polls with a 1 s wait at once: each must be answered 200 (a 429
# means a slot is still held by a client that left).
four_long_polls_served() {
    local pids=() i ok=0
    for i in 1 2 3 4; do
        curl -s -o /dev/null -w '%{http_code}\n' --max-time 10 "$BASE/v1/jobs/$WJ?wait=1s" >"$WORK/lp.$i" &
        pids+=($!)
    done
    wait "${pids[@]}"
    for i in 1 2 3 4; do [ "$(cat "$WORK/lp.$i")" = 200 ] && ok=$((ok + 1)); done
    [ "$ok" = 4 ]
}
# check_back "what": one TAP line, the gauge back to 0 and how long it took.
check_back() {
    if gauge_back_to 0; then ok "$1: gauge back to 0 in ${GAUGE_MS} ms"; else notok "$1: gauge back to 0" "gauge $(parked)"; fi
}
# Wait until the gauge shows $1 parked (the clients are in place).
gauge_reaches() { for _ in $(seq 1 100); do [ "$(parked)" = "$1" ] && return 0; sleep 0.05; done; return 1; }

json_post /v1/jobs '{"steps":[{"id":"w","wait":"never","timeout_ms":600000}]}'
WJ=$(location_id)
check "a job that waits forever" status_is 201

# ---- mid-wait: curl gives up during ?wait= ----
pids=()
for _ in 1 2 3 4; do
    curl -s -o /dev/null --max-time 1 "$BASE/v1/jobs/$WJ?wait=50s" &
    pids+=($!)
done
check "four long-polls parked (gauge 4)" gauge_reaches 4
req GET "/v1/jobs/$WJ?wait=5s"
check "a fifth long-poll: 429" is_problem 429
wait "${pids[@]}"
check_back "long-polls whose clients left"
check "then four long-polls are served, none 429" four_long_polls_served

# ---- mid-wait: connections reset (RST) and half-closed ----
python3 - "$PORT" "$WJ" <<'EOF' &
import socket, struct, sys, time
port, job = int(sys.argv[1]), sys.argv[2]
socks = []
for i in range(4):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(f"GET /v1/jobs/{job}?wait=50s HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    socks.append(s)
time.sleep(1.0)
for i, s in enumerate(socks):
    if i % 2 == 0:  # abortive close: RST instead of FIN
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    else:  # half-close: the client will send nothing more and is gone
        s.shutdown(socket.SHUT_WR)
time.sleep(3)
EOF
PY=$!
check "four raw long-polls parked" gauge_reaches 4
sleep 1.2
check_back "reset and half-closed long-polls"
wait "$PY"
check "then four long-polls are served, none 429" four_long_polls_served

# ---- mid-wait on a keep-alive connection that long-polled before ----
# Each connection waits once to its end (a 200 after 300 ms), then waits
# again on the same socket and hangs up: the second wait's hang-up is
# noticed too (the socket's watch is re-armed for the new request).
python3 - "$PORT" "$WJ" <<'EOF' &
import socket, sys, time
port, job = int(sys.argv[1]), sys.argv[2]
socks = []
for i in range(4):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(f"GET /v1/jobs/{job}?wait=300ms HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    socks.append(s)
for s in socks:
    s.settimeout(5)
    got = b""
    while not got.rstrip().endswith(b"}"):
        got += s.recv(65536)
    assert got.startswith(b"HTTP/1.1 200"), got[:80]
for s in socks:
    s.sendall(f"GET /v1/jobs/{job}?wait=50s HTTP/1.1\r\nHost: x\r\n\r\n".encode())
time.sleep(1.0)
for s in socks:
    s.close()
time.sleep(3)
EOF
PY=$!
check "four keep-alive long-polls parked again (gauge 4)" gauge_reaches 4
sleep 1.2
check_back "second long-polls on keep-alive connections whose clients left"
wait "$PY"
check "then four long-polls are served, none 429" four_long_polls_served

# ---- mid-SSE: streams waiting for a change ----
pids=()
for _ in 1 2 3 4; do
    curl -s -o /dev/null -N --max-time 1 -H 'Accept: text/event-stream' "$BASE/v1/jobs/$WJ/events" &
    pids+=($!)
done
check "four SSE streams open (gauge 4)" gauge_reaches 4
req GET "/v1/jobs/$WJ/events" -H 'Accept: text/event-stream'
check "a fifth stream: 429" is_problem 429
wait "${pids[@]}"
check_back "SSE streams whose clients left"
check "then four long-polls are served, none 429" four_long_polls_served

# ---- mid-SSE: clients that leave while a long history is being sent ----
json_post /v1/jobs '{"process":"counter","method":"count_to","input":{"n":3000}}'
CJ=$(location_id)
wait_job "$CJ"
check "a job with 6000 events" body_has '"count":3000'
pids=()
for _ in 1 2 3 4; do
    # read 20 KB of the ~1 MB stream, then close (head exits, curl gets SIGPIPE)
    (curl -s -N --max-time 10 -H 'Accept: text/event-stream' "$BASE/v1/jobs/$CJ/events" | head -c 20000 >/dev/null) &
    pids+=($!)
done
wait "${pids[@]}"
check_back "streams left mid-history"

# ---- mid-body: requests whose body never finishes ----
python3 - "$PORT" "$WJ" <<'EOF'
import socket, struct, sys
port, job = int(sys.argv[1]), sys.argv[2]
for i in range(8):
    s = socket.create_connection(("127.0.0.1", port))
    path = "/v1/jobs" if i % 2 == 0 else f"/v1/jobs/{job}/messages"
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Content-Length: 5000\r\n\r\n{{\"handler\":\"echo\",".encode())
    if i % 4 == 3:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()
EOF
check "bodies cut short: gauge stays 0" gauge_back_to 0
check "then four long-polls are served, none 429" four_long_polls_served

# ---- and the waits that stay still work ----
curl -s --max-time 10 "$BASE/v1/jobs/$WJ?wait=8s" >"$WORK/stay.out" &
STAY=$!
gauge_reaches 1
req POST "/v1/jobs/$WJ/cancel"
wait "$STAY"
check "a long-poll that stays is answered by the job's end" grep -q '"state":"cancelled"' "$WORK/stay.out"
check "gauge 0 at the end" gauge_back_to 0
req GET /metrics
check "no 429 after the first two" eval 'body_has "jackdaw_http_parked_rejected_total 2"'
check "server process alive" kill -0 "$SERVER_PID"
stop_server
check "exit 0" [ "$SERVER_RC" = 0 ]
finish
