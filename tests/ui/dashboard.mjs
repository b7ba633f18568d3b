// Browser tests of the dashboard: Debian's chromium driven by puppeteer-core
// against a real jackdawd (started by test_ui.sh). Prints TAP lines.
//
//   node dashboard.mjs main  BASE SHOTS_DIR   the pages, their content and actions
//   node dashboard.mjs token BASE SHOTS_DIR   a server started with --token s3cret
//
// Every page is also checked for console errors and CSP violations, and
// screenshotted at 1280 and 390 px wide into SHOTS_DIR.
import puppeteer from "puppeteer-core";
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";

const [phase, BASE, SHOTS] = process.argv.slice(2);
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const TOKEN = "s3cret";
let n = 0, failed = 0;
const tap = (ok, name, detail) => {
  n++;
  if (!ok) failed++;
  console.log(`${ok ? "ok" : "not ok"} ${n} - ${name}`);
  if (!ok && detail) console.log(`# ${String(detail).split("\n").join("\n# ")}`);
};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function api(method, path, body, token) {
  const headers = {};
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (token) headers.Authorization = `Bearer ${token}`;
  const res = await fetch(BASE + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: res.status, json, headers: res.headers };
}
const submit = async (def) => {
  const r = await api("POST", "/v1/jobs", def);
  if (r.status !== 201) throw new Error(`submit ${JSON.stringify(def)}: ${r.status} ${JSON.stringify(r.json)}`);
  return r.json.id;
};
async function until(what, fn, ms = 10000) {
  const end = Date.now() + ms;
  let last;
  while (Date.now() < end) {
    try { last = await fn(); if (last) return last; } catch (e) { last = e; }
    await sleep(100);
  }
  throw new Error(`timed out waiting for ${what}${last instanceof Error ? `: ${last.message}` : ""}`);
}
// Run a named check: ok unless it throws.
async function check(name, fn) {
  try { await fn(); tap(true, name); } catch (e) { tap(false, name, e.stack || e.message); }
}
const assert = (cond, msg) => { if (!cond) throw new Error(msg); };

const problems = []; // console errors, page errors, CSP violations, off-origin requests
async function openBrowser() {
  const browser = await puppeteer.launch({
    executablePath: CHROMIUM, headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"],
  });
  const page = await browser.newPage();
  await page.setViewport({ width: 1280, height: 900 });
  await page.evaluateOnNewDocument(() => {
    window.__csp = [];
    document.addEventListener("securitypolicyviolation", (e) => window.__csp.push(`${e.violatedDirective} ${e.blockedURI}`));
  });
  page.on("console", (m) => { if (m.type() === "error") problems.push(`console: ${m.text()} (${m.location()?.url || "?"})`); });
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  page.on("request", (r) => { if (!r.url().startsWith(BASE) && !r.url().startsWith("data:")) problems.push(`off-origin request: ${r.url()}`); });
  return { browser, page };
}

async function shoot(page, name) {
  await page.setViewport({ width: 1280, height: 900 });
  await sleep(300);
  await page.screenshot({ path: `${SHOTS}/${name}-1280.png`, fullPage: true });
  await page.setViewport({ width: 390, height: 844, isMobile: true, deviceScaleFactor: 1 });
  await sleep(300);
  await page.screenshot({ path: `${SHOTS}/${name}-390.png`, fullPage: true });
  // (a mobile viewport widens to its content, so compare with the width set)
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - 390);
  await page.setViewport({ width: 1280, height: 900 });
  return overflow;
}

async function go(page, hash) {
  await page.evaluate((h) => { location.hash = h; }, hash);
  await sleep(50);
}
const text = (page, sel) => page.$eval(sel, (e) => e.textContent);

// expected: the browser's own log lines for answers the page asked for and
// handles (e.g. the 404 of a route this server does not have).
async function cleanCheck(page, where, expected) {
  const csp = await page.evaluate(() => window.__csp);
  const all = problems.splice(0).filter((p) => !(expected && expected.test(p))).concat(csp.map((c) => `CSP: ${c}`));
  tap(all.length === 0, `${where}: no console errors, CSP violations or off-origin requests`, all.join("\n"));
}

async function mainPhase() {
  // ---- jobs of every shape, through the API ----
  const echo = [];
  for (let i = 0; i < 3; i++) echo.push(await submit({ handler: "echo", args: { i }, labels: { team: "a" } }));
  for (let i = 0; i < 2; i++) await submit({ handler: "echo", args: { i }, queue: "mail", labels: { team: "b" } });
  const failing = await submit({ handler: "fail", args: {} });
  const proc = await submit({ process: "counter", method: "count_to", input: { n: 3 } });
  const waiting = await submit({ steps: [{ id: "greet", call: "echo", args: { to: "${input.name}" } },
    { id: "ok", wait: "approval", timeout_ms: 600000 }], input: { name: "ada" }, queue: "flows" });
  const long = await submit({ handler: "sleep", args: { ms: 600000 }, queue: "slow" });
  // Thousands of jobs: the lists must page, not load them all.
  for (let b = 0; b < 2; b++) {
    const jobs = Array.from({ length: 1000 }, (_, i) => ({ handler: "echo", args: { b, i }, queue: "bulk" }));
    const r = await api("POST", "/v1/jobs/batch", { jobs });
    if (r.status !== 201 && r.status !== 200) throw new Error(`batch: ${r.status} ${JSON.stringify(r.json)}`);
  }
  const sched = await api("PUT", "/v1/schedules/nightly", { cron: "0 3 * * *", timezone: "Europe/Berlin", job: { handler: "echo", args: { s: 1 } } });
  if (sched.status !== 201) throw new Error(`schedule: ${sched.status}`);
  await until("the bulk jobs to finish", async () => {
    const q = (await api("GET", "/v1/queues")).json.queues;
    const bulk = q.find((x) => x.name === "bulk");
    return bulk && bulk.counts.succeeded === 2000 && q.find((x) => x.name === "default").counts.failed === 1;
  }, 30000);

  const { browser, page } = await openBrowser();
  try {
    // ---- overview ----
    const res = await page.goto(`${BASE}/`, { waitUntil: "load" });
    await check("/ redirects to /ui/ and the page loads", async () => {
      assert(page.url() === `${BASE}/ui/`, `url ${page.url()}`);
      assert(res.status() === 200, `status ${res.status()}`);
    });
    await page.waitForSelector('[data-queue="bulk"] [data-count="succeeded"] .n');
    await check("overview: counts per queue and state match /v1/queues", async () => {
      await until("counts to settle and match", async () => {
        const q = (await api("GET", "/v1/queues")).json.queues;
        await sleep(2300); // one refresh
        const shown = await page.$$eval("[data-queue]", (cards) => Object.fromEntries(cards.map((c) => [c.dataset.queue,
          Object.fromEntries([...c.querySelectorAll("[data-count]")].map((a) => [a.dataset.count, Number(a.querySelector(".n").textContent)]))])));
        const q2 = (await api("GET", "/v1/queues")).json.queues;
        if (JSON.stringify(q) !== JSON.stringify(q2)) return false; // still moving
        for (const x of q) for (const [s, v] of Object.entries(x.counts))
          if (shown[x.name]?.[s] !== v) throw new Error(`${x.name}/${s}: shown ${shown[x.name]?.[s]}, API ${v}`);
        return Object.keys(shown).length === q.length;
      }, 20000);
    });
    await check("overview: throughput chart drawn from /v1/stats (bars for the 2000 bulk jobs)", async () => {
      const bars = await page.$$eval('[data-queue="bulk"] svg.chart rect.ok', (r) => r.length);
      assert(bars > 0, "no succeeded bars");
      const label = await page.$eval('[data-queue="bulk"] svg.chart', (s) => s.getAttribute("aria-label"));
      assert(/2000 succeeded/.test(label), label);
      const failBars = await page.$$eval('[data-queue="default"] svg.chart rect.bad', (r) => r.length);
      assert(failBars > 0, "no failed bar for the failing job");
    });
    await check("overview: oldest queued job shown for a paused queue", async () => {
      const r = await api("POST", "/v1/queues/held/pause");
      assert(r.status === 200, `pause held: ${r.status}`);
      const id = await submit({ handler: "echo", args: {}, queue: "held" });
      await page.waitForFunction((id) => document.querySelector('[data-queue="held"] [data-oldest] a')?.textContent === `#${id}`, { timeout: 8000 }, id);
    });
    await check("overview: a queue's controls (max_running, rate) shown as set with PUT /v1/queues/{q}", async () => {
      const r = await api("PUT", "/v1/queues/mail", { max_running: 3, rate: { limit: 20, per: "1s" } });
      assert(r.status === 200, `PUT /v1/queues/mail: ${r.status} ${JSON.stringify(r.json)}`);
      await page.waitForFunction(() => /max 3/.test(document.querySelector('[data-queue="mail"] [data-control="max_running"]')?.textContent || "") &&
        /20 per 1s/.test(document.querySelector('[data-queue="mail"] [data-control="rate"]')?.textContent || ""), { timeout: 8000 });
      assert(!(await page.$('[data-queue="default"] [data-control="max_running"]')), "a queue without controls shows max_running");
    });
    const shotOverview = await shoot(page, "overview");
    tap(shotOverview <= 0, "overview: no horizontal scrolling at 390 px", `overflows by ${shotOverview}px`);
    await check("overview: pause a queue from the UI, it shows as paused and the API agrees", async () => {
      const btn = await page.waitForSelector('[data-queue="mail"] .spread button');
      assert((await btn.evaluate((b) => b.textContent)) === "Pause", "button is not Pause");
      await btn.click();
      await page.waitForFunction(() => document.querySelector('[data-queue="mail"] h2 .state')?.dataset.state === "paused", { timeout: 8000 });
      const q = (await api("GET", "/v1/queues")).json.queues.find((x) => x.name === "mail");
      assert(q.paused === true, "API says not paused");
      await until("the button to say Resume", async () => (await btn.evaluate((b) => b.textContent)) === "Resume");
      await btn.click();
      await until("the API to say resumed", async () => (await api("GET", "/v1/queues")).json.queues.find((x) => x.name === "mail").paused === false);
    });
    await check("overview: reachable by keyboard (Tab reaches a queue's pause button)", async () => {
      await page.focus("#jump-id");
      let found = false;
      for (let i = 0; i < 80 && !found; i++) {
        await page.keyboard.press("Tab");
        found = await page.evaluate(() => document.activeElement?.matches('[data-queue] .spread button') || false);
      }
      assert(found, "no pause button reached with Tab");
    });
    await cleanCheck(page, "overview");

    // ---- jobs list ----
    await go(page, "#/jobs");
    await page.waitForSelector("#jobs-table tbody tr");
    await check("jobs: newest first, 50 per page, cursor paging to older jobs", async () => {
      const ids = await page.$$eval("#jobs-table tbody tr", (r) => r.map((x) => Number(x.dataset.job)));
      assert(ids.length === 50, `${ids.length} rows`);
      assert(ids.every((v, i) => i === 0 || v < ids[i - 1]), "not newest first");
      await page.click("#older");
      await page.waitForFunction((first) => Number(document.querySelector("#jobs-table tbody tr")?.dataset.job) < first, { timeout: 8000 }, ids[49] + 1);
      const ids2 = await page.$$eval("#jobs-table tbody tr", (r) => r.map((x) => Number(x.dataset.job)));
      assert(ids2[0] < ids[49], `page 2 starts at ${ids2[0]}, page 1 ended at ${ids[49]}`);
    });
    await check("jobs: filter by state (failed) shows only failed jobs", async () => {
      await go(page, "#/jobs?state=failed");
      await page.waitForFunction(() => document.querySelectorAll("#jobs-table tbody tr").length > 0 &&
        [...document.querySelectorAll("#jobs-table tbody tr .state")].every((s) => s.dataset.state === "failed"), { timeout: 8000 });
      const ids = await page.$$eval("#jobs-table tbody tr", (r) => r.map((x) => x.dataset.job));
      assert(ids.includes(failing), `failed job ${failing} not listed: ${ids}`);
    });
    await check("jobs: filter by queue and label", async () => {
      await go(page, "#/jobs?queue=mail");
      await page.waitForFunction(() => { const r = document.querySelectorAll("#jobs-table tbody tr"); return r.length >= 2 && r.length <= 3; }, { timeout: 8000 });
      await go(page, "#/jobs?label=team%3Da");
      await page.waitForFunction((want) => { const ids = [...document.querySelectorAll("#jobs-table tbody tr")].map((r) => r.dataset.job); return ids.length === want.length && want.every((w) => ids.includes(w)); }, { timeout: 8000 }, echo);
    });
    await check("jobs: a new job appears live on the first page", async () => {
      await go(page, "#/jobs");
      await page.waitForSelector("#jobs-table tbody tr");
      const id = await submit({ handler: "echo", args: { live: true } });
      await page.waitForFunction((id) => document.querySelector("#jobs-table tbody tr")?.dataset.job === id, { timeout: 8000 }, id);
    });
    const shotJobs = await shoot(page, "jobs");
    tap(shotJobs <= 0, "jobs: no horizontal scrolling at 390 px", `overflows by ${shotJobs}px`);
    await check("jobs: search by id opens the job", async () => {
      await page.click("#jump-id");
      await page.type("#jump-id", String(proc));
      await page.keyboard.press("Enter");
      await page.waitForFunction((id) => document.querySelector("h1")?.textContent.startsWith(`Job #${id}`), { timeout: 8000 }, proc);
      await page.waitForFunction(() => document.body.textContent.includes('"count": 3'), { timeout: 8000 });
    });
    await cleanCheck(page, "jobs");

    // ---- one job: live timeline over SSE, workflow steps ----
    const wf = await submit({ steps: [{ id: "first", sleep_ms: 1200 }, { id: "fan", parallel: [{ id: "left", call: "echo", args: { s: "l" } }, { id: "right", sleep_ms: 800 }] }, { id: "last", call: "echo", args: { done: true } }] });
    await go(page, `#/jobs/${wf}`);
    await check("job: the timeline grows live over SSE while the workflow runs", async () => {
      await page.waitForSelector("#timeline li");
      const before = await page.$$eval("#timeline li", (l) => l.length);
      const state = await page.$eval("h1 .state", (s) => s.dataset.state);
      assert(state !== "succeeded", `already ${state} when the page opened`);
      await page.waitForFunction((b) => document.querySelectorAll("#timeline li").length > b + 3, { timeout: 10000 }, before);
      await page.waitForFunction(() => document.querySelector("h1 .state")?.dataset.state === "succeeded", { timeout: 10000 });
      const api_ev = (await api("GET", `/v1/jobs/${wf}/events`)).json.events.length;
      await page.waitForFunction((n) => document.querySelectorAll("#timeline li").length === n, { timeout: 5000 }, api_ev);
    });
    await check("job: workflow steps with the parallel group side by side, each with state and duration", async () => {
      await page.waitForFunction(() => [...document.querySelectorAll("#steps [data-step]")].every((s) => s.dataset.state === "succeeded"), { timeout: 5000 });
      const steps = await page.$$eval("#steps [data-step]", (l) => l.map((s) => s.dataset.step));
      assert(JSON.stringify(steps) === JSON.stringify(["first", "fan", "left", "right", "last"]), steps.join(","));
      const group = await page.$$eval('[data-step="fan"] > ul.group > li', (l) => l.map((s) => s.getBoundingClientRect().top));
      assert(group.length === 2 && Math.abs(group[0] - group[1]) < 2, `group not side by side: ${group}`);
      const took = await text(page, '[data-step="first"] .step-head');
      assert(/1\.\d\d s/.test(took), `no duration on the sleep step: ${took}`);
    });
    const shotJob = await shoot(page, "job");
    tap(shotJob <= 0, "job: no horizontal scrolling at 390 px", `overflows by ${shotJob}px`);
    await cleanCheck(page, "job");

    await check("job: cancel from the UI cancels a running job", async () => {
      await go(page, `#/jobs/${long}`);
      await page.waitForSelector("#cancel:not([hidden])");
      await page.click("#cancel");
      await page.waitForFunction(() => document.querySelector("h1 .state")?.dataset.state === "cancelled", { timeout: 10000 });
      assert((await api("GET", `/v1/jobs/${long}`)).json.state === "cancelled", "API disagrees");
    });
    await check("job: retry from the UI queues a cancelled job again", async () => {
      await page.waitForSelector("#retry:not([hidden])", { timeout: 8000 });
      await page.click("#retry");
      await until("the job to run again", async () => ["queued", "running"].includes((await api("GET", `/v1/jobs/${long}`)).json.state));
      await page.waitForFunction(() => ["queued", "running"].includes(document.querySelector("h1 .state")?.dataset.state), { timeout: 8000 });
      await api("POST", `/v1/jobs/${long}/cancel`);
    });
    await check("job: a failed job shows its error and can be retried", async () => {
      await go(page, `#/jobs/${failing}`);
      await page.waitForSelector(".error-box pre.json");
      await page.waitForSelector("#retry:not([hidden])");
      assert(await page.$eval("#cancel", (b) => b.hidden), "cancel offered on a failed job");
    });
    await check("job: send a message from the UI to a waiting workflow", async () => {
      await go(page, `#/jobs/${waiting}`);
      await page.waitForFunction(() => document.querySelector("h1 .state")?.dataset.state === "waiting", { timeout: 8000 });
      await page.click("#message-details summary");
      await page.type("#msg-topic", "approval");
      await page.$eval("#msg-data", (t) => { t.value = ""; });
      await page.type("#msg-data", '{"by":"ui"}');
      await page.click("#message-form button[type=submit]");
      await page.waitForFunction(() => document.querySelector("h1 .state")?.dataset.state === "succeeded", { timeout: 10000 });
      const j = (await api("GET", `/v1/jobs/${waiting}`)).json;
      assert(j.output.ok.by === "ui", JSON.stringify(j.output));
    });
    await cleanCheck(page, "job actions");

    // ---- schedules ----
    await go(page, "#/schedules");
    await page.waitForSelector('tr[data-schedule="nightly"]');
    await check("schedules: next fire time and timetable shown; run now makes a job", async () => {
      const row = await text(page, 'tr[data-schedule="nightly"]');
      assert(row.includes("cron 0 3 * * *") && row.includes("Europe/Berlin"), row);
      await page.click('tr[data-schedule="nightly"] [data-action="trigger"]');
      await until("the trigger's job", async () => (await api("GET", "/v1/jobs?schedule=nightly")).json.jobs.length === 1);
      await page.waitForFunction(() => /fired|triggered/.test(document.querySelector('tr[data-schedule="nightly"] td[data-label="Last fire"]')?.textContent || ""), { timeout: 8000 });
    });
    await check("schedules: pause from the UI, the API agrees", async () => {
      await page.click('tr[data-schedule="nightly"] [data-action="pause"]');
      await page.waitForFunction(() => document.querySelector('tr[data-schedule="nightly"] .state')?.dataset.state === "paused", { timeout: 8000 });
      assert((await api("GET", "/v1/schedules/nightly")).json.paused === true, "API says not paused");
    });
    const shotSched = await shoot(page, "schedules");
    tap(shotSched <= 0, "schedules: no horizontal scrolling at 390 px", `overflows by ${shotSched}px`);
    await cleanCheck(page, "schedules");

    // ---- workers and commands: a real worker (examples/workers/python) ----
    await go(page, "#/workers");
    await check("workers: plugins listed; no remote command yet", async () => {
      await page.waitForSelector("#plugins-table");
      assert((await text(page, "#plugins-table")).includes("echo"), "no echo plugin");
      await page.waitForSelector("#commands-none, #workers-none", { timeout: 8000 });
    });
    const worker = startWorker();
    try {
      const remote = [];
      await check("workers: a worker's command, with its depth, in flight and the worker serving it", async () => {
        await until("the worker to register py.sleep", async () => (await api("GET", "/v1/commands/py.sleep")).status === 200);
        // One slot: one task in flight, two waiting.
        for (let i = 0; i < 3; i++) remote.push(await submit({ handler: "py.sleep", args: { first_seconds: 60 }, queue: "remote" }));
        await until("the worker to claim one", async () => (await api("GET", "/v1/commands/py.sleep")).json.in_flight === 1);
        const row = 'tr[data-command="py.sleep"]';
        await page.waitForFunction((row) => document.querySelector(`${row} [data-field="waiting"]`)?.textContent === "2" &&
          document.querySelector(`${row} [data-field="in_flight"]`)?.textContent === "1", { timeout: 8000 }, row);
        const w = (await api("GET", "/v1/workers")).json.workers;
        assert(w.length === 1, `workers: ${JSON.stringify(w)}`);
        await page.waitForFunction((row, name) => document.querySelector(`${row} [data-field="workers"]`)?.textContent.includes(name), { timeout: 8000 }, row, w[0].name);
        assert((await text(page, row)).includes("sleeps args.seconds"), "no description");
        assert(!/^—$/.test((await text(page, `${row} td[data-label="Oldest waiting"]`)).trim()), "no oldest waiting age");
        // The command's name opens its jobs (GET /v1/jobs?handler=).
        await page.click(`${row} td[data-label="Command"] a`);
        await page.waitForFunction((want) => { const r = [...document.querySelectorAll("#jobs-table tbody tr")].map((x) => x.dataset.job); return r.length === 3 && want.every((w) => r.includes(w)); }, { timeout: 8000 }, remote);
        await go(page, "#/workers");
        await page.waitForSelector(row);
      });
      await check("workers: the worker listed with its command, its task in flight and when it was last seen", async () => {
        const name = (await api("GET", "/v1/workers")).json.workers[0].name;
        const row = `tr[data-worker="${name}"]`;
        await page.waitForFunction((row) => document.querySelector(`${row} [data-field="in_flight"]`)?.textContent === "1", { timeout: 8000 }, row);
        const t = await text(page, row);
        assert(t.includes("py.sleep") && /ago/.test(t), t);
      });
      const shotWorkers = await shoot(page, "workers");
      tap(shotWorkers <= 0, "workers: no horizontal scrolling at 390 px", `overflows by ${shotWorkers}px`);
      await cleanCheck(page, "workers");

      await check("job: a running remote task shows the worker's progress, and progress events in the timeline", async () => {
        const id = await until("a job with progress", async () => {
          for (const r of remote) if ((await api("GET", `/v1/jobs/${r}`)).json.progress) return r;
          return null;
        });
        await go(page, `#/jobs/${id}`);
        await page.waitForFunction(() => /left_s/.test(document.querySelector("#progress:not([hidden])")?.textContent || ""), { timeout: 8000 });
        await page.waitForFunction(() => /left_s/.test(document.querySelector("#timeline li.k-progress")?.textContent || ""), { timeout: 8000 });
        await page.waitForFunction(() => /from \S+\/\d+/.test(document.querySelector("#progress")?.textContent || ""), { timeout: 8000 });
      });
      const shotRemote = await shoot(page, "job-remote");
      tap(shotRemote <= 0, "job (remote): no horizontal scrolling at 390 px", `overflows by ${shotRemote}px`);
      await cleanCheck(page, "job (remote)");
      await check("job: progress that reads as a fraction shows as a bar; it goes when the task ends", async () => {
        // A claim loop of our own (a second worker, "ui-test/1").
        assert((await api("PUT", "/v1/commands/ui.resize", {})).status === 201, "PUT /v1/commands/ui.resize");
        const id = await submit({ handler: "ui.resize", args: { w: 640 }, queue: "remote" });
        const c = await api("POST", "/v1/tasks/claim", { commands: ["ui.resize"], worker: "ui-test/1", max: 1, wait_ms: 5000, lease_ms: 60000 });
        const t = c.json?.tasks?.[0];
        assert(t && t.job_id === id, `claim: ${c.status} ${JSON.stringify(c.json)}`);
        await go(page, `#/jobs/${id}`);
        await page.waitForSelector("h1 .state");
        assert((await api("POST", `/v1/tasks/${t.id}/heartbeat`, { progress: { done: 3, total: 10 } })).status === 200, "heartbeat");
        await page.waitForFunction(() => document.querySelector("#progress:not([hidden]) progress")?.value === 0.3 &&
          /30 %/.test(document.querySelector("#progress").textContent) && /ui-test\/1/.test(document.querySelector("#progress").textContent), { timeout: 8000 });
        assert((await api("POST", `/v1/tasks/${t.id}/complete`, { result: { w: 640 } })).status === 200, "complete");
        await page.waitForFunction(() => document.querySelector("h1 .state")?.dataset.state === "succeeded" && document.querySelector("#progress").hidden, { timeout: 8000 });
      });
      await check("jobs: a label filter is sent to the server and stays live", async () => {
        const id = await submit({ handler: "echo", args: {}, labels: { team: "z", env: "prod" } });
        await go(page, "#/jobs?label=team%3Dz%2C%20env%3Dprod");
        await page.waitForFunction((id) => { const r = [...document.querySelectorAll("#jobs-table tbody tr")].map((x) => x.dataset.job); return r.length === 1 && r[0] === id; }, { timeout: 8000 }, id);
        const id2 = await submit({ handler: "echo", args: {}, labels: { team: "z", env: "prod" } });
        await page.waitForFunction((id) => document.querySelector("#jobs-table tbody tr")?.dataset.job === id, { timeout: 8000 }, id2);
      });
      for (const r of remote) await api("POST", `/v1/jobs/${r}/cancel`);
    } finally {
      worker.kill("SIGKILL");
    }

    await check("dark mode follows prefers-color-scheme", async () => {
      await page.emulateMediaFeatures([{ name: "prefers-color-scheme", value: "dark" }]);
      await go(page, "#/");
      await page.waitForSelector("[data-queue]");
      const bg = await page.evaluate(() => getComputedStyle(document.body).backgroundColor);
      await page.screenshot({ path: `${SHOTS}/overview-dark-1280.png` });
      await page.emulateMediaFeatures([{ name: "prefers-color-scheme", value: "light" }]);
      const bg2 = await page.evaluate(() => getComputedStyle(document.body).backgroundColor);
      assert(bg !== bg2 && bg === "rgb(17, 19, 24)", `dark ${bg}, light ${bg2}`);
    });
  } finally {
    await browser.close();
  }
}

// The Python example worker, serving py.sleep with one slot; heartbeats
// (with progress) every second.
function startWorker() {
  const path = fileURLToPath(new URL("../../examples/workers/python/worker.py", import.meta.url));
  const w = spawn("python3", [path, "--url", BASE, "--commands", "py.sleep", "--concurrency", "1",
    "--lease-ms", "3000", "--wait-ms", "1000"], { stdio: ["ignore", "ignore", "pipe"] });
  w.stderr.on("data", (d) => { if (process.env.JD_VERBOSE) process.stderr.write(d); });
  w.on("error", (e) => console.log(`# cannot start the example worker: ${e.message}`));
  // It would claim forever against a stopped server: it ends with us,
  // however we end (test_ui.sh's timeout sends SIGTERM).
  const end = () => { try { w.kill("SIGKILL"); } catch { /* gone */ } };
  process.on("exit", end);
  for (const sig of ["SIGTERM", "SIGINT"]) process.on(sig, () => { end(); process.exit(1); });
  return w;
}

async function tokenPhase() {
  const { browser, page } = await openBrowser();
  try {
    await page.goto(`${BASE}/ui/`, { waitUntil: "load" });
    await check("token: the page asks for the token", async () => {
      await page.waitForSelector("#token-dialog[open]", { timeout: 8000 });
    });
    await page.screenshot({ path: `${SHOTS}/token-1280.png` });
    await check("token: a wrong token is refused and asked again", async () => {
      await page.type("#token-input", "wrong");
      await page.keyboard.press("Enter");
      await page.waitForFunction(() => !document.getElementById("token-error").hidden, { timeout: 8000 });
    });
    await check("token: the right one loads the overview; kept for the tab (no prompt after reload)", async () => {
      await page.type("#token-input", TOKEN);
      await page.keyboard.press("Enter");
      await page.waitForSelector("#summary .panel", { timeout: 8000 });
      await page.reload({ waitUntil: "load" });
      await page.waitForSelector("#summary .panel", { timeout: 8000 });
      assert(!(await page.$("#token-dialog[open]")), "asked again after reload");
      assert((await page.evaluate(() => sessionStorage.getItem("jackdaw.token"))) === TOKEN, "not in sessionStorage");
    });
    await check("token: the API still refuses calls without it", async () => {
      assert((await api("GET", "/v1/queues")).status === 401, "not 401");
    });
    // The 401s before the token was given are the browser's log of the refused calls.
    await cleanCheck(page, "token", /status of 401 .*\/v1\/[a-z]+(\?[^)]*)?\)$/);
  } finally {
    await browser.close();
  }
}

try {
  await (phase === "token" ? tokenPhase() : mainPhase());
} catch (e) {
  tap(false, `${phase} phase ran to the end`, e.stack || e.message);
}
process.exit(failed ? 1 : 0);
