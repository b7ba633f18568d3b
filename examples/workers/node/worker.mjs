#!/usr/bin/env node
// A Jackdaw worker in plain Node (18 or newer: the built-in fetch, no
// packages).
//
// It serves remote commands: registers them (PUT /v1/commands/{name}),
// claims their tasks over HTTP (POST /v1/tasks/claim, a long-poll), runs
// each, heartbeats while it runs (so a long task keeps its lease), and
// reports the result (complete) or the error (fail). A 409 on a heartbeat
// (the job was cancelled, or the lease was lost) aborts the task's signal.
//
//   JACKDAW_URL=http://127.0.0.1:8080 node worker.mjs --concurrency 4
//
// Add commands to COMMANDS below: async (args, task) => result. Throw a
// Retryable for errors worth another attempt (the job's retry policy
// decides); anything else thrown fails the step. Effects are at-least-once:
// task.idempotency_key ("<job_id>:<tag>") is the same for every attempt.
//
// Tracing: task.traceparent is the job's W3C trace context (undefined when
// the job has none), exactly as the submitter sent it; Jackdaw records no
// spans, so start your handler's span as its child, e.g. with OpenTelemetry:
//   const ctx = propagation.extract(context.active(), { traceparent: task.traceparent });
//   tracer.startActiveSpan(task.command, {}, ctx, async (span) => { ...; span.end(); });
//
// Concurrency: N independent async loops (claim one, run, report). While
// the server is away (restarting, say) every call is retried with a growing,
// jittered pause; a server that restarted offers the tasks it had handed out
// again, so nothing is lost. SIGTERM or SIGINT: stop claiming, finish the
// running tasks, exit 0.
import { appendFileSync } from "node:fs";
import os from "node:os";

export class Retryable extends Error {
  constructor(message, kind = "retryable", details = undefined) {
    super(message);
    this.kind = kind;
    this.details = details;
  }
}

const sleep = (ms, signal) =>
  new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => { clearTimeout(t); resolve(); }, { once: true });
  });

// Pauses between tries while the server is away: 250 ms doubling to 8 s,
// with jitter so a fleet of workers does not come back in step.
class Backoff {
  constructor(signal) { this.signal = signal; this.reset(); }
  reset() { this.delay = 250; }
  async wait() { await sleep(this.next(), this.signal); }
  next() { // the next pause (ms); the one after doubles
    const d = this.delay * (0.5 + Math.random() / 2);
    this.delay = Math.min(this.delay * 2, 8000);
    return d;
  }
}

// ---- example commands ----
export const COMMANDS = {
  "node.reverse": {
    description: "reverses args.text",
    run: async (args) => ({ text: [...String(args.text ?? "")].reverse().join(""), by: "node" }),
  },
  "node.sleep": {
    description: "sleeps args.seconds (args.first_seconds on attempt 1), reporting progress",
    run: async (args, task) => {
      const secs = Number((task.attempt === 1 ? args.first_seconds : args.seconds) ?? 0);
      const end = Date.now() + secs * 1000;
      while (Date.now() < end && !task.signal.aborted) {
        task.progress = { left_s: Math.round((end - Date.now()) / 100) / 10 };
        await sleep(Math.min(100, end - Date.now()), task.signal);
      }
      return { slept: secs, attempt: task.attempt };
    },
  },
  "node.effect": {
    description: "an effect outside Jackdaw, one line per attempt",
    // Stands in for a payment or an email: it happens once per attempt, and
    // a crash can make an attempt run again, so the line carries the
    // idempotency key a real effect would dedupe on. The line goes to the
    // file named by $EFFECTS_LOG (nowhere when unset); then it sleeps
    // args.seconds, as real work would.
    run: async (args, task) => {
      if (process.env.EFFECTS_LOG)
        appendFileSync(process.env.EFFECTS_LOG, `${task.idempotency_key} ${task.attempt} node\n`);
      await sleep(Number(args.seconds ?? 0) * 1000);
      return { key: task.idempotency_key, attempt: task.attempt, by: "node" };
    },
  },
  "node.fail": {
    description: "fails; retryable when args.retryable",
    run: async (args) => {
      if (args.retryable) throw new Retryable("try again later", "busy");
      throw new Error(args.message ?? "it cannot be done");
    },
  },
};

// ---- the worker loop ----
const log = (...a) => console.error("worker:", ...a);

function parseArgs(argv) {
  const o = {
    url: process.env.JACKDAW_URL ?? "http://127.0.0.1:8080",
    commands: Object.keys(COMMANDS),
    concurrency: 2,
    leaseMs: 30000,
    waitMs: 5000,
  };
  for (let i = 0; i < argv.length; i++) {
    const v = argv[i + 1];
    switch (argv[i]) {
      case "--url": o.url = v; i++; break;
      case "--commands": o.commands = v.split(",").filter(Boolean); i++; break;
      case "--concurrency": o.concurrency = Number(v); i++; break;
      case "--lease-ms": o.leaseMs = Number(v); i++; break;
      case "--wait-ms": o.waitMs = Number(v); i++; break;
      default:
        console.error("usage: worker.mjs [--url U] [--commands a,b] [--concurrency N] " +
                      "[--lease-ms MS] [--wait-ms MS]");
        process.exit(2);
    }
  }
  const unknown = o.commands.filter((c) => !COMMANDS[c]);
  if (unknown.length || !o.commands.length) {
    console.error("worker.mjs: unknown commands:", unknown.join(", "));
    process.exit(2);
  }
  return o;
}

class Worker {
  constructor(o) {
    Object.assign(this, o);
    this.url = o.url.replace(/\/$/, "");
    this.token = process.env.JACKDAW_TOKEN;
    this.name = `${os.hostname()}/${process.pid}`;
    this.stop = new AbortController();
  }

  // [status, parsed JSON or null, Retry-After in ms or 0]; status 0 when
  // the server is away.
  async call(method, path, body, timeoutMs = 30000) {
    const headers = { "Content-Type": "application/json" };
    if (this.token) headers.Authorization = `Bearer ${this.token}`;
    try {
      const r = await fetch(this.url + path, {
        method, headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: AbortSignal.timeout(timeoutMs),
      });
      const text = await r.text();
      let json = null;
      try { json = text ? JSON.parse(text) : null; } catch { /* not JSON */ }
      const ra = Number(r.headers.get("retry-after"));
      return [r.status, json, Number.isInteger(ra) && ra > 0 ? ra * 1000 : 0];
    } catch {
      return [0, null, 0];
    }
  }

  async register() {
    for (const n of this.commands) {
      const back = new Backoff(this.stop.signal);
      for (;;) {
        const [st, b] = await this.call("PUT", `/v1/commands/${n}`,
                                        { description: COMMANDS[n].description });
        if (st === 200 || st === 201) break;
        // refused (a bad token, a bad name): say so
        if (st !== 0 && st < 500) throw new Error(`registering ${n}: ${st} ${JSON.stringify(b)}`);
        if (this.stop.signal.aborted) return;
        log(`registering ${n} answered ${st} (the server is away): trying again`);
        await back.wait();
      }
    }
  }

  async runOne(t, claimedAt) {
    // where a traced worker starts its span (see the top)
    if (t.traceparent) log(`task ${t.id} ${t.command} traceparent ${t.traceparent}`);
    const ac = new AbortController();
    const task = { ...t, signal: ac.signal, progress: undefined };
    // When the lease runs out unless renewed (the claim's began before
    // claimedAt; a heartbeat's after it was sent).
    let leaseEnd = claimedAt + this.leaseMs;
    const every = Math.max(this.leaseMs / 3, 200), hbBack = new Backoff();
    let beat, ended = false;
    const heartbeat = async () => {
      const body = { lease_ms: this.leaseMs };
      if (task.progress !== undefined) body.progress = task.progress;
      const sent = performance.now();
      const [st, p, ra] = await this.call("POST", `/v1/tasks/${t.id}/heartbeat`, body);
      let pause = every;
      if (st === 200) {
        leaseEnd = sent + this.leaseMs;
        hbBack.reset();
      } else if ((st === 0 || st >= 500) && sent < leaseEnd) { // try again sooner
        pause = Math.min(ra ? Math.min(ra, 8000) : hbBack.next(), every,
                         Math.max(leaseEnd - performance.now(), 50));
      }
      if (st === 409) { // cancelled, lease lost or completed: no longer ours
        log(`task ${t.id} is no longer ours: ${p?.reason}`);
        ac.abort();
      }
      if (!ended) beat = setTimeout(heartbeat, pause);
    };
    beat = setTimeout(heartbeat, every);
    let path, body;
    try {
      const args = t.args && typeof t.args === "object" ? t.args : {};
      path = "complete";
      body = { result: (await COMMANDS[t.command].run(args, task)) ?? null };
    } catch (e) {
      path = "fail";
      body = e instanceof Retryable
        ? { error: { message: e.message, kind: e.kind, retryable: true, details: e.details } }
        : { error: { message: `${e.name}: ${e.message}`, kind: "exception", retryable: false } };
    }
    ended = true;
    clearTimeout(beat);
    if (ac.signal.aborted) return;
    // The server may be restarting, or (in a cluster, 503) the node that
    // holds the task does not answer: keep trying, after its Retry-After (at
    // most 8 s) or a growing pause, while the lease lasts. When the lease
    // has run out the task comes back as the next attempt and this id
    // answers 409 anyway. Either way the job's history has one result.
    const back = new Backoff();
    for (;;) {
      const [st, p, ra] = await this.call("POST", `/v1/tasks/${t.id}/${path}`, body);
      if (st === 200) return;
      if (st >= 400 && st < 500) { // 409: no longer ours (see the problem's reason)
        log(`task ${t.id} ${path} answered ${st} ${p?.reason ?? ""}`);
        return;
      }
      const left = leaseEnd - performance.now();
      if (left <= 0) break;
      await sleep(Math.min(ra ? Math.min(ra, 8000) : back.next(), left));
    }
    log(`could not report task ${t.id} before its lease ran out`);
  }

  async slot() {
    const back = new Backoff(this.stop.signal);
    while (!this.stop.signal.aborted) {
      const [st, b] = await this.call("POST", "/v1/tasks/claim", {
        commands: this.commands, worker: this.name, max: 1,
        wait_ms: this.waitMs, lease_ms: this.leaseMs,
      }, this.waitMs + 30000);
      if (st !== 200) {
        log(`claim answered ${st} ${JSON.stringify(b)}`);
        await back.wait(); // the server is away or refusing: do not spin
        continue;
      }
      back.reset();
      const claimedAt = performance.now(); // the lease began before this
      for (const t of b.tasks ?? []) await this.runOne(t, claimedAt);
    }
  }

  async run() {
    await this.register();
    for (const sig of ["SIGTERM", "SIGINT"]) process.on(sig, () => this.stop.abort());
    log(`${this.name} serving ${this.commands.join(", ")}`);
    await Promise.all(Array.from({ length: this.concurrency }, () => this.slot()));
    log("stopped");
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  new Worker(parseArgs(process.argv.slice(2))).run().catch((e) => {
    console.error("worker.mjs:", e.message);
    process.exit(1);
  });
}
