// Jobs: newest first, filtered by state, queue, schedule, command and label, paged
// with the API's cursor; the first page refreshes live. The filters live in
// the URL (#/jobs?state=failed&queue=mail), so a view can be shared.
import { get } from "./api.js";
import { h, replace, badge, JOB_STATES, timeEl, fmtDuration } from "./dom.js";
import { every } from "./poll.js";

const PAGE = 50;
const SCAN = 5; // pages read at most to fill one page (the server answers a rare match with short pages)

export function what(job) {
  const d = job.definition || {};
  if (d.steps) return `workflow, ${d.steps.length} step${d.steps.length === 1 ? "" : "s"}`;
  if (d.process) return `${d.process}.${d.method || "?"}`;
  if (d.handler) return d.handler;
  return "—";
}

export function duration(job) {
  if (!job.started_at) return null;
  const end = job.finished_at ? new Date(job.finished_at) : new Date();
  return end - new Date(job.started_at);
}

export function labelsEl(labels) {
  const e = Object.entries(labels || {});
  if (!e.length) return h("span", { class: "muted" }, "—");
  return h("span", { class: "labels" }, e.map(([k, v]) => h("span", { class: "label" }, `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`)));
}

function setHash(params) {
  const q = new URLSearchParams();
  for (const [k, v] of params) if (v) q.set(k, v);
  const s = q.toString();
  location.hash = s ? `#/jobs?${s}` : "#/jobs";
}

export function render(main, params) {
  const f = {
    state: params.get("state") || "", queue: params.get("queue") || "",
    schedule: params.get("schedule") || "", label: params.get("label") || "",
    handler: params.get("handler") || "",
  };
  const cursor = params.get("cursor") || "";
  const back = (params.get("back") || "").split(",").filter(Boolean); // cursors of the pages before

  const stateSel = h("select", { id: "f-state", name: "state" }, h("option", { value: "" }, "any state"),
    JOB_STATES.map((s) => h("option", { value: s, selected: s === f.state }, s)));
  const queueIn = h("input", { id: "f-queue", name: "queue", value: f.queue, placeholder: "any queue", list: "queue-names", size: 12 });
  const queueList = h("datalist", { id: "queue-names" });
  const schedIn = h("input", { id: "f-schedule", name: "schedule", value: f.schedule, placeholder: "any schedule", size: 12 });
  const handlerIn = h("input", { id: "f-handler", name: "handler", value: f.handler, placeholder: "any command", size: 12, title: "the job's top-level handler (a plugin or remote command)" });
  const labelIn = h("input", { id: "f-label", name: "label", value: f.label, placeholder: "key=value", size: 14, title: "key=value; several separated by commas must all match" });
  const form = h("form", { class: "filters", id: "job-filters", role: "search", "aria-label": "Filter jobs" },
    h("div", { class: "field" }, h("label", { for: "f-state" }, "State"), stateSel),
    h("div", { class: "field" }, h("label", { for: "f-queue" }, "Queue"), queueIn, queueList),
    h("div", { class: "field" }, h("label", { for: "f-schedule" }, "Schedule"), schedIn),
    h("div", { class: "field" }, h("label", { for: "f-handler" }, "Command"), handlerIn),
    h("div", { class: "field" }, h("label", { for: "f-label" }, "Label"), labelIn),
    h("button", { type: "submit", class: "primary" }, "Filter"),
    h("button", { type: "button", onclick: () => setHash(new Map()) }, "Clear"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    setHash(new Map([["state", stateSel.value], ["queue", queueIn.value.trim()],
      ["schedule", schedIn.value.trim()], ["handler", handlerIn.value.trim()], ["label", labelIn.value.trim()]]));
  });
  stateSel.addEventListener("change", () => form.requestSubmit());

  const status = h("p", { class: "muted", id: "jobs-status" });
  const body = h("tbody");
  const table = h("div", { class: "table-wrap" }, h("table", { class: "stack", id: "jobs-table" },
    h("thead", {}, h("tr", {}, ["ID", "State", "Queue", "What", "Labels", "Created", "Ran for"].map((t) => h("th", { scope: "col" }, t)))),
    body));
  const pager = h("nav", { class: "pager", "aria-label": "Pages of jobs" });
  const live = h("span", { class: cursor ? "live" : "live on" }, cursor ? "paused on older pages" : "live");
  replace(main, h("h1", {}, "Jobs ", live), form, status, table, pager);
  get("/v1/queues").then((r) => replace(queueList, r.queues.map((q) => h("option", { value: q.name })))).catch(() => {});

  // "team=a, env=prod" -> ["team:a", "env:prod"] for the API (all must match).
  const labels = f.label.split(",").map((x) => x.trim()).filter(Boolean).map((x) => {
    const i = x.search(/[=:]/);
    return i <= 0 ? null : `${x.slice(0, i).trim()}:${x.slice(i + 1).trim()}`;
  });

  async function load() {
    if (body.contains(document.activeElement)) return; // do not pull rows from under the keyboard
    if (labels.includes(null) || labels.length > 8) {
      status.className = "error";
      status.textContent = "A label filter is key=value (up to 8, separated by commas).";
      replace(body);
      return;
    }
    let rows = [], next = cursor || null, pages = 0;
    try {
      do {
        const q = new URLSearchParams({ limit: String(PAGE - rows.length) });
        for (const k of ["state", "queue", "schedule", "handler"]) if (f[k]) q.set(k, f[k]);
        for (const l of labels) q.append("label", l);
        if (next) q.set("cursor", next);
        const r = await get(`/v1/jobs?${q}`);
        rows = rows.concat(r.jobs);
        next = r.next_cursor;
        pages++;
      } while (rows.length < PAGE && next && pages < SCAN);
    } catch (e) {
      status.className = "error";
      status.textContent = `Cannot list jobs: ${e.message}`;
      return;
    }
    status.className = "muted";
    status.textContent = rows.length === 0 ? (next ? "None among the jobs read so far: see older pages." : "No jobs match.") : "";
    replace(body, rows.map((j) => h("tr", { "data-job": j.id },
      h("td", { "data-label": "ID" }, h("a", { href: `#/jobs/${j.id}` }, `#${j.id}`)),
      h("td", { "data-label": "State" }, badge(j.state)),
      h("td", { "data-label": "Queue" }, h("a", { href: `#/jobs?queue=${encodeURIComponent(j.queue)}` }, j.queue)),
      h("td", { "data-label": "What" }, what(j)),
      h("td", { "data-label": "Labels" }, labelsEl(j.labels)),
      h("td", { "data-label": "Created" }, timeEl(j.created_at, true)),
      h("td", { "data-label": "Ran for", class: "num" }, fmtDuration(duration(j))))));
    const page = (c, b) => {
      const p = new Map(Object.entries(f));
      p.set("cursor", c);
      p.set("back", b.join(","));
      setHash(p);
    };
    replace(pager,
      h("button", { type: "button", disabled: !cursor, onclick: () => page(back[back.length - 1] || "", back.slice(0, -1)) }, "← Newer"),
      h("button", { type: "button", disabled: !next, id: "older", onclick: () => page(next, [...back, cursor]) }, "Older →"));
  }
  // Live on the first page.
  return cursor ? (load(), null) : every(3000, load);
}
