// The curves view: metrics.jsonl per phase, against the phase's own step (from 1, as metrics.jsonl counts it).
// Key metrics first, then the rest grouped by prefix; SVG charts with axes and ticks, an EMA smoothing control,
// and a minimum y span so a flat series (float noise around a value) is drawn flat, not stretched to full height.
"use strict";
const KEY_METRICS = ["reward/mean", "eval/qa_accuracy", "kl", "length/mean", "loss"];
const TIME_SPLIT = ["time/rollout_s", "time/judge_wait_s", "time/logprobs_s", "time/update_s"]; // one chart when the run logs them
const GROUP_ORDER = ["eval", "reward", "length", "adv", "update", "judge", "time", "rollout_corr"];
const STEP_LABEL = { rl: "RL step", sft: "SFT step", vision: "vision warm-up step" };
const COLOURS = ["#2f6fb0", "#e8590c", "#2f9e44", "#9c36b5", "#c92a2a"];
// A series whose values vary by less than MIN_SPAN_REL of their size (or MIN_SPAN_ABS) is drawn flat.
const MIN_SPAN_REL = 0.01, MIN_SPAN_ABS = 1e-6;
const SVGNS = "http://www.w3.org/2000/svg";

function svgEl(tag, attrs, ...children) {
  const node = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const c of children) node.append(c);
  return node;
}

// About `count` round tick values covering [lo, hi].
function ticks(lo, hi, count) {
  const raw = (hi - lo) / Math.max(1, count), mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 2.5, 5, 10].map((f) => f * mag).find((s) => s >= raw) || raw;
  const out = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push(Math.abs(t) < step * 1e-9 ? 0 : t);
  return out;
}
const tickText = (v) => (v === 0 ? "0" : Math.abs(v) >= 1e5 || Math.abs(v) < 1e-3 ? v.toExponential(1) : String(+v.toPrecision(4)));

// The y range drawn: the data's, widened to the minimum span around its middle, plus 5% either side.
function yRange(values) {
  let lo = Math.min(...values), hi = Math.max(...values);
  const minSpan = Math.max(MIN_SPAN_REL * Math.max(Math.abs(lo), Math.abs(hi)), MIN_SPAN_ABS);
  const flat = hi - lo < minSpan;
  if (flat) [lo, hi] = [(lo + hi) / 2 - minSpan / 2, (lo + hi) / 2 + minSpan / 2];
  const pad = (hi - lo) * 0.05;
  return { lo: lo - pad, hi: hi + pad, flat };
}

// Debiased exponential moving average (TensorBoard's smoothing): weight `a` on the past.
function ema(points, a) {
  if (!a) return points;
  let s = 0, w = 0;
  return points.map(([x, y]) => {
    s = a * s + (1 - a) * y;
    w = a * w + (1 - a);
    return [x, s / w];
  });
}

// One chart: `series` [{name, points: [[step, value]]}] on shared axes; smoothed with `a` unless `raw`.
function chart(title, series, xLabel, a, raw) {
  const W = 340, H = 190, L = 50, R = 10, T = 8, B = 34;
  const all = series.flatMap((s) => s.points);
  const xs = all.map((p) => p[0]);
  let [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  if (x0 === x1) [x0, x1] = [x0 - 1, x1 + 1];
  const yr = yRange(all.map((p) => p[1]));
  const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const sy = (y) => T + (1 - (y - yr.lo) / (yr.hi - yr.lo)) * (H - T - B);
  const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, class: "plot" });
  const axes = svgEl("g", { class: "axes" });
  for (const t of ticks(yr.lo, yr.hi, 4)) {
    axes.append(svgEl("line", { x1: L, x2: W - R, y1: sy(t), y2: sy(t), class: "grid" }),
      svgEl("text", { x: L - 4, y: sy(t) + 3, "text-anchor": "end", class: "tick y" }, tickText(t)));
  }
  for (const t of ticks(x0, x1, 5).filter((t) => Number.isInteger(t) || x1 - x0 < 5)) {
    axes.append(svgEl("line", { x1: sx(t), x2: sx(t), y1: H - B, y2: H - B + 4, class: "tickmark" }),
      svgEl("text", { x: sx(t), y: H - B + 14, "text-anchor": "middle", class: "tick x" }, tickText(t)));
  }
  axes.append(svgEl("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis" }),
    svgEl("line", { x1: L, x2: L, y1: T, y2: H - B, class: "axis" }),
    svgEl("text", { x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle", class: "label" }, xLabel));
  svg.append(axes);
  series.forEach((s, k) => {
    const colour = COLOURS[k % COLOURS.length], pts = s.points;
    const smooth = (s.smooth = raw || pts.length < 10 ? pts : ema(pts, a));
    const path = (p) => p.map(([x, y]) => `${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join(" ");
    if (smooth !== pts) svg.append(svgEl("polyline", { points: path(pts), class: "raw", stroke: colour }));
    if (pts.length > 1) svg.append(svgEl("polyline", { points: path(smooth), class: "line", stroke: colour }));
    if (pts.length <= 30) for (const [x, y] of pts) svg.append(svgEl("circle", { cx: sx(x), cy: sy(y), r: 2.5, fill: colour }));
  });
  const cursor = svgEl("line", { y1: T, y2: H - B, class: "cursor", visibility: "hidden" });
  svg.append(cursor);
  const lastOf = (s) => s.points[s.points.length - 1];
  const summary = () => series.map((s) => `${series.length > 1 ? s.name + " " : ""}step ${lastOf(s)[0]}: ${fmt(lastOf(s)[1], 4)}` +
    (s.smooth !== s.points ? ` (smoothed ${fmt(s.smooth[s.smooth.length - 1][1], 4)})` : "")).join(" · ");
  const foot = el("div", { class: "last", text: summary() });
  svg.addEventListener("mousemove", (e) => {
    const r = svg.getBoundingClientRect(), x = x0 + ((((e.clientX - r.left) / r.width) * W - L) / (W - L - R)) * (x1 - x0);
    const near = (pts) => pts.reduce((b, p) => (Math.abs(p[0] - x) < Math.abs(b[0] - x) ? p : b), pts[0]);
    const at = near(series[0].points)[0];
    cursor.setAttribute("x1", sx(at)); cursor.setAttribute("x2", sx(at)); cursor.setAttribute("visibility", "visible");
    foot.textContent = `step ${at}: ` + series.map((s) => {
      const p = s.points.find((q) => q[0] === at);
      return `${series.length > 1 ? s.name + " " : ""}${p ? fmt(p[1], 4) : "—"}`;
    }).join(" · ");
  });
  svg.addEventListener("mouseleave", () => { cursor.setAttribute("visibility", "hidden"); foot.textContent = summary(); });
  const legend = series.length > 1 ? el("div", { class: "legend" }, ...series.map((s, k) =>
    el("span", { style: `color:${COLOURS[k % COLOURS.length]}`, text: `■ ${s.name}` }))) : null;
  return el("div", { class: "chart", "data-key": title, "data-flat": String(yr.flat) },
    el("h4", { text: title }), legend, svg, foot, yr.flat ? el("div", { class: "flat", text: "flat: varies by less than 1% of its size" }) : null);
}

// The charts of one phase, in sections: [title, [[chart title, series]]].
function sections(series, filter) {
  const keys = Object.keys(series).filter((k) => !filter || k.includes(filter));
  const used = new Set();
  const key = [];
  for (const k of KEY_METRICS) if (keys.includes(k)) { key.push([k, [{ name: k, points: series[k] }]]); used.add(k); }
  const split = TIME_SPLIT.filter((k) => keys.includes(k));
  if (split.length) key.push(["time split (s per step)", split.map((k) => ({ name: k.slice(5, -2), points: series[k] }))]);
  for (const k of split) used.add(k);
  const groups = {};
  for (const k of keys.filter((k) => !used.has(k)).sort()) {
    const g = k.includes("/") ? k.split("/")[0] : "update";
    (groups[g] = groups[g] || []).push([k, [{ name: k, points: series[k] }]]);
  }
  const rank = (g) => (GROUP_ORDER.includes(g) ? GROUP_ORDER.indexOf(g) : GROUP_ORDER.length);
  const rest = Object.keys(groups).sort((a, b) => rank(a) - rank(b) || a.localeCompare(b)).map((g) => [g, groups[g]]);
  return [...(key.length ? [["key metrics", key]] : []), ...rest];
}

function renderCurves(root) {
  const phases = Object.keys(DOC.curves);
  if (!phases.length) return root.append(el("p", { class: "empty", text: "metrics.jsonl has no records yet." }));
  const phase = el("select", { id: "curve-phase" }, ...phases.map((p) => el("option", { value: p, text: p })));
  phase.value = phases.includes("rl") ? "rl" : phases[phases.length - 1];
  const filter = el("input", { id: "curve-filter", placeholder: "filter metrics (e.g. reward, eval/)" });
  const smoothing = el("input", { id: "curve-smoothing", type: "range", min: "0", max: "0.99", step: "0.01", value: "0.6" });
  const shown = el("span", { class: "smoothing-value" });
  const grid = el("div", { id: "curve-grid" });
  const draw = () => {
    const a = Number(smoothing.value);
    shown.textContent = a ? a.toFixed(2) : "off";
    const xLabel = STEP_LABEL[phase.value] || `${phase.value} step`;
    grid.replaceChildren(...sections(DOC.curves[phase.value] || {}, filter.value).map(([title, charts]) =>
      el("section", { class: "chart-group", "data-group": title }, el("h3", { text: title }),
        el("div", { class: "charts" }, ...charts.map(([t, s]) => chart(t, s, xLabel, a, t.startsWith("eval/")))))));
  };
  for (const c of [phase, filter, smoothing]) c.addEventListener("input", draw);
  root.append(el("div", { class: "toolbar" }, el("label", { text: "phase " }, phase), filter,
    el("label", { title: "exponential moving average of each logged-every-step series; the raw values stay faint" },
      "smoothing ", smoothing, shown),
    el("span", { class: "hint", text: "x: the phase's own step, from 1, as metrics.jsonl counts it (evaluations before the first update at 0); eval/ series are not smoothed" })), grid);
  draw();
}
