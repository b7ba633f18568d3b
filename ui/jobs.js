// Jobs: newest first, filtered by state, queue, schedule and label, paged
// with the API's cursor; the first page refreshes live. The filters live in
// the URL (#/jobs?state=failed&queue=mail), so a view can be shared.
import { get } from "./api.js";
import { h, replace, badge, JOB_STATES, timeEl, fmtDuration } from "./dom.js";
import { every } from "./poll.js";

const PAGE = 50;
const LABEL_SCAN = 100; // pages read at most (5000 jobs) to fill one page of a label filter

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
  };
  const cursor = params.get("cursor") || "";
  const back = (params.get("back") || "").split(",").filter(Boolean); // cursors of the pages before

  const stateSel = h("select", { id: "f-state", name: "state" }, h("option", { value: "" }, "any state"),
    JOB_STATES.map((s) => h("option", { value: s, selected: s === f.state }, s)));
  const queueIn = h("input", { id: "f-queue", name: "queue", value: f.queue, placeholder: "any queue", list: "queue-names", size: 12 });
  const queueList = h("datalist", { id: "queue-names" });
  const schedIn = h("input", { id: "f-schedule", name: "schedule", value: f.schedule, placeholder: "any schedule", size: 12 });
  const labelIn = h("input", { id: "f-label", name: "label", value: f.label, placeholder: "key=value", size: 12, title: "key=value, or key alone" });
  const form = h("form", { class: "filters", id: "job-filters", role: "search", "aria-label": "Filter jobs" },
    h("div", { class: "field" }, h("label", { for: "f-state" }, "State"), stateSel),
    h("div", { class: "field" }, h("label", { for: "f-queue" }, "Queue"), queueIn, queueList),
    h("div", { class: "field" }, h("label", { for: "f-schedule" }, "Schedule"), schedIn),
    h("div", { class: "field" }, h("label", { for: "f-label" }, "Label"), labelIn),
    h("button", { type: "submit", class: "primary" }, "Filter"),
    h("button", { type: "button", onclick: () => setHash(new Map()) }, "Clear"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    setHash(new Map([["state", stateSel.value], ["queue", queueIn.value.trim()],
      ["schedule", schedIn.value.trim()], ["label", labelIn.value.trim()]]));
  });
  stateSel.addEventListener("change", () => form.requestSubmit());

  const status = h("p", { class: "muted", id: "jobs-status" });
  const body = h("tbody");
  const table = h("div", { class: "table-wrap" }, h("table", { class: "stack", id: "jobs-table" },
    h("thead", {}, h("tr", {}, ["ID", "State", "Queue", "What", "Labels", "Created", "Ran for"].map((t) => h("th", { scope: "col" }, t)))),
    body));
  const pager = h("nav", { class: "pager", "aria-label": "Pages of jobs" });
  const live = h("span", { class: cursor || f.label ? "live" : "live on" },
    cursor ? "paused on older pages" : f.label ? "not live with a label filter" : "live");
  replace(main, h("h1", {}, "Jobs ", live), form, status, table, pager);
  get("/v1/queues").then((r) => replace(queueList, r.queues.map((q) => h("option", { value: q.name })))).catch(() => {});

  let labelKey = null, labelVal = null;
  if (f.label) {
    const i = f.label.search(/[=:]/);
    labelKey = i < 0 ? f.label : f.label.slice(0, i);
    labelVal = i < 0 ? null : f.label.slice(i + 1);
  }
  const match = (j) => labelKey === null || (labelKey in (j.labels || {}) &&
    (labelVal === null || String(j.labels[labelKey]) === labelVal));

  async function load() {
    if (body.contains(document.activeElement)) return; // do not pull rows from under the keyboard
    let rows = [], next = cursor || null, scanned = 0, pages = 0;
    try {
      do {
        const q = new URLSearchParams({ limit: String(PAGE) });
        for (const k of ["state", "queue", "schedule"]) if (f[k]) q.set(k, f[k]);
        // Servers that filter by label take it (key:value); the others
        // ignore it and the rows are filtered here, page by page.
        if (labelKey !== null) q.set("label", labelVal === null ? labelKey : `${labelKey}:${labelVal}`);
        if (next) q.set("cursor", next);
        const r = await get(`/v1/jobs?${q}`);
        scanned += r.jobs.length;
        rows = rows.concat(r.jobs.filter(match));
        next = r.next_cursor;
        pages++;
      } while (labelKey !== null && rows.length < PAGE && next && pages < LABEL_SCAN);
    } catch (e) {
      status.className = "error";
      status.textContent = `Cannot list jobs: ${e.message}`;
      return;
    }
    status.className = "muted";
    status.textContent = rows.length === 0 ? "No jobs match." :
      labelKey !== null ? `${rows.length} with label ${f.label} among ${scanned} jobs read (the label filter is applied here, page by page).` : "";
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
  // Live on the first page; a label filter scans pages, so it loads once.
  return cursor || labelKey !== null ? (load(), null) : every(3000, load);
}
