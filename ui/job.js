// One job: what it is, its input and output or error, attempts and timing,
// its workflow steps (parallel groups side by side) with each step's state
// and duration, and its history as a live timeline over SSE. Actions:
// cancel, retry, send a message.
import { get, post, stream, ApiError } from "./api.js";
import { h, replace, badge, timeEl, fmtDuration, jsonBlock, toast, attempt } from "./dom.js";
import { what, duration, labelsEl } from "./jobs.js";

const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
const SHOWN = 500; // timeline rows kept on the page; older ones are summarised

// 0..1 from a progress value that reads as one: a number (0..1, or a
// percentage up to 100), or {percent}, {fraction}, {done|current, total}.
function fraction(p) {
  const ok = (x) => (typeof x === "number" && isFinite(x) ? Math.min(Math.max(x, 0), 1) : null);
  if (typeof p === "number") return ok(p > 1 ? p / 100 : p);
  if (!p || typeof p !== "object") return null;
  if (typeof p.percent === "number") return ok(p.percent / 100);
  if (typeof p.fraction === "number") return ok(p.fraction);
  const done = p.done ?? p.current;
  if (typeof done === "number" && typeof p.total === "number" && p.total > 0) return ok(done / p.total);
  return null;
}

export function render(main, params) {
  const id = params.get("id");
  if (!/^[0-9]+$/.test(id)) {
    replace(main, h("h1", {}, "No such job"), h("p", {}, `Job ids are numbers; "${id}" is not one.`));
    return null;
  }
  const title = h("h1", {}, `Job #${id}`);
  const actions = h("div", { class: "row", id: "job-actions" });
  const facts = h("dl", { class: "facts" });
  const io = h("div");
  const steps = h("div");
  const tl = h("ol", { class: "timeline", id: "timeline", "aria-live": "polite" });
  const tlNote = h("p", { class: "muted" });
  const live = h("span", { class: "live" }, "connecting");
  const prog = h("section", { class: "progress-box", id: "progress", "aria-label": "Progress", hidden: true });
  replace(main, title, actions, prog,
    h("div", { class: "grid" },
      h("section", { class: "panel", "aria-label": "Facts" }, h("h2", {}, "Details"), facts),
      h("section", { class: "panel", "aria-label": "Steps", id: "steps-panel" }, steps)),
    h("section", { class: "panel", "aria-label": "Input and output" }, io),
    h("section", { class: "panel", "aria-label": "Timeline" },
      h("div", { class: "spread" }, h("h2", {}, "Timeline"), live), tlNote, tl));

  let job = null;
  const events = [];
  let stopped = false;
  let refreshing = null;

  async function refresh() {
    if (refreshing) return refreshing;
    refreshing = (async () => {
      try {
        job = await get(`/v1/jobs/${id}`);
      } catch (e) {
        if (e instanceof ApiError && e.status === 404) {
          replace(main, h("h1", {}, `Job #${id}`), h("p", { class: "error" }, "There is no job with this id."),
            h("p", {}, h("a", { href: "#/jobs" }, "All jobs")));
          stopped = true;
          sse?.stop();
        } else toast(`Cannot load job ${id}: ${e.message}`, true);
        return;
      }
      draw();
    })().finally(() => { refreshing = null; });
    return refreshing;
  }

  function draw() {
    replace(title, `Job #${job.id} `, badge(job.state));
    drawActions();
    const d = job.definition || {};
    replace(facts,
      h("dt", {}, "Queue"), h("dd", {}, h("a", { href: `#/jobs?queue=${encodeURIComponent(job.queue)}` }, job.queue)),
      h("dt", {}, "What"), h("dd", {}, what(job)),
      h("dt", {}, "Priority"), h("dd", {}, String(job.priority)),
      h("dt", {}, "Attempts"), h("dd", { "data-fact": "attempts" }, String(job.attempts),
        d.retry ? h("span", { class: "muted" }, ` of ${d.retry.max_attempts ?? "?"}`) : ""),
      h("dt", {}, "Labels"), h("dd", {}, labelsEl(job.labels)),
      h("dt", {}, "Created"), h("dd", {}, timeEl(job.created_at)),
      h("dt", {}, "Run at"), h("dd", {}, timeEl(job.run_at)),
      h("dt", {}, "Started"), h("dd", {}, timeEl(job.started_at)),
      h("dt", {}, "Finished"), h("dd", {}, timeEl(job.finished_at)),
      h("dt", {}, "Ran for"), h("dd", {}, fmtDuration(duration(job))),
      h("dt", {}, "Version"), h("dd", {}, String(job.version)));
    replace(io,
      job.error !== null ? h("div", { class: "error-box" }, h("h2", { class: "error" }, "Error"), jsonBlock(job.error)) : null,
      h("h2", {}, "Output"), job.output === null ? h("p", { class: "muted" }, TERMINAL.has(job.state) ? "none" : "not yet") : jsonBlock(job.output),
      d.input !== undefined ? [h("h2", {}, "Input"), jsonBlock(d.input)] : null,
      jsonBlock(d, "Definition", 0));
    drawSteps();
    drawProgress();
  }

  // A running remote step's latest progress (the worker's heartbeat), as a
  // bar when it reads as a fraction, and as JSON.
  function drawProgress() {
    if (job.progress === undefined || TERMINAL.has(job.state)) { prog.hidden = true; return; }
    const p = job.progress;
    const f = fraction(p);
    const last = [...events].reverse().find((e) => e.kind === "progress");
    prog.hidden = false;
    replace(prog, h("div", { class: "spread" }, h("h2", {}, "Progress", last ? [" ", stepName(last.tag)] : null),
      last ? h("span", { class: "muted small" }, last.data?.worker ? `from ${last.data.worker} at ` : "at ",
        h("time", { datetime: last.time, title: last.time }, new Date(last.time).toLocaleTimeString())) : null),
      f === null ? null : h("div", { class: "bar" }, h("progress", { max: "1", value: String(f), "aria-label": `${Math.round(f * 100)} %` }),
        h("span", { class: "small" }, `${Math.round(f * 100)} %`)),
      typeof p === "object" && p !== null ? jsonBlock(p) : h("p", { class: "mono", "data-progress": "" }, JSON.stringify(p)));
  }

  // The buttons and the message form are made once and shown or hidden as
  // the state changes, so a refresh never swaps them under the pointer or
  // the keyboard focus (or drops what is typed).
  const busy = (btn, p) => { btn.disabled = true; return p.finally(() => { btn.disabled = false; }); };
  const cancelBtn = h("button", { type: "button", class: "danger", id: "cancel", hidden: true }, "Cancel");
  cancelBtn.addEventListener("click", () => busy(cancelBtn, attempt(() => post(`/v1/jobs/${id}/cancel`), "Cannot cancel")
    .then((r) => { if (r) { toast(`Cancelling job #${id}`); refresh(); } })));
  const retryBtn = h("button", { type: "button", id: "retry", hidden: true }, "Retry");
  retryBtn.addEventListener("click", () => busy(retryBtn, attempt(() => post(`/v1/jobs/${id}/retry`), "Cannot retry")
    .then((r) => { if (r) { toast(`Job #${id} queued again`); restartStream(); refresh(); } })));
  const topic = h("input", { id: "msg-topic", required: true, placeholder: "approval", size: 14 });
  const data = h("textarea", { id: "msg-data", rows: 3 }, "{}");
  const msgErr = h("p", { class: "error", hidden: true });
  const form = h("form", { id: "message-form" },
    h("div", { class: "field" }, h("label", { for: "msg-topic" }, "Topic"), topic),
    h("div", { class: "field" }, h("label", { for: "msg-data" }, "Data (JSON)"), data), msgErr,
    h("div", { class: "row end" }, h("button", { type: "submit", class: "primary" }, "Send message")));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    let value;
    try { value = JSON.parse(data.value || "null"); } catch (e) {
      msgErr.hidden = false; msgErr.textContent = `Data is not JSON: ${e.message}`; data.focus(); return;
    }
    msgErr.hidden = true;
    const r = await attempt(() => post(`/v1/jobs/${id}/messages`, { topic: topic.value, data: value }), "Cannot send");
    if (r !== null) { toast(`Message "${topic.value}" sent`); refresh(); }
  });
  const msg = h("details", { id: "message-details", hidden: true }, h("summary", {}, "Send a message"), form);
  actions.append(cancelBtn, retryBtn, msg);

  function drawActions() {
    const terminal = TERMINAL.has(job.state);
    cancelBtn.hidden = terminal;
    retryBtn.hidden = job.state !== "failed" && job.state !== "cancelled";
    msg.hidden = terminal;
  }

  // Workflow steps from the definition, their states from the events: a
  // step's tag is its index in the flattened (depth-first) list, plus one.
  function drawSteps() {
    const d = job.definition || {};
    if (!d.steps) {
      replace(steps, h("h2", {}, "Attempts"), attemptsList());
      return;
    }
    let tag = 0;
    const byTag = stepEvents();
    const out = job.output || {};
    const errStep = job.error && job.error.step;
    const item = (s) => {
      tag++;
      const t = tag;
      const ev = byTag.get(t) || {};
      let state = "pending";
      if (ev.done) state = ev.error ? "failed" : "succeeded";
      else if (ev.start) state = TERMINAL.has(job.state) ? (job.state === "cancelled" ? "cancelled" : "failed") : "running";
      if (s.id in out && state !== "failed") state = "succeeded";
      if (errStep === s.id) state = "failed";
      if (s.wait && state === "pending" && job.state === "waiting") state = "waiting";
      let kind = s.call ? `call ${s.call}` : s.sleep_ms !== undefined ? `sleep ${fmtDuration(s.sleep_ms)}` :
        s.wait ? `wait for "${s.wait}"` : s.parallel ? `parallel, ${s.parallel.length} steps` : "";
      const children = s.parallel ? s.parallel.map(item) : null;
      if (children) {
        const st = children.map((c) => c.dataset.state);
        state = st.every((x) => x === "succeeded") ? "succeeded" : st.includes("failed") ? "failed" :
          st.includes("running") || st.includes("waiting") ? "running" : st.includes("cancelled") ? "cancelled" : "pending";
      }
      const took = ev.start && ev.done ? fmtDuration(ev.done - ev.start) : ev.start && !TERMINAL.has(job.state) ? `${fmtDuration(Date.now() - ev.start)} so far` : "";
      return h("li", { class: "step", "data-step": s.id, "data-state": state },
        h("div", { class: "step-head" }, badge(state), h("span", { class: "id" }, s.id), h("span", { class: "muted" }, kind),
          took ? h("span", { class: "muted" }, `· ${took}`) : null, ev.attempt > 1 ? h("span", { class: "muted" }, `· attempt ${ev.attempt}`) : null),
        children ? h("ul", { class: "group", "aria-label": `${s.id}: runs at once` }, children) : null);
    };
    replace(steps, h("h2", {}, "Steps"), h("ul", { class: "steps", id: "steps" }, d.steps.map(item)),
      h("h3", {}, "Attempts"), attemptsList());
  }

  // tag -> {start, done (ms), error, attempt} for the latest run.
  function stepEvents() {
    const m = new Map();
    let run = 0;
    for (const e of events) if (e.data && e.data.run > run) run = e.data.run;
    for (const e of events) {
      if (!e.tag || (e.data && e.data.run !== undefined && e.data.run !== run)) continue;
      const s = m.get(e.tag) || {};
      const t = new Date(e.time).getTime();
      if (e.kind === "dispatch") { s.start = t; s.attempt = e.data.attempt; s.done = undefined; s.error = undefined; }
      if (e.kind === "complete") { s.done = t; s.error = e.data.error; }
      m.set(e.tag, s);
    }
    return m;
  }

  function attemptsList() {
    const runs = [];
    for (const e of events) {
      if (e.kind !== "state" || !e.data) continue;
      const r = e.data.run;
      if (e.data.state === "running" && r) runs[r - 1] = { start: e.time };
      else if (r && runs[r - 1] && TERMINAL.has(e.data.state)) { runs[r - 1].end = e.time; runs[r - 1].state = e.data.state; }
    }
    if (!runs.length) return h("p", { class: "muted" }, job.state === "queued" ? "Not started yet." : "—");
    return h("ol", { id: "attempts" }, runs.map((r, i) => h("li", {}, `Run ${i + 1}: `, r?.state ? badge(r.state) : badge("running"),
      " ", r ? timeEl(r.start) : "", r?.end ? ` · ${fmtDuration(new Date(r.end) - new Date(r.start))}` : "")));
  }

  // The step a tag belongs to (tags number the flattened steps from 1).
  function stepName(tag) {
    const ids = [];
    const walk = (list) => { for (const s of list || []) { ids.push(s.id); walk(s.parallel); } };
    walk(job?.definition?.steps);
    const id = ids[tag - 1];
    return id ? h("span", { class: "step-ref" }, id) : null;
  }

  function describe(e) {
    const d = e.data || {};
    switch (e.kind) {
      case "state": return [badge(d.state), d.run ? h("span", { class: "muted" }, ` run ${d.run}`) : null];
      case "dispatch": return [stepName(e.tag), `${d.command}`, d.attempt > 1 ? ` (attempt ${d.attempt})` : ""];
      case "complete": return [stepName(e.tag), d.error ? h("span", { class: "error" }, `error: ${d.error.message || JSON.stringify(d.error)}`) : h("span", { class: "muted" }, JSON.stringify(d.result ?? null).slice(0, 160))];
      case "message": return `topic "${d.topic}"`;
      case "progress": return [stepName(e.tag), h("span", { class: "progress-data" }, JSON.stringify(d.progress ?? null).slice(0, 160)),
        d.worker ? h("span", { class: "muted" }, ` · ${d.worker}`) : null];
      default: return h("span", { class: "muted" }, JSON.stringify(d).slice(0, 160));
    }
  }

  function addEvent(e) {
    events.push(e);
    const li = h("li", { class: `k-${e.kind}`, "data-seq": e.seq },
      h("time", { class: "when", datetime: e.time, title: e.time }, new Date(e.time).toLocaleTimeString(undefined, { hour12: false }) + `.${String(new Date(e.time).getMilliseconds()).padStart(3, "0")}`),
      h("span", { class: "kind" }, e.kind), describe(e));
    tl.append(li);
    while (tl.children.length > SHOWN) tl.firstElementChild.remove();
    tlNote.textContent = events.length > SHOWN ? `Showing the latest ${SHOWN} of ${events.length} events.` : "";
  }

  let sse = null;
  let redraw = null;
  function restartStream() {
    sse?.stop();
    events.length = 0;
    tl.replaceChildren();
    sse = stream(`/v1/jobs/${id}/events`, (kind, e) => {
      addEvent(e);
      // Coalesce: a burst of events redraws the job once.
      if (!redraw) redraw = setTimeout(() => { redraw = null; if (!stopped) refresh(); }, 150);
    }, (on, why) => {
      live.className = on ? "live on" : "live";
      live.textContent = on ? "live" : why === "end" ? "ended" : why ? `stopped: ${why.message}` : "reconnecting";
    });
  }
  refresh().then(() => { if (!stopped) restartStream(); });
  return () => { stopped = true; sse?.stop(); clearTimeout(redraw); };
}
