// The dashboard's entry point: a hash router over the pages. Each page is a
// module whose render(main, params) fills <main> and returns a function
// that stops its timers and streams when the user leaves.
import * as overview from "./overview.js";
import * as jobs from "./jobs.js";
import * as job from "./job.js";
import * as schedules from "./schedules.js";
import * as workers from "./workers.js";
import { h, replace } from "./dom.js";

const main = document.getElementById("main");
let leave = null;

function route() {
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, query] = hash.split("?");
  const params = new URLSearchParams(query || "");
  const parts = path.split("/").filter(Boolean);
  if (parts.length === 0) return ["overview", overview, params];
  if (parts[0] === "jobs" && parts.length === 1) return ["jobs", jobs, params];
  if (parts[0] === "jobs" && parts.length === 2) { params.set("id", decodeURIComponent(parts[1])); return ["jobs", job, params]; }
  if (parts[0] === "schedules") return ["schedules", schedules, params];
  if (parts[0] === "workers") return ["workers", workers, params];
  return [null, null, params];
}

function show() {
  if (leave) { leave(); leave = null; }
  const [nav, page, params] = route();
  for (const a of document.querySelectorAll("[data-nav]"))
    a.toggleAttribute("aria-current", a.dataset.nav === nav) && a.setAttribute("aria-current", "page");
  if (!page) {
    replace(main, h("h1", {}, "Not found"), h("p", {}, h("a", { href: "#/" }, "Back to the overview")));
    return;
  }
  replace(main);
  leave = page.render(main, params) || null;
  if (document.activeElement && document.activeElement.closest("nav")) main.focus({ preventScroll: true });
}

document.getElementById("jump").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const input = document.getElementById("jump-id");
  const id = input.value.trim().replace(/^#/, "");
  if (!id) return;
  input.value = "";
  location.hash = `#/jobs/${encodeURIComponent(id)}`;
});
window.addEventListener("hashchange", show);
show();
