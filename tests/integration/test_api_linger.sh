#!/usr/bin/env bash
# Lingering close: a client that sends its whole body before reading (as
# Python's http.client does) gets the early answer to an oversized or
# unwanted body (413 over --max-body, 404) instead of a broken pipe,
# because the server keeps reading and dropping the rest for a bounded
# time and size before it closes. A client that never stops sending is cut
# off after that bound, and lingering sockets do not stop others being
# served. Prints TAP.
# shellcheck disable=SC2016,SC2034,SC2119
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

start_server --max-body 64k || exit 1
PORT=${BASE##*:}

# py_post PATH SIZE CONTENT-TYPE: POST SIZE bytes with http.client (body sent
# in full before the response is read); prints "STATUS CONTENT-TYPE BODY"
# or "error NAME".
py_post() {
    python3 - "$PORT" "$@" <<'EOF'
import http.client, sys
port, path, size, ctype = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
try:
    c.request("POST", path, body=b" " * size, headers={"Content-Type": ctype})
    r = c.getresponse()
    print(r.status, r.getheader("Content-Type"), r.read().decode()[:300].replace("\n", " "))
except Exception as e:
    print("error", type(e).__name__, e)
EOF
}

for size in 100000 1000000 8000000; do
    out=$(py_post /v1/jobs "$size" application/json)
    check "http.client, $size-byte body over --max-body 64k: 413 problem+json (${out:0:60})" \
        eval '[[ "$out" == "413 application/problem+json "*"\"status\":413"* ]]'
done
out=$(py_post /v1/nowhere 2000000 application/json)
check "http.client, 2 MB body to an unknown route: 404 (${out:0:40})" eval '[[ "$out" == "404 application/problem+json"* ]]'

# A client that keeps sending forever is cut off after the linger bound,
# and while 70 such sockets linger (more than the 64 kept), others are served.
python3 - "$PORT" >"$WORK/endless" <<'EOF' &
import socket, sys, time
port = int(sys.argv[1])
socks = []
for i in range(70):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: 1000000000\r\n\r\n" + b" " * 1024)
    s.settimeout(0.05)
    socks.append(s)
t0 = time.time()
open_ = set(range(70))
first = {}
while open_ and time.time() - t0 < 15:
    for i in list(open_):
        s = socks[i]
        try:
            if i not in first or first[i]:
                d = s.recv(65536)
                if i not in first:
                    first[i] = d[:12]
            s.sendall(b" " * 1024)
        except (socket.timeout, BlockingIOError):
            pass
        except OSError:  # reset: the server stopped lingering
            open_.discard(i)
    time.sleep(0.02)
answered = sum(1 for d in first.values() if d.startswith(b"HTTP/1.1 413"))
print(f"{70 - len(open_)} {answered} {time.time() - t0:.1f}")
EOF
ENDLESS=$!
sleep 0.5
req GET /livez
check "served while 70 endless bodies are being dropped" status_is 200
wait "$ENDLESS"
read -r closed answered secs <"$WORK/endless"
check "endless bodies: all 70 answered 413 (${answered}) and cut off (${closed} closed after ${secs} s)" \
    eval '[ "$answered" = 70 ] && [ "$closed" = 70 ]'

req GET /readyz
check "still ready afterwards" status_is 200
check "server process alive" kill -0 "$SERVER_PID"
stop_server
check "exit 0" [ "$SERVER_RC" = 0 ]
finish
