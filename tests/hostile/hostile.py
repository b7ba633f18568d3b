#!/usr/bin/env python3
"""Fire a generated mix of hostile requests at a running jackdawd.

Used by tests/integration/test_hostile.sh (short) and `make hostile`
(longer). Worker threads pick hostile actions at random (seeded: the seed is
printed, and JD_HOSTILE_SEED repeats a run) for --seconds; beside them a
probe opens a fresh connection to /livez every 50 ms and times the answer,
and samples the server's RSS from /proc; right after each, it times the same
request to a trivial responder in a process of its own (the control), which
shows what the machine's load alone costs. Prints one "key value" line per
figure at the end (probe count, failures, p50/p99/max in ms for /livez and
the control, max RSS in kB, actions done, 5xx answers, refused connections)
for the shell test to check.

Actions: deeply nested and duplicate-member bodies near --max-body, clients
that vanish mid-wait, mid-SSE and mid-body (FIN or RST), full SSE streams of
a long history, long-polls, splices past the substitution limits (at submit
and at run time), oversized bodies sent whole before reading, and floods of
messages to a job that waits on another topic, large definitions that stay
live (up to --max-job-memory, then 503), and a job whose steps splice a
large output again and again.
"""
import argparse
import http.client
import json
import os
import random
import socket
import struct
import sys
import threading
import time

p = argparse.ArgumentParser()
p.add_argument("--port", type=int, required=True)
p.add_argument("--pid", type=int, required=True)
p.add_argument("--seconds", type=float, default=20)
p.add_argument("--workers", type=int, default=6)
p.add_argument("--max-body", type=int, default=1 << 20)
p.add_argument("--pause", type=float, default=0.1, help="most seconds between a worker's actions")
p.add_argument("--only", default="", help="comma-separated action names (a_ dropped) to run alone")
p.add_argument("--wait-job", required=True, help="a job parked on a step that waits forever")
p.add_argument("--history-job", required=True, help="a finished job with a long history")
args = p.parse_args()

seed = int(os.environ.get("JD_HOSTILE_SEED", random.randrange(1 << 30)))
print(f"seed {seed}", flush=True)
HOST = "127.0.0.1"
PAUSE = args.pause
deadline = time.monotonic() + args.seconds
lock = threading.Lock()
stats = {"actions": 0, "5xx": 0, "refused": 0, "broken_pipe_413": 0}
by_action = {}


def count(key, n=1):
    with lock:
        stats[key] = stats.get(key, 0) + n


# ---- payloads, made once (near --max-body, never over unless meant) ----
room = args.max_body - 200
NESTED = b'{"handler":"echo","args":{"v":' + b"[" * room + b"}}"
NESTED_CLOSED = b'{"handler":"echo","args":{"v":' + b"[" * (room // 2 - 16) + b"]" * (room // 2 - 16) + b"}}"
dup = b',"a":1' * (room // 6)
DUPLICATES = b'{"handler":"echo","args":{"a":0' + dup + b"}}"
members = b"".join(b',"k%d":%d' % (i, i) for i in range(room // 16))
MEMBERS = b'{"handler":"echo","args":{"k":0' + members[: room - 40] + b"}}"
S1K = "x" * 1000
SPLICE_SUBMIT = json.dumps({"handler": "echo", "input": {"s": S1K},
                            "args": {f"s{i}": "${input.s}" * 60 for i in range(100)}}).encode()
SPLICE_RUN = json.dumps({"steps": [
    {"id": "a", "call": "echo", "args": {"v": "${input.s}" * 60}},
    {"id": "b", "call": "echo", "args": {"v": "${steps.a.output.v}" * 300}},
    {"id": "c", "call": "echo", "args": {"v": "${steps.b.output.v}" * 3000}}],
    "input": {"s": S1K}}).encode()
OVERSIZE = b" " * (args.max_body * 8)
# Large definitions that stay live for 20 s (a wait no one answers), sent
# in bursts so that together they reach --max-job-memory (then 503), and a job whose steps splice a
# ~800 KB output again and again (fails with output_too_large at 16 MiB).
BIG_MEMBERS = ",".join('"k%d":%d' % (i, i) for i in range((room - 200) // 16))
BIG_LIVE = ('{"steps":[{"id":"w","wait":"never","timeout_ms":20000},{"id":"e","call":"echo","args":{%s}}]}'
            % BIG_MEMBERS).encode()
CHAIN = json.dumps({"steps": [{"id": "a", "call": "echo", "args": json.loads("{" + BIG_MEMBERS[: room * 4 // 5] .rsplit(",", 1)[0] + "}")}]
                    + [{"id": f"b{i}", "call": "echo", "args": {"v": "${steps.a.output}"}}
                       for i in range(24)]}, separators=(",", ":")).encode()


def request(method, path, body=None, headers=None, timeout=30):
    """One request on a fresh connection; returns the status (0: no answer)."""
    c = http.client.HTTPConnection(HOST, args.port, timeout=timeout)
    try:
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        r.read()
        if r.status >= 500 and r.status != 503:
            count("5xx")
        return r.status
    except ConnectionRefusedError:
        count("refused")
        return 0
    except (OSError, http.client.HTTPException):
        return 0
    finally:
        c.close()


def raw(data, close_after, rst, read=0):
    """Send data on a raw socket, read up to `read` bytes, then vanish."""
    try:
        s = socket.create_connection((HOST, args.port), timeout=5)
    except ConnectionRefusedError:
        count("refused")
        return
    except OSError:
        return
    try:
        s.sendall(data)
        got = 0
        end = time.monotonic() + close_after
        while got < read and time.monotonic() < end:
            d = s.recv(65536)
            if not d:
                break
            got += len(d)
        rest = end - time.monotonic()
        if rest > 0:
            time.sleep(rest)
        if rst:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    finally:
        s.close()


def a_nested(rng):
    request("POST", "/v1/jobs", rng.choice([NESTED, NESTED_CLOSED]))


def a_duplicates(rng):
    request("POST", "/v1/jobs", rng.choice([DUPLICATES, MEMBERS]))


def a_vanish_wait(rng):
    raw(f"GET /v1/jobs/{args.wait_job}?wait=30s HTTP/1.1\r\nHost: x\r\n\r\n".encode(),
        rng.uniform(0, 0.5), rng.random() < 0.5)


def a_vanish_sse(rng):
    job = rng.choice([args.wait_job, args.history_job])
    raw(f"GET /v1/jobs/{job}/events HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n"
        f"Last-Event-ID: 0\r\n\r\n".encode(), rng.uniform(0, 0.5), rng.random() < 0.5,
        read=rng.randrange(1, 2 << 20))


def a_vanish_body(rng):
    raw(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 900000\r\n\r\n" + NESTED[: rng.randrange(1, 100000)],
        rng.uniform(0, 0.3), rng.random() < 0.5)


def a_sse_full(rng):
    c = http.client.HTTPConnection(HOST, args.port, timeout=30)
    try:
        c.request("GET", f"/v1/jobs/{args.history_job}/events",
                  headers={"Accept": "text/event-stream", "Last-Event-ID": "0"})
        r = c.getresponse()
        if r.status == 200:
            while r.read(1 << 16):
                if time.monotonic() > deadline + 5:
                    break
    except ConnectionRefusedError:
        count("refused")
    except (OSError, http.client.HTTPException):
        pass
    finally:
        c.close()


def a_long_poll(rng):
    request("GET", f"/v1/jobs/{args.wait_job}?wait={rng.choice(['200ms', '1s', '2s'])}")


def a_submit_wait(rng):
    """Submit and wait in one request; half the clients vanish (RST or FIN)
    while parked, the others get the job back (or the wait's end)."""
    body = json.dumps({"handler": "sleep", "args": {"ms": rng.choice([50, 300, 2000])},
                       "labels": {"hostile": "submit_wait"}}).encode()
    if rng.random() < 0.5:
        request("POST", f"/v1/jobs?wait={rng.choice(['200ms', '1s', '3s'])}", body)
        return
    raw(b"POST /v1/jobs?wait=30s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode() + body,
        rng.uniform(0, 0.5), rng.random() < 0.5)


def a_splice(rng):
    st = request("POST", "/v1/jobs", rng.choice([SPLICE_SUBMIT, SPLICE_RUN]))
    if st == 201:
        count("splice_jobs")


def a_big_live(rng):
    for _ in range(2):
        if request("POST", "/v1/jobs", BIG_LIVE) == 503:
            count("memory_503")


def a_chain(rng):
    request("POST", "/v1/jobs", CHAIN)


def a_oversize(rng):
    st = request("POST", "/v1/jobs", OVERSIZE[: rng.randrange(args.max_body + 1, len(OVERSIZE))])
    if st == 0:
        count("broken_pipe_413")


def a_messages(rng):
    for _ in range(20):
        request("POST", f"/v1/jobs/{args.wait_job}/messages",
                json.dumps({"topic": f"t{rng.randrange(1000)}", "data": "m" * rng.randrange(1, 4000)}).encode())


ACTIONS = [a_nested, a_duplicates, a_vanish_wait, a_vanish_sse, a_vanish_body, a_sse_full,
           a_long_poll, a_submit_wait, a_splice, a_oversize, a_messages, a_big_live, a_chain]
if args.only:
    ACTIONS = [a for a in ACTIONS if a.__name__[2:] in args.only.split(",")]


def worker(i):
    rng = random.Random(seed * 1000 + i)
    while time.monotonic() < deadline:
        act = rng.choice(ACTIONS)
        act(rng)
        time.sleep(rng.uniform(0, PAUSE))
        count("actions")
        with lock:
            by_action[act.__name__] = by_action.get(act.__name__, 0) + 1


def rss_kb():
    try:
        with open(f"/proc/{args.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return -1
    return -1


lat = []
fails = []
ctl = []
max_rss = 0


def control_server(sock):
    """A trivial HTTP responder in its own process: the same probe timed
    against it shows what the machine's load alone costs."""
    while True:
        c, _ = sock.accept()
        try:
            c.recv(4096)
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n")
        except OSError:
            pass
        c.close()


def timed_get(port, path):
    """ms for a GET on a fresh connection, or None if it failed."""
    t0 = time.monotonic()
    try:
        c = http.client.HTTPConnection(HOST, port, timeout=5)
        c.request("GET", path)
        r = c.getresponse()
        r.read()
        c.close()
        if r.status != 200:
            return None
    except (OSError, http.client.HTTPException):
        return None
    return (time.monotonic() - t0) * 1000


def probe():
    global max_rss
    ls = socket.socket()
    ls.bind((HOST, 0))
    ls.listen(64)
    srv = os.fork()
    if srv == 0:
        control_server(ls)
        os._exit(0)
    cport = ls.getsockname()[1]
    while time.monotonic() < deadline:
        t0 = time.monotonic()
        dt = timed_get(args.port, "/livez")
        if dt is None:
            fails.append((time.monotonic() - t0) * 1000)
        else:
            lat.append(dt)
        c = timed_get(cport, "/")
        if c is not None:
            ctl.append(c)
        max_rss = max(max_rss, rss_kb())
        time.sleep(max(0, 0.05 - (time.monotonic() - t0)))
    os.kill(srv, 9)
    os.waitpid(srv, 0)


# The probe runs in its own process, so the workers' share of the Python
# interpreter lock never shows up as server latency.
rfd, wfd = os.pipe()
child = os.fork()
if child == 0:
    os.close(rfd)
    probe()
    with os.fdopen(wfd, "w") as f:
        json.dump({"lat": lat, "fails": fails, "ctl": ctl, "max_rss": max_rss}, f)
    os._exit(0)
os.close(wfd)
threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(args.workers)]
for t in threads:
    t.start()
with os.fdopen(rfd) as f:
    res = json.load(f)
os.waitpid(child, 0)
lat, fails, ctl, max_rss = res["lat"], res["fails"], res["ctl"], res["max_rss"]
for t in threads:
    t.join(timeout=40)

lat.sort()
ctl.sort()


def pct(v, q):
    return v[min(len(v) - 1, int(q * len(v)))] if v else -1


print(f"probes {len(lat) + len(fails)}")
print(f"probe_failures {len(fails)}")
print(f"livez_p50_ms {pct(lat, 0.50):.1f}")
print(f"livez_p99_ms {pct(lat, 0.99):.1f}")
print(f"livez_max_ms {max(lat + fails) if lat or fails else -1:.1f}")
print(f"control_p50_ms {pct(ctl, 0.50):.1f}")
print(f"control_p99_ms {pct(ctl, 0.99):.1f}")
print(f"control_max_ms {max(ctl) if ctl else -1:.1f}")
print(f"max_rss_kb {max_rss}")
for k in sorted(stats):
    print(f"{k} {stats[k]}")
print("mix " + ",".join(f"{k[2:]}={v}" for k, v in sorted(by_action.items())))
sys.stdout.flush()
