// jaxcap inspect: renders the run document (script#run-data, jaxcap.inspect.data) into four views. Vanilla JS,
// no network: everything the page needs is in this file, the document and media/ thumbnails.
"use strict";
const DOC = JSON.parse(document.getElementById("run-data").textContent);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}
const fmt = (v, d = 3) => (v === null || v === undefined ? "—" : typeof v === "number" ? v.toFixed(d) : String(v));
const thumb = (src, alt) => (src ? el("img", { src, alt, loading: "lazy" }) : el("div", { class: "empty", text: alt }));

function flags(list) {
  return el("div", { class: "flags" }, ...(list || []).map((f) => el("span", { class: `flag ${f.kind}`, title: f.match, text: f.kind })));
}

// ---- curves -------------------------------------------------------------------------------------------------
function chart(key, points) {
  const w = 300, h = 120, pad = 4;
  const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
  const [x0, x1] = [Math.min(...xs), Math.max(...xs)], [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  const sx = (x) => pad + ((x - x0) / (x1 - x0 || 1)) * (w - 2 * pad);
  const sy = (y) => h - pad - ((y - y0) / (y1 - y0 || 1)) * (h - 2 * pad);
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  svg.setAttribute("preserveAspectRatio", "none");
  const line = document.createElementNS(svg.namespaceURI, points.length > 1 ? "polyline" : "circle");
  if (points.length > 1) {
    line.setAttribute("points", points.map((p) => `${sx(p[0])},${sy(p[1])}`).join(" "));
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", "#4f8cc9");
    line.setAttribute("stroke-width", "1.5");
    line.setAttribute("vector-effect", "non-scaling-stroke");
  } else {
    line.setAttribute("cx", sx(xs[0]));
    line.setAttribute("cy", h / 2);
    line.setAttribute("r", 3);
    line.setAttribute("fill", "#4f8cc9");
  }
  svg.append(line);
  const last = points[points.length - 1];
  return el("div", { class: "chart", "data-key": key },
    el("h4", { text: key }), svg,
    el("div", { class: "last", text: `step ${last[0]}: ${fmt(last[1], 4)}  (range ${fmt(y0, 4)} .. ${fmt(y1, 4)})` }));
}

function renderCurves(root) {
  const phases = Object.keys(DOC.curves);
  if (!phases.length) return root.append(el("p", { class: "empty", text: "metrics.jsonl has no records yet." }));
  const phase = el("select", { id: "curve-phase" }, ...phases.map((p) => el("option", { value: p, text: p })));
  phase.value = phases.includes("rl") ? "rl" : phases[phases.length - 1];
  const filter = el("input", { id: "curve-filter", placeholder: "filter metrics (e.g. reward, eval/)" });
  const grid = el("div", { class: "charts" });
  const draw = () => {
    grid.replaceChildren();
    const series = DOC.curves[phase.value] || {};
    for (const key of Object.keys(series).sort()) {
      if (filter.value && !key.includes(filter.value)) continue;
      grid.append(chart(key, series[key]));
    }
  };
  phase.addEventListener("change", draw);
  filter.addEventListener("input", draw);
  root.append(el("div", { class: "toolbar" }, el("label", { text: "phase " }, phase), filter), grid);
  draw();
}

// ---- rollouts -----------------------------------------------------------------------------------------------
function bars(names, sample) {
  const rows = [];
  for (const n of names) {
    const v = sample.rewards[n], valid = sample.valid[n];
    const width = v === null ? 0 : Math.max(0, Math.min(1, v)) * 100;
    rows.push(el("span", { text: n }),
      el("div", { class: valid ? "bar" : "bar invalid", "data-dim": n, "data-value": v === null ? "" : String(v) },
        el("span", { style: `width:${width}%` })),
      el("span", { text: valid ? fmt(v) : "masked" }));
  }
  return el("div", { class: "bars" }, ...rows);
}

function evidence(ev) {
  if (!ev || !Object.keys(ev).length) return null;
  const blocks = [];
  for (const [family, what] of Object.entries(ev)) {
    let summary = family;
    if (what && what.questions) {
      const right = what.questions.filter((q) => q.correct).length;
      summary += `: ${right}/${what.questions.length} questions answered right`;
    } else if (what && what.criteria) {
      summary += `: ${what.criteria.filter((c) => c.passed).length}/${what.criteria.length} criteria passed`;
    } else if (what && what.claims) {
      summary += `: ${what.claims.filter((c) => c.correct && c.pointable).length}/${what.claims.length} claims hold`;
    } else if (what && "in_band" in what) {
      summary += what.in_band ? ": in band" : ": outside the band (masked)";
    }
    blocks.push(el("details", { class: "evidence" }, el("summary", { text: summary }),
      el("pre", { text: JSON.stringify(what, null, 1) })));
  }
  return el("div", {}, ...blocks);
}

function group(g) {
  const samples = [...g.samples].sort((a, b) => (b.reward ?? -Infinity) - (a.reward ?? -Infinity));
  const meta = el("div", { class: "meta" }, thumb(g.thumb, g.media),
    el("div", { text: g.record_id }), el("div", { text: `${g.rank} group, mean reward ${fmt(g.group_reward)}` }),
    el("div", { class: "empty", text: g.prompt }));
  const rows = samples.map((s) => el("div", { class: "sample" },
    flags(s.flags),
    el("div", { class: "caption", text: s.caption }),
    el("div", { class: "nums" },
      el("span", { text: `reward ${fmt(s.reward)}` }), el("span", { class: "advantage", text: `advantage ${fmt(s.advantage)}` }),
      el("span", { text: `${s.tokens} tokens, ${s.words} words` }),
      el("span", { class: s.stop === "stop" ? "ok" : "bad", text: s.stop === "stop" ? "stopped" : "cut at max length" })),
    bars(g.reward_names, s), evidence(s.evidence)));
  return el("div", { class: `group ${g.rank}`, "data-record": g.record_id }, meta, el("div", { class: "samples" }, ...rows));
}

function renderRollouts(root) {
  if (!DOC.steps.length) {
    return root.append(el("p", { class: "empty", text: "No rollout records yet (logging.rollouts_every RL steps)." }));
  }
  const select = el("select", { id: "step-select" }, ...DOC.steps.map((s, i) => el("option", { value: i, text: `step ${s.step}` })));
  select.value = DOC.steps.length - 1;
  const onlyFlagged = el("input", { type: "checkbox", id: "only-flagged" });
  const list = el("div", { id: "groups" });
  const draw = () => {
    const step = DOC.steps[Number(select.value)];
    const groups = [...step.groups].sort((a, b) => (b.group_reward ?? -Infinity) - (a.group_reward ?? -Infinity));
    list.replaceChildren(...groups.filter((g) => !onlyFlagged.checked || g.samples.some((s) => s.flags.length)).map(group));
  };
  select.addEventListener("change", draw);
  onlyFlagged.addEventListener("change", draw);
  root.append(el("div", { class: "toolbar" }, el("label", { text: "RL " }, select),
    el("label", {}, onlyFlagged, " only groups with flagged captions")), list);
  draw();
}

// ---- held-out: SFT end vs RL end ------------------------------------------------------------------------------
function side(title, s) {
  if (!s) return el("div", { class: "side" }, el("h5", { text: title }), el("div", { class: "empty", text: "not written yet" }));
  return el("div", { class: "side" }, el("h5", { text: title }), flags(s.flags),
    el("div", { class: "caption", text: s.caption }),
    el("div", { class: "nums" }, el("span", { text: `QA accuracy ${fmt(s.qa_accuracy)}` }),
      el("span", { text: `reward ${fmt(s.reward)}` }), el("span", { text: `${fmt(s.words, 0)} words` })));
}

function renderHeldout(root) {
  const h = DOC.heldout;
  if (!h.rows.length) return root.append(el("p", { class: "empty", text: "No held-out captions yet (written at each phase's end)." }));
  const mean = (k, side) => {
    const v = h.rows.map((r) => r[side] && r[side][k]).filter((x) => typeof x === "number");
    return v.length ? v.reduce((a, b) => a + b, 0) / v.length : null;
  };
  root.append(el("p", { id: "heldout-summary",
    text: `${h.rows.length} images: ${h.left || "—"} vs ${h.right || "(RL end not written yet)"}; mean QA accuracy ` +
      `${fmt(mean("qa_accuracy", "left"))} -> ${fmt(mean("qa_accuracy", "right"))}` }));
  for (const r of h.rows) {
    root.append(el("div", { class: "pair", "data-id": r.id }, el("div", {}, thumb(r.thumb, r.id), el("div", { text: r.id })),
      el("div", { class: "left" }, side(h.left || "before", r.left)), el("div", { class: "right" }, side(h.right || "RL end", r.right))));
  }
}

// ---- jaxcap.eval reports --------------------------------------------------------------------------------------
function renderEvals(root) {
  if (!DOC.evals.length) return root.append(el("p", { class: "empty", text: "No jaxcap.eval report.json under this workdir." }));
  for (const rep of DOC.evals) {
    root.append(el("h3", { text: rep.name }));
    const head = el("tr", {}, el("th", { text: "image" }), ...rep.models.map((m) => el("th", { text: m })));
    const est = el("tr", {}, el("td", { text: "estimate" }), ...rep.models.map((m) => el("td", {},
      ...rep.headline.map((k) => el("div", { text: `${k}: ${fmt(rep.estimates[m][k] && rep.estimates[m][k].value)}` })))));
    const rows = rep.images.map((img) => el("tr", { class: "eval-image" }, el("td", {}, thumb(img.thumb, img.id), el("div", { text: img.id })),
      ...rep.models.map((m) => el("td", {}, img.captions[m] ? el("div", { class: "caption", text: img.captions[m] }) : null,
        ...rep.headline.map((k) => el("div", { class: "nums", text: `${k}: ${fmt(img.values[m][k])}` }))))));
    root.append(el("table", { class: "evals" }, head, est, ...rows));
  }
}

// ---- tabs -----------------------------------------------------------------------------------------------------
const VIEWS = { curves: renderCurves, rollouts: renderRollouts, heldout: renderHeldout, evals: renderEvals };
function show(view) {
  for (const b of document.querySelectorAll("#tabs button")) b.classList.toggle("active", b.dataset.view === view);
  for (const s of document.querySelectorAll(".view")) s.classList.toggle("active", s.id === `view-${view}`);
  if (location.hash !== `#${view}`) history.replaceState(null, "", `#${view}`);
}
for (const [name, render] of Object.entries(VIEWS)) render(document.getElementById(`view-${name}`));
for (const b of document.querySelectorAll("#tabs button")) b.addEventListener("click", () => show(b.dataset.view));
document.getElementById("status").textContent =
  `${DOC.run.workdir} · ${DOC.run.finished ? "finished" : "in progress (rebuild to refresh)"} · ${DOC.steps.length} rollout steps`;
show(VIEWS[location.hash.slice(1)] ? location.hash.slice(1) : "rollouts");
