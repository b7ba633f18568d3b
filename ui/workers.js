// Workers and commands: the remote commands (/v1/commands, kind "remote")
// with their depth, oldest waiting task, tasks in flight and the workers
// serving each; the workers seen lately (/v1/workers) with their commands,
// tasks in flight and last contact; and the plugins loaded in the server
// (/v1/handlers). A server without the remote routes (404) shows "not
// available" for those two sections instead of an error.
import { get } from "./api.js";
import { h, replace, timeEl, fmtDuration } from "./dom.js";
import { every } from "./poll.js";

const NA = (path) => h("p", { class: "muted na", "data-na": path.slice(4) },
  `Not available: this server has no ${path} (remote workers are not part of this build).`);

function table(id, cols, rows) {
  return h("div", { class: "table-wrap" }, h("table", { class: "stack", id },
    h("thead", {}, h("tr", {}, cols.map(([label, cls]) => h("th", { scope: "col", class: cls || null }, label)))),
    h("tbody", {}, rows)));
}
const td = (label, cls, ...kids) => h("td", { "data-label": label, class: cls || null }, ...kids);
const chips = (names, href) => names.length
  ? h("span", { class: "labels" }, names.map((n) => href ? h("a", { class: "label", href: href(n) }, n) : h("span", { class: "label" }, n)))
  : h("span", { class: "muted" }, "none");

function commandsTable(cmds, workers) {
  const remote = cmds.filter((c) => c.kind === "remote");
  const plugin = cmds.length - remote.length;
  const note = h("p", { class: "muted" }, `${plugin} plugin command${plugin === 1 ? "" : "s"} run in the server (see Plugins below).`);
  if (!remote.length)
    return [h("p", { class: "muted", id: "commands-none" }, "No remote commands registered. A worker registers its commands with PUT /v1/commands/{name}."), note];
  const serving = (name) => workers ? workers.filter((w) => w.commands.includes(name)) : null;
  return [table("commands-table", [["Command"], ["Waiting", "num"], ["Oldest waiting", "num"], ["In flight", "num"], ["Workers"], ["Timeout", "num"]],
    remote.map((c) => {
      const ws = serving(c.name);
      return h("tr", { "data-command": c.name },
        td("Command", null, h("span", {}, h("a", { href: `#/jobs?handler=${encodeURIComponent(c.name)}`, title: `jobs of ${c.name}`, class: "mono strong" }, c.name), c.description ? h("span", { class: "sub" }, c.description) : null)),
        td("Waiting", "num", h("span", { "data-field": "waiting" }, String(c.waiting))),
        td("Oldest waiting", "num", c.oldest_waiting_ms === null ? h("span", { class: "muted" }, "—") : fmtDuration(c.oldest_waiting_ms)),
        td("In flight", "num", h("span", { "data-field": "in_flight" }, String(c.in_flight))),
        td("Workers", null, ws === null ? h("span", { class: "muted" }, "?") :
          h("span", { "data-field": "workers", title: `${ws.length} serving` }, ws.length ? chips(ws.map((w) => w.name)) : h("span", { class: c.waiting ? "error" : "muted" }, c.waiting ? "none: tasks wait" : "none"))),
        td("Timeout", "num", c.timeout_ms ? fmtDuration(c.timeout_ms) : h("span", { class: "muted" }, "none")));
    })), note];
}

function workersTable(workers) {
  if (!workers.length)
    return h("p", { class: "muted", id: "workers-none" }, "No worker seen in the last 5 minutes.");
  return table("workers-table", [["Worker"], ["Commands"], ["In flight", "num"], ["Last seen"]],
    workers.map((w) => h("tr", { "data-worker": w.name },
      td("Worker", null, h("strong", { class: "mono" }, w.name)),
      td("Commands", null, chips(w.commands)),
      td("In flight", "num", h("span", { "data-field": "in_flight" }, String(w.in_flight))),
      td("Last seen", null, timeEl(w.last_seen_at, true)))));
}

export function render(main) {
  const cmds = h("section", { class: "panel", id: "commands", "aria-label": "Remote commands" }, h("h2", {}, "Remote commands"), h("p", { class: "muted" }, "Loading…"));
  const wrk = h("section", { class: "panel", id: "workers", "aria-label": "Workers" }, h("h2", {}, "Workers"), h("p", { class: "muted" }, "Loading…"));
  const plugins = h("section", { class: "panel", id: "plugins", "aria-label": "Plugins" }, h("h2", {}, "Plugins in the server"), h("p", { class: "muted" }, "Loading…"));
  replace(main, h("h1", {}, "Workers and commands"), cmds, wrk, plugins);

  // {body} on success, {na} on 404/405, {error} otherwise.
  const load = (path) => get(path).then((body) => ({ body }),
    (e) => (e.status === 404 || e.status === 405 ? { na: true } : { error: e }));
  const err = (path, e) => h("p", { class: "error" }, `Cannot load ${path}: ${e.message}`);

  async function refresh() {
    if (main.querySelector("table")?.contains(document.activeElement)) return; // keep keyboard focus
    const [c, w, p] = await Promise.all([load("/v1/commands"), load("/v1/workers"), load("/v1/handlers")]);
    const workers = w.body ? w.body.workers : null;
    replace(cmds, h("h2", {}, "Remote commands"), c.na ? NA("/v1/commands") : c.error ? err("/v1/commands", c.error) : commandsTable(c.body.commands, workers));
    replace(wrk, h("h2", {}, "Workers ", h("span", { class: "muted small" }, "seen in the last 5 minutes")),
      w.na ? NA("/v1/workers") : w.error ? err("/v1/workers", w.error) : workersTable(workers));
    replace(plugins, h("h2", {}, "Plugins in the server"), p.error ? err("/v1/handlers", p.error) : p.na ? NA("/v1/handlers") :
      table("plugins-table", [["Plugin"], ["Version"], ["Commands"], ["Process types"]], p.body.plugins.map((x) => h("tr", {},
        td("Plugin", null, h("strong", {}, x.name)), td("Version", null, String(x.version ?? "—")),
        td("Commands", null, chips(x.commands.map((k) => k.name + (k.blocking ? " (blocking)" : "")))),
        td("Process types", null, x.process_types.length ? x.process_types.map((t) => h("span", { class: "sub" }, `${t.name}: ${t.methods.join(", ")}`)) : h("span", { class: "muted" }, "none"))))));
  }
  return every(2000, refresh);
}
