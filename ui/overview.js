// Overview: every queue with its counts by state, paused or not, jobs ended
// over the last ten minutes (from /v1/stats), the job waiting longest, and
// pause/resume. Refreshes every two seconds, updating cards in place so
// keyboard focus stays where it was.
import { get, post } from "./api.js";
import { h, replace, badge, JOB_STATES, ago, toast, attempt } from "./dom.js";
import { barChart } from "./chart.js";
import { every } from "./poll.js";

const SECONDS = 600, STEP = 10;
// "3 %", and "<1 %" rather than "0 %" when some failed.
const pct = (part, whole) => (part && Math.round((100 * part) / whole) === 0 ? "<1 %" : `${Math.round((100 * part) / whole)} %`);

export function render(main) {
  const summary = h("div", { class: "grid", id: "summary" });
  const cards = h("div", { class: "grid", id: "queues" });
  const status = h("p", { class: "muted", id: "overview-status" }, "Loading…");
  replace(main, h("h1", {}, "Overview"), summary, h("h2", {}, "Queues"), status, cards);
  const byName = new Map();

  async function refresh() {
    let queues, stats;
    try {
      [queues, stats] = await Promise.all([get("/v1/queues"), get(`/v1/stats?seconds=${SECONDS}`)]);
    } catch (e) {
      status.textContent = `Cannot load the queues: ${e.message}`;
      status.className = "error";
      return;
    }
    const series = new Map(stats.queues.map((q) => [q.name, q]));
    const oldest = new Map(stats.oldest_queued.map((o) => [o.queue, o]));
    status.textContent = queues.queues.length ? "" : "No queues yet: submit a job to see one here.";
    status.className = "muted";
    renderSummary(summary, queues.queues, stats);
    const seen = new Set();
    for (const q of queues.queues) {
      seen.add(q.name);
      let card = byName.get(q.name);
      if (!card) {
        card = queueCard(q.name, refresh);
        byName.set(q.name, card);
      }
      card.update(q, series.get(q.name), oldest.get(q.name));
      cards.append(card.el); // keeps the order of /v1/queues (by name)
    }
    for (const [name, card] of byName)
      if (!seen.has(name)) { card.el.remove(); byName.delete(name); }
  }
  return every(2000, refresh);
}

function renderSummary(el, queues, stats) {
  const sum = Object.fromEntries(JOB_STATES.map((s) => [s, 0]));
  for (const q of queues) for (const s of JOB_STATES) sum[s] += q.counts[s] || 0;
  let done = 0, failed = 0;
  for (const q of stats.queues) {
    const last = (a) => a.slice(-60).reduce((x, y) => x + y, 0);
    done += last(q.succeeded) + last(q.failed) + last(q.cancelled);
    failed += last(q.failed);
  }
  const tile = (label, value, sub) => h("div", { class: "panel" },
    h("div", { class: "muted" }, label), h("div", { style: null, class: "n big" }, h("strong", {}, value)), sub ? h("div", { class: "muted" }, sub) : null);
  replace(el,
    tile("Waiting to run", `${sum.queued}`, `${sum.running} running, ${sum.waiting} waiting for a message`),
    tile("Ended in the last minute", `${done}`, done ? `${failed} failed (${pct(failed, done)})` : "none failed"),
    tile("Failed (all time)", `${sum.failed}`, `${sum.succeeded} succeeded, ${sum.cancelled} cancelled`));
}

// The queue's controls (PUT /v1/queues/{q}) where set, with the live
// numbers they cap: jobs holding a running slot (active), starts the rate
// allows now.
function controlChips(q) {
  const out = [];
  const chip = (key, label, value, title) => h("span", { class: "control", "data-control": key, title },
    h("span", { class: "k" }, label), " ", h("strong", {}, value));
  if (q.max_running)
    out.push(chip("max_running", "running", `${q.active ?? 0} of max ${q.max_running}`, "jobs of this queue holding a running slot, and its max_running"));
  if (q.rate)
    out.push(chip("rate", "rate", [`${q.rate.limit} per ${q.rate.per}`, q.rate_available !== undefined ?
      h("span", { class: "k" }, ` · ${q.rate_available} now`) : null], "starts allowed per period · starts allowed now"));
  if (q.retention)
    out.push(chip("retention", "retention", Object.entries(q.retention).map(([k, v]) => `${k} ${v}`).join(", "), "retention of ended jobs"));
  return out;
}

function queueCard(name, refresh) {
  const title = h("span", {}, name);
  const paused = h("span");
  const btn = h("button", { type: "button" }, "Pause");
  const counts = h("div", { class: "counts" });
  const chart = h("div");
  const foot = h("div", { class: "muted" });
  const controls = h("div", { class: "controls" });
  const el = h("section", { class: "panel queue-card", "data-queue": name, "aria-label": `Queue ${name}` },
    h("div", { class: "spread" }, h("h2", {}, title, paused), btn), controls, counts, chart,
    h("div", { class: "legend" }, h("span", {}, h("i", { class: "ok" }), "succeeded"),
      h("span", {}, h("i", { class: "bad" }), "failed"), h("span", {}, h("i", { class: "cx" }), "cancelled")),
    foot);
  let isPaused = false;
  btn.addEventListener("click", async () => {
    btn.disabled = true;
    const verb = isPaused ? "resume" : "pause";
    const r = await attempt(() => post(`/v1/queues/${encodeURIComponent(name)}/${verb}`), `Cannot ${verb} ${name}`);
    btn.disabled = false;
    if (r) { toast(`Queue ${name} ${r.paused ? "paused" : "resumed"}`); await refresh(); }
  });
  function update(q, s, oldest) {
    isPaused = q.paused;
    replace(paused, q.paused ? badge("paused") : badge("active", "running"));
    btn.textContent = q.paused ? "Resume" : "Pause";
    btn.setAttribute("aria-label", `${q.paused ? "Resume" : "Pause"} queue ${name}`);
    replace(counts, JOB_STATES.map((st) => h("a", {
      class: "count", href: `#/jobs?queue=${encodeURIComponent(name)}&state=${st}`, "data-count": st,
      "aria-label": `${q.counts[st] || 0} ${st} in ${name}`,
    }, h("span", { class: "n" }, `${q.counts[st] || 0}`), h("span", { class: "l" }, badge(st)))));
    replace(controls, controlChips(q));
    replace(chart, barChart(s, STEP, SECONDS));
    const tot = s?.totals || { succeeded: 0, failed: 0, cancelled: 0 };
    const ended = tot.succeeded + tot.failed + tot.cancelled;
    replace(foot,
      h("div", {}, `Last ${SECONDS / 60} min: ${ended} ended, ${tot.failed} failed`,
        ended ? ` (${pct(tot.failed, ended)})` : "",
        `, ${(ended / (SECONDS / 60)).toFixed(1)} per minute`),
      h("div", { "data-oldest": "" }, "Oldest queued: ",
        oldest ? [h("a", { href: `#/jobs/${oldest.id}` }, `#${oldest.id}`), `, created ${ago(oldest.created_at)}`] : "none"));
  }
  return { el, update };
}
