#!/usr/bin/env python3
"""A Jackdaw worker in plain Python (standard library only).

It serves remote commands: registers them (PUT /v1/commands/{name}), then
claims their tasks over HTTP (POST /v1/tasks/claim, a long-poll), runs each
with its args, heartbeats while it runs (so a long task keeps its lease),
and reports the result (complete) or the error (fail). A task whose job
was cancelled answers the heartbeat with 409 "cancelled": the handler's
`task.cancelled` event is set and its result is dropped.

    JACKDAW_URL=http://127.0.0.1:8080 python3 worker.py --concurrency 4

Write your own commands with the @command decorator below. Raise
Retryable for errors worth another attempt (the job's retry policy decides),
any other exception fails the step. Effects are at-least-once: use
task.idempotency_key ("<job_id>:<tag>", the same for every attempt) to make
them safe to repeat.

Tracing: task.traceparent is the job's W3C trace context (None when the
job has none), exactly as the submitter sent it; Jackdaw records no spans,
so start your handler's span as its child, e.g. with OpenTelemetry:
    ctx = TraceContextTextMapPropagator().extract({"traceparent": task.traceparent})
    with tracer.start_as_current_span(task.command, context=ctx): ...

One thread per slot (--concurrency): claim one task, run it, report,
repeat. While the server is away (restarting, say) every call is retried
with a growing, jittered pause; a server that restarted offers the tasks
it had handed out again, so nothing is lost. SIGTERM/SIGINT: stop claiming, finish the running tasks, exit 0.
"""
import argparse
import json
import os
import random
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request

COMMANDS = {}


def command(name, timeout_ms=0, description=None):
    """Register fn(args, task) as the handler of remote command `name`."""

    def wrap(fn):
        COMMANDS[name] = (fn, timeout_ms, description or (fn.__doc__ or "").strip())
        return fn

    return wrap


class Retryable(Exception):
    """A failure worth another attempt (e.g. a timeout of something we call)."""

    def __init__(self, message, kind="retryable", details=None):
        super().__init__(message)
        self.kind, self.details = kind, details


class Task:
    def __init__(self, t):
        self.id = t["id"]
        self.command = t["command"]
        self.args = t.get("args")
        self.job_id = t["job_id"]
        self.attempt = t["attempt"]
        self.idempotency_key = t["idempotency_key"]
        self.traceparent = t.get("traceparent")  # the job's W3C trace context, or None
        self.cancelled = threading.Event()  # the job was cancelled, or the lease lost
        self.progress = None  # set it; the next heartbeat reports it
        self.lease_end = None  # time.monotonic() by which the lease runs out


# ---- example commands ----


@command("py.upper", description="upper-cases args.text")
def upper(args, task):
    return {"text": str(args.get("text", "")).upper(), "by": "python"}


@command("py.sleep", description="sleeps args.seconds, reporting progress")
def sleep(args, task):
    # Only the first attempt sleeps first_seconds (the tests kill a worker
    # there); later attempts sleep args.seconds.
    secs = float(args.get("first_seconds" if task.attempt == 1 else "seconds", 0) or 0)
    end = time.monotonic() + secs
    while time.monotonic() < end:
        if task.cancelled.wait(0.1):
            return None  # the result would be dropped anyway
        task.progress = {"left_s": round(end - time.monotonic(), 1)}
    return {"slept": secs, "attempt": task.attempt}


@command("py.effect", description="an effect outside Jackdaw, one line per attempt")
def effect(args, task):
    # Stands in for a payment or an email: it happens once per attempt,
    # and a crash can make an attempt run again, so the line carries the
    # idempotency key a real effect would dedupe on. The line goes to the
    # file named by $EFFECTS_LOG (nowhere when unset); then it sleeps
    # args.seconds, as real work would.
    path = os.environ.get("EFFECTS_LOG")
    if path:
        with open(path, "a") as f:
            f.write("%s %d python\n" % (task.idempotency_key, task.attempt))
    time.sleep(float(args.get("seconds", 0) or 0))
    return {"key": task.idempotency_key, "attempt": task.attempt, "by": "python"}


@command("py.fail", description="fails; retryable when args.retryable")
def fail(args, task):
    if args.get("retryable"):
        raise Retryable("try again later", kind="busy")
    raise ValueError(args.get("message", "it cannot be done"))


# ---- the worker loop ----


class Client:
    def __init__(self, url, token):
        self.url, self.token = url.rstrip("/"), token

    def call(self, method, path, body=None, timeout=30):
        """(status, parsed JSON or None); status 0 when the server is away."""
        return self.call3(method, path, body, timeout)[:2]

    def call3(self, method, path, body=None, timeout=30):
        """(status, parsed JSON or None, Retry-After in seconds or None)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", "Bearer " + self.token)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw = r.read()
                return r.status, json.loads(raw) if raw else None, None
        except urllib.error.HTTPError as e:
            raw = e.read()
            ra = e.headers.get("Retry-After", "")
            ra = int(ra) if ra.isdigit() else None
            try:
                return e.code, json.loads(raw), ra
            except ValueError:
                return e.code, None, ra
        except (urllib.error.URLError, OSError, ValueError):
            return 0, None, None


def log(*a):
    print("worker:", *a, file=sys.stderr, flush=True)


class Backoff:
    """Waits between tries while the server is away: 0.25 s doubling to 8 s,
    with jitter so a fleet of workers does not come back in step."""

    def __init__(self, stop=None):
        self.delay, self.stop = 0.25, stop or threading.Event()

    def wait(self):
        self.stop.wait(self.next())

    def next(self):
        """The next pause (seconds), and the one after doubles."""
        d = self.delay * random.uniform(0.5, 1.0)
        self.delay = min(self.delay * 2, 8.0)
        return d

    def reset(self):
        self.delay = 0.25


class Worker:
    def __init__(self, client, names, concurrency, lease_ms, wait_ms):
        self.c, self.names = client, names
        self.concurrency, self.lease_ms, self.wait_ms = concurrency, lease_ms, wait_ms
        self.name = "%s/%d" % (socket.gethostname(), os.getpid())
        self.stopping = threading.Event()

    def register(self):
        for n in self.names:
            _, timeout_ms, desc = COMMANDS[n]
            back = Backoff(self.stopping)
            while True:
                st, body = self.c.call("PUT", "/v1/commands/" + n,
                                       {"timeout_ms": timeout_ms, "description": desc[:1000]})
                if st in (200, 201):
                    break
                if st != 0 and st < 500:  # refused (a bad token, a bad name): say so
                    raise SystemExit("worker: registering %s answered %s %s" % (n, st, body))
                if self.stopping.is_set():
                    raise SystemExit(0)
                log("registering", n, "answered", st, "(the server is away): trying again")
                back.wait()

    def heartbeat(self, task, done):
        every = max(self.lease_ms / 3000.0, 0.2)
        back, pause = Backoff(), every
        while not done.wait(pause):
            body = {"lease_ms": self.lease_ms}
            if task.progress is not None:
                body["progress"] = task.progress
            sent = time.monotonic()
            st, p, ra = self.c.call3("POST", "/v1/tasks/%s/heartbeat" % task.id, body)
            pause = every
            if st == 200:  # renewed from (after) the moment we sent it
                task.lease_end = sent + self.lease_ms / 1000.0
                back.reset()
            elif (st == 0 or st >= 500) and sent < task.lease_end:  # try again sooner
                pause = min(min(ra, 8) if ra else back.next(), every,
                            max(task.lease_end - time.monotonic(), 0.05))
            if st == 409:  # cancelled, lease lost or already completed: not ours now
                log("task", task.id, "is no longer ours:", (p or {}).get("reason"))
                task.cancelled.set()
                return

    def run_one(self, t, claimed_at):
        task = Task(t)
        task.lease_end = claimed_at + self.lease_ms / 1000.0
        fn = COMMANDS[task.command][0]
        if task.traceparent:  # where a traced worker starts its span (see the top)
            log("task", task.id, task.command, "traceparent", task.traceparent)
        done = threading.Event()
        hb = threading.Thread(target=self.heartbeat, args=(task, done), daemon=True)
        hb.start()
        try:
            result = fn(task.args if isinstance(task.args, dict) else {}, task)
            path, body = "complete", {"result": result}
        except Retryable as e:
            path = "fail"
            body = {"error": {"message": str(e), "kind": e.kind, "retryable": True,
                              "details": e.details}}
        except Exception as e:  # any other failure is the step's end
            path = "fail"
            body = {"error": {"message": "%s: %s" % (type(e).__name__, e),
                              "kind": "exception", "retryable": False}}
        done.set()
        hb.join()
        if task.cancelled.is_set():
            return
        # The server may be restarting, or (in a cluster, 503) the node that
        # holds the task does not answer: keep trying, after its Retry-After
        # (at most 8 s) or a growing pause, while the lease lasts. When the
        # lease has run out the task comes back as the next attempt and this
        # id answers 409 anyway. Either way the job's history has one result.
        back = Backoff()
        while True:
            st, p, ra = self.c.call3("POST", "/v1/tasks/%s/%s" % (task.id, path), body)
            if st == 200:
                return
            if 400 <= st < 500:  # 409: no longer ours (see the problem's reason)
                log("task", task.id, path, "answered", st, (p or {}).get("reason", ""))
                return
            left = task.lease_end - time.monotonic()
            if left <= 0:
                log("could not report task", task.id, "before its lease ran out (last:", st, ")")
                return
            time.sleep(min(min(ra, 8) if ra else back.next(), left))

    def slot(self):
        back = Backoff(self.stopping)
        while not self.stopping.is_set():
            st, body = self.c.call("POST", "/v1/tasks/claim",
                                   {"commands": self.names, "worker": self.name, "max": 1,
                                    "wait_ms": self.wait_ms, "lease_ms": self.lease_ms},
                                   timeout=self.wait_ms / 1000.0 + 30)
            if st != 200:
                log("claim answered", st, body)
                back.wait()  # the server is away or refusing: do not spin
                continue
            back.reset()
            claimed_at = time.monotonic()  # the lease began before this
            for t in body.get("tasks", []):
                self.run_one(t, claimed_at)

    def run(self):
        self.register()
        slots = [threading.Thread(target=self.slot) for _ in range(self.concurrency)]
        for s in slots:
            s.start()
        log(self.name, "serving", ", ".join(self.names))
        for s in slots:
            s.join()
        log("stopped")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default=os.environ.get("JACKDAW_URL", "http://127.0.0.1:8080"))
    ap.add_argument("--commands", default=",".join(sorted(COMMANDS)),
                    help="comma-separated commands to serve (default: all)")
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--lease-ms", type=int, default=30000)
    ap.add_argument("--wait-ms", type=int, default=5000, help="long-poll per claim")
    a = ap.parse_args()
    names = [n for n in a.commands.split(",") if n]
    unknown = [n for n in names if n not in COMMANDS]
    if unknown or not names:
        ap.error("unknown commands: %s" % ", ".join(unknown))
    w = Worker(Client(a.url, os.environ.get("JACKDAW_TOKEN")), names, a.concurrency,
               a.lease_ms, a.wait_ms)
    # Drain on SIGTERM/SIGINT: slots stop claiming after their current task
    # (a claim in flight ends within wait_ms).
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: w.stopping.set())
    w.run()


if __name__ == "__main__":
    main()
