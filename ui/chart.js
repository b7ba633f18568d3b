// A stacked bar chart of jobs ended per interval (succeeded, failed,
// cancelled) as inline SVG. Failed bars are hatched so they differ from
// succeeded ones without colour too.
import { h, svg } from "./dom.js";

// Sum a per-second series into bars of `step` seconds (newest last).
export function bucket(series, step) {
  const out = [];
  const n = series.length;
  for (let end = n; end > 0; end -= step) {
    let s = 0;
    for (let i = Math.max(0, end - step); i < end; i++) s += series[i];
    out.unshift(s);
  }
  return out;
}

export function barChart(q, step, seconds) {
  const ok = bucket(q?.succeeded || [], step), bad = bucket(q?.failed || [], step),
    cx = bucket(q?.cancelled || [], step);
  const n = Math.max(ok.length, 1);
  const W = 600, H = 110, top = 4, bottom = 1, left = 0;
  const max = Math.max(1, ...ok.map((v, i) => v + (bad[i] || 0) + (cx[i] || 0)));
  const bw = (W - left) / n;
  const scale = (H - top - bottom) / max;
  const total = ok.reduce((a, b) => a + b, 0), fails = bad.reduce((a, b) => a + b, 0),
    cancels = cx.reduce((a, b) => a + b, 0);
  const label = `Jobs ended per ${step} s over the last ${Math.round(seconds / 60)} minutes: ` +
    `${total} succeeded, ${fails} failed, ${cancels} cancelled; peak ${max} per bar.`;
  const el = svg("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none",
    role: "img", "aria-label": label });
  el.append(svg("defs", {}, svg("pattern", { id: "hatch", width: "4", height: "4", patternUnits: "userSpaceOnUse",
    patternTransform: "rotate(45)" }, svg("rect", { width: "2", height: "4", fill: "rgba(255,255,255,0.45)" }))));
  el.append(svg("line", { class: "axis", x1: 0, x2: W, y1: H - bottom, y2: H - bottom }));
  for (let i = 0; i < n; i++) {
    let y = H - bottom;
    const x = left + i * bw + 1, w = Math.max(1, bw - 2);
    for (const [v, cls] of [[ok[i] || 0, "ok"], [bad[i] || 0, "bad"], [cx[i] || 0, "cx"]]) {
      if (!v) continue;
      const hgt = Math.max(1.5, v * scale);
      y -= hgt;
      el.append(svg("rect", { class: cls, x, y, width: w, height: hgt }, svg("title", {}, `${v} ${cls === "ok" ? "succeeded" : cls === "bad" ? "failed" : "cancelled"}`)));
      if (cls === "bad") el.append(svg("rect", { x, y, width: w, height: hgt, fill: "url(#hatch)" }));
    }
  }
  return h("figure", { class: "chart-box" }, el,
    h("figcaption", { class: "axis-labels", "aria-hidden": "true" },
      h("span", {}, `−${Math.round(seconds / 60)} min`), h("span", {}, `peak ${max} per ${step} s`), h("span", {}, "now")));
}
