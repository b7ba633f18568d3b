// Small DOM and formatting helpers shared by the pages. Text always goes in
// as text nodes (never innerHTML), so nothing a job carries can become markup.
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
}

export function svg(tag, attrs, ...children) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  append(el, children);
  return el;
}

export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
}

// Icons and words for every state, so none depends on colour alone.
const STATES = {
  queued: "○", running: "▶", waiting: "◔", succeeded: "✓", failed: "✕", cancelled: "⊘",
  pending: "·", paused: "‖", active: "▶",
};
export const JOB_STATES = ["queued", "running", "waiting", "succeeded", "failed", "cancelled"];

export function badge(state, label) {
  return h("span", { class: `state ${state}`, "data-state": state },
    h("span", { class: "icon", "aria-hidden": "true" }, STATES[state] || "•"), label || state);
}

export function fmtTime(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  return d.toLocaleString(undefined, { year: "numeric", month: "short", day: "numeric",
    hour: "2-digit", minute: "2-digit", second: "2-digit" });
}

export function fmtDuration(ms) {
  if (ms === null || ms === undefined || !isFinite(ms)) return "—";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const s = ms / 1000;
  if (s < 60) return `${s.toFixed(s < 10 ? 2 : 1)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${Math.round(s % 60)} s`;
  const hr = Math.floor(m / 60);
  if (hr < 48) return `${hr} h ${m % 60} min`;
  return `${Math.floor(hr / 24)} d ${hr % 24} h`;
}

export function ago(iso) {
  if (!iso) return "—";
  const ms = Date.now() - new Date(iso).getTime();
  if (ms < 0) return `in ${fmtDuration(-ms)}`;
  return `${fmtDuration(ms)} ago`;
}

export function timeEl(iso, relative) {
  if (!iso) return h("span", { class: "muted" }, "—");
  return h("time", { datetime: iso, title: iso }, relative ? ago(iso) : fmtTime(iso));
}

// Pretty JSON, folded behind a summary when long.
export function jsonBlock(value, title, foldOver = 12) {
  const text = JSON.stringify(value, null, 2) ?? "null";
  const lines = text.split("\n").length;
  const pre = h("pre", { class: "json", tabindex: "0" }, text);
  if (lines <= foldOver) return h("div", { class: "json-wrap" }, title ? h("h3", {}, title) : null, pre);
  return h("details", { class: "json-fold" },
    h("summary", {}, title || "JSON", " ", h("span", { class: "muted" }, `(${lines} lines)`)), pre);
}

export function toast(text, bad) {
  const box = document.getElementById("toast");
  const el = h("div", { class: bad ? "bad" : "" }, text);
  box.append(el);
  setTimeout(() => el.remove(), bad ? 6000 : 3000);
}

// Run fn, showing its error (and returning null) instead of throwing.
export async function attempt(fn, what) {
  try {
    return await fn();
  } catch (e) {
    toast(`${what}: ${e.message}`, true);
    return null;
  }
}
