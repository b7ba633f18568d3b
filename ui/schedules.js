// Schedules: every schedule with its timetable, next fire times, last fire
// and counts; pause, resume and trigger; its recent jobs on demand.
import { get, post } from "./api.js";
import { h, replace, badge, timeEl, ago, toast, attempt } from "./dom.js";
import { every } from "./poll.js";

const PAGE = 100;

export function render(main, params) {
  const cursor = params.get("cursor") || "";
  const status = h("p", { class: "muted", id: "schedules-status" }, "Loading…");
  const body = h("tbody");
  const pager = h("nav", { class: "pager", "aria-label": "Pages of schedules" });
  replace(main, h("h1", {}, "Schedules"), status,
    h("div", { class: "table-wrap" }, h("table", { class: "stack", id: "schedules-table" },
      h("thead", {}, h("tr", {}, ["Schedule", "State", "Timetable", "Next fires", "Last fire", "Fires / skips", "Actions"].map((t) => h("th", { scope: "col" }, t)))),
      body)), pager);
  const open = new Set(); // schedules whose recent jobs are shown

  async function load() {
    if (body.contains(document.activeElement) && document.activeElement.tagName !== "BUTTON") return;
    let r;
    try {
      r = await get(`/v1/schedules?limit=${PAGE}${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`);
    } catch (e) {
      status.className = e.status === 404 ? "muted" : "error";
      status.textContent = e.status === 404 ? "Schedules are not available on this server." : `Cannot list schedules: ${e.message}`;
      return;
    }
    status.className = "muted";
    status.textContent = r.schedules.length ? "" : "No schedules yet. Create one with PUT /v1/schedules/{id}.";
    const focusedId = document.activeElement?.dataset?.action ? [document.activeElement.closest("tr")?.dataset.schedule, document.activeElement.dataset.action] : null;
    replace(body, r.schedules.map((s) => row(s)));
    if (focusedId) body.querySelector(`tr[data-schedule="${CSS.escape(focusedId[0])}"] [data-action="${focusedId[1]}"]`)?.focus();
    replace(pager, cursor ? h("a", { class: "button", href: "#/schedules" }, "← First page") : null,
      r.next_cursor ? h("a", { class: "button", href: `#/schedules?cursor=${encodeURIComponent(r.next_cursor)}` }, "Next →") : null);
  }

  function row(s) {
    const act = async (verb) => {
      const r = await attempt(() => post(`/v1/schedules/${encodeURIComponent(s.id)}/${verb}`), `Cannot ${verb} ${s.id}`);
      if (!r) return;
      if (verb === "trigger") toast(`Schedule ${s.id} triggered: job #${r.id}`);
      else toast(`Schedule ${s.id} ${verb === "pause" ? "paused" : "resumed"}`);
      await load();
    };
    const btn = (verb, label) => h("button", { type: "button", "data-action": verb, "aria-label": `${label} schedule ${s.id}`, onclick: () => act(verb) }, label);
    const recent = h("div", { class: "recent" });
    const details = h("details", { open: open.has(s.id) }, h("summary", {}, "Recent jobs"), recent);
    const loadRecent = async () => {
      const r = await attempt(() => get(`/v1/jobs?schedule=${encodeURIComponent(s.id)}&limit=5`), "Cannot list its jobs");
      if (!r) return;
      replace(recent, r.jobs.length ? h("ul", {}, r.jobs.map((j) => h("li", {}, h("a", { href: `#/jobs/${j.id}` }, `#${j.id}`), " ", badge(j.state), " ", timeEl(j.created_at, true)))) : h("span", { class: "muted" }, "none yet"),
        h("div", {}, h("a", { href: `#/jobs?schedule=${encodeURIComponent(s.id)}` }, "All its jobs →")));
    };
    details.addEventListener("toggle", () => { if (details.open) { open.add(s.id); loadRecent(); } else open.delete(s.id); });
    if (open.has(s.id)) loadRecent();
    const table = s.cron ? `cron ${s.cron}` : s.every ? `every ${s.every}` : "—";
    const lf = s.last_fire;
    return h("tr", { "data-schedule": s.id },
      h("td", { "data-label": "Schedule" }, h("strong", {}, s.id), details),
      h("td", { "data-label": "State" }, s.paused ? badge("paused") : badge(s.state === "active" ? "active" : "pending", s.state || "active")),
      h("td", { "data-label": "Timetable" }, h("code", {}, table), s.timezone && s.timezone !== "UTC" ? h("span", { class: "sub" }, s.timezone) : null,
        h("span", { class: "sub" }, `overlap ${s.overlap}, catch-up ${s.catchup}`)),
      h("td", { "data-label": "Next fires" }, (s.next_fire_times || []).length ?
        h("span", {}, timeEl(s.next_fire_times[0]), h("span", { class: "sub" }, ago(s.next_fire_times[0])),
          s.next_fire_times.length > 1 ? h("span", { class: "sub" }, `then ${s.next_fire_times.slice(1, 3).map((t) => new Date(t).toLocaleTimeString()).join(", ")}`) : null)
        : h("span", { class: "muted" }, s.paused ? "paused" : "none")),
      h("td", { "data-label": "Last fire" }, lf ? h("span", {}, lf.outcome, lf.job_id ? [": job ", h("a", { href: `#/jobs/${lf.job_id}` }, `#${lf.job_id}`)] : null,
        h("span", { class: "sub" }, timeEl(lf.time, true))) : h("span", { class: "muted" }, "never")),
      h("td", { "data-label": "Fires / skips", class: "num" }, `${s.counts?.fires ?? 0} / ${s.counts?.skips ?? 0}`),
      h("td", { "data-label": "Actions" }, h("div", { class: "row" }, s.paused ? btn("resume", "Resume") : btn("pause", "Pause"), btn("trigger", "Run now"))));
  }
  return every(5000, load);
}
