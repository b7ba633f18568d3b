#!/usr/bin/env python3
"""What a refused task id costs the server (docs/performance.md, "Refusing
a made-up task id").

For each build directory given (a tree's build/, with jackdawd and
plugins/), ROUNDS times, interleaved: a fresh SQLite database, one echo job
run to its end, its history padded with SQL to EVENTS message events (the
server stopped meanwhile), then N complete requests for made-up task ids
naming that job, from 4 keep-alive connections; every answer must be 404.
Two kinds of ids: "<job>-<32 hex>" (the shape handed out before ids
carried their claim's seq) and "<job>-<seq>-<32 hex>" with seq a real
event of the job. Prints, per build and kind, the wall time and the
server's CPU (utime + stime from /proc) for the N requests, and the
medians over the rounds.

Usage: bench/task_refusals.py BUILD_DIR... (N=10000 EVENTS=20000 ROUNDS=3)
"""
import http.client
import json
import os
import re
import secrets
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time

N = int(os.environ.get("N", "10000"))
EVENTS = int(os.environ.get("EVENTS", "20000"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
CONNS = 4
TICK = os.sysconf("SC_CLK_TCK")


def start(build, db, log):
    f = open(log, "w")
    p = subprocess.Popen([os.path.join(build, "jackdawd"), "--listen", "127.0.0.1:0", "--db", db,
                          "--plugin-dir", os.path.join(build, "plugins")], stderr=f)
    for _ in range(400):
        m = re.search(r'"msg":"listening","addr":"([^"]*)"', open(log).read())
        if m:
            host, port = m.group(1).rsplit(":", 1)
            for _ in range(200):
                try:
                    c = http.client.HTTPConnection(host, int(port), timeout=5)
                    c.request("GET", "/readyz")
                    if c.getresponse().status == 200:
                        return p, host, int(port)
                except OSError:
                    pass
                time.sleep(0.05)
        time.sleep(0.05)
    p.kill()
    sys.exit("server did not start: " + open(log).read()[-500:])


def stop(p):
    p.send_signal(signal.SIGTERM)
    p.wait(30)


def cpu(pid):
    f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK  # utime, stime


def one_job(host, port):
    c = http.client.HTTPConnection(host, port, timeout=30)
    c.request("POST", "/v1/jobs", body='{"handler":"echo","args":{}}',
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    body = json.loads(r.read())
    job = int(body["id"])
    c.request("GET", "/v1/jobs/%d?wait=10" % job)
    r = c.getresponse()
    r.read()
    return job


def pad(db, job):
    d = sqlite3.connect(db)
    (v,) = d.execute("SELECT version FROM jobs WHERE id = ?", (job,)).fetchone()
    now = int(time.time() * 1000)
    d.executemany("INSERT INTO events(job_id, seq, time_ms, kind, tag, data) VALUES (?,?,?,3,0,?)",
                  ((job, v + i, now, '{"topic":"pad","data":%d}' % i) for i in range(1, EVENTS + 1)))
    d.execute("UPDATE jobs SET version = ? WHERE id = ?", (v + EVENTS, job))
    d.commit()
    d.close()


def hammer(host, port, paths):
    bad = []

    def run(part):
        c = http.client.HTTPConnection(host, port, timeout=60)
        for p in part:
            c.request("POST", p, body='{"result":1}', headers={"Content-Type": "application/json"})
            r = c.getresponse()
            r.read()
            if r.status != 404:
                bad.append(r.status)
    ts = [threading.Thread(target=run, args=(paths[i::CONNS],)) for i in range(CONNS)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if bad:
        sys.exit("answers other than 404: %s" % bad[:5])


def main():
    builds = sys.argv[1:]
    if not builds:
        sys.exit(__doc__)
    res = {}
    for rnd in range(ROUNDS):
        for b in builds:
            with tempfile.TemporaryDirectory() as tmp:
                db = os.path.join(tmp, "jd.db")
                p, host, port = start(b, db, os.path.join(tmp, "log1"))
                job = one_job(host, port)
                stop(p)
                pad(db, job)
                p, host, port = start(b, db, os.path.join(tmp, "log2"))
                kinds = {
                    "<job>-<hex>": ["/v1/tasks/%d-%s/complete" % (job, secrets.token_hex(16))
                                    for _ in range(N)],
                    "<job>-<seq>-<hex>": ["/v1/tasks/%d-3-%s/complete" % (job, secrets.token_hex(16))
                                          for _ in range(N)],
                }
                for k, paths in kinds.items():
                    c0, t0 = cpu(p.pid), time.monotonic()
                    hammer(host, port, paths)
                    t1, c1 = time.monotonic(), cpu(p.pid)
                    res.setdefault((b, k), []).append((t1 - t0, c1 - c0))
                    print("round %d %s %s: %.2f s, server CPU %.2f s, load %.1f" %
                          (rnd + 1, b, k, t1 - t0, c1 - c0, os.getloadavg()[0]), flush=True)
                stop(p)
    for (b, k), v in res.items():
        print("median %s %s: %.2f s, server CPU %.2f s (%d rounds)" %
              (b, k, statistics.median(x[0] for x in v), statistics.median(x[1] for x in v),
               len(v)))


if __name__ == "__main__":
    main()
