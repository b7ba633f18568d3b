// Workers and commands: the plugins loaded in the server (/v1/handlers), and
// the remote commands and workers (/v1/commands, /v1/workers) when the
// server has them; a 404 shows "not available" instead of an error, so this
// page lights up by itself on a server that serves those routes. Their rows
// are shown field by field, whatever fields the server sends.
import { get } from "./api.js";
import { h, replace, timeEl } from "./dom.js";
import { every } from "./poll.js";

const NICE = { name: "Name", id: "ID", worker: "Worker", commands: "Commands", depth: "Waiting", waiting: "Waiting",
  in_flight: "In flight", inflight: "In flight", oldest_waiting: "Oldest waiting", last_seen: "Last seen",
  last_seen_at: "Last seen", kind: "Kind", source: "Source", timeout_ms: "Timeout (ms)", description: "Description" };

function cell(k, v) {
  if (v === null || v === undefined) return h("span", { class: "muted" }, "—");
  if (typeof v === "string" && /^\d{4}-\d\d-\d\dT/.test(v)) return timeEl(v, true);
  if (Array.isArray(v)) return v.map((x) => (typeof x === "object" ? JSON.stringify(x) : String(x))).join(", ") || "—";
  if (typeof v === "object") return h("code", {}, JSON.stringify(v));
  return String(v);
}

const nice = (k) => NICE[k] || (k.charAt(0).toUpperCase() + k.slice(1)).replace(/_/g, " ");

function table(id, rows) {
  if (!rows.length) return h("p", { class: "muted" }, "None.");
  const keys = [];
  for (const r of rows) for (const k of Object.keys(r)) if (!keys.includes(k)) keys.push(k);
  return h("div", { class: "table-wrap" }, h("table", { class: "stack", id },
    h("thead", {}, h("tr", {}, keys.map((k) => h("th", { scope: "col" }, nice(k))))),
    h("tbody", {}, rows.map((r) => h("tr", {}, keys.map((k) => h("td", { "data-label": nice(k) }, cell(k, r[k]))))))));
}

// The array in a list answer ({"workers": [...]} or a bare array).
function items(body, key) {
  if (Array.isArray(body)) return body;
  if (body && Array.isArray(body[key])) return body[key];
  const arr = body && Object.values(body).find(Array.isArray);
  return arr || [];
}

export function render(main) {
  const cmds = h("section", { class: "panel", id: "commands", "aria-label": "Commands" }, h("h2", {}, "Commands"), h("p", { class: "muted" }, "Loading…"));
  const wrk = h("section", { class: "panel", id: "workers", "aria-label": "Workers" }, h("h2", {}, "Workers"), h("p", { class: "muted" }, "Loading…"));
  const plugins = h("section", { class: "panel", id: "plugins", "aria-label": "Plugins" }, h("h2", {}, "Plugins in the server"), h("p", { class: "muted" }, "Loading…"));
  replace(main, h("h1", {}, "Workers and commands"), cmds, wrk, plugins);

  async function section(el, title, path, key) {
    try {
      const body = await get(path);
      replace(el, h("h2", {}, title), table(`${key}-table`, items(body, key)));
    } catch (e) {
      replace(el, h("h2", {}, title), e.status === 404 || e.status === 405
        ? h("p", { class: "muted na", "data-na": key }, `Not available: this server has no ${path} (remote workers are not part of this build).`)
        : h("p", { class: "error" }, `Cannot load ${path}: ${e.message}`));
    }
  }
  async function loadPlugins() {
    try {
      const r = await get("/v1/handlers");
      replace(plugins, h("h2", {}, "Plugins in the server"), table("plugins-table", r.plugins.map((p) => ({
        name: p.name, version: p.version,
        commands: p.commands.map((c) => c.name + (c.blocking ? " (blocking)" : "")),
        process_types: p.process_types.map((t) => `${t.name}: ${t.methods.join(", ")}`),
      }))));
    } catch (e) {
      replace(plugins, h("h2", {}, "Plugins in the server"), h("p", { class: "error" }, `Cannot load /v1/handlers: ${e.message}`));
    }
  }
  return every(3000, () => Promise.all([section(cmds, "Commands", "/v1/commands", "commands"),
    section(wrk, "Workers", "/v1/workers", "workers"), loadPlugins()]));
}
