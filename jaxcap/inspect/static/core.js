// jaxcap inspect, shared by every view: the run document, DOM building, number formatting, the image viewer
// (click an image to enlarge it) and an image's ground truth. Loaded first; vanilla JS, no network.
"use strict";
const DOC = JSON.parse(document.getElementById("run-data").textContent);
const LETTERS = "ABCDEFGHI";

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined && c !== false) node.append(c);
  return node;
}

const isNum = (v) => typeof v === "number" && Number.isFinite(v);
// A value as the page prints it: "—" when not measured, 3 decimals below 10, 1 above (report percentages).
const fmt = (v, d) => {
  if (!isNum(v)) return v === null || v === undefined ? "—" : String(v);
  if (d !== undefined) return v.toFixed(d);
  return Math.abs(v) >= 10 ? v.toFixed(1) : v.toFixed(3);
};
const signed = (v) => (isNum(v) ? (v > 0 ? "+" : "") + fmt(v) : "—");
// Decimals for values of this size: 1 for percentages and counts above 10, 3 for fractions.
const decimals = (values) => (Math.max(0, ...values.filter(isNum).map(Math.abs)) >= 10 ? 1 : 3);
// An estimate {mean, low, high} as "mean [low, high]" (the interval left out when the report has none), with `d`
// decimals (default: by the largest of the three). `sign`: "+" before positive values.
function fmtEstimate(e, sign, d) {
  if (!e || !isNum(e.mean)) return "—";
  d = d ?? decimals([e.mean, e.low, e.high]);
  const f = (v) => (sign && v > 0 ? "+" : "") + v.toFixed(d);
  return isNum(e.low) && isNum(e.high) ? `${f(e.mean)} [${f(e.low)}, ${f(e.high)}]` : f(e.mean);
}

function flags(list) {
  return el("div", { class: "flags" }, ...(list || []).map((f) => el("span", { class: `flag ${f.kind}`, title: f.match, text: f.kind })));
}

function badge(kind, text, title) {
  return el("span", { class: `badge ${kind}`, title, text });
}

// ---- the image viewer: one overlay, opened by a click on any image, closed by a click or Escape --------------
const viewer = el("div", { id: "viewer", hidden: "", onclick: () => closeViewer() });
document.body.append(viewer);
// The image as large as the window allows (a small synthetic image scaled up with its pixels kept sharp).
function fitImage(img) {
  const w = img.naturalWidth, h = img.naturalHeight;
  if (!w || !h) return;
  const scale = Math.min((0.9 * window.innerWidth) / w, (0.78 * window.innerHeight) / h);
  img.style.width = `${Math.round(w * scale)}px`;
  img.classList.toggle("pixelated", scale > 2);
}
function openViewer(src, title, text) {
  const img = el("img", { src, alt: title, onload: () => fitImage(img) });
  viewer.replaceChildren(el("figure", {}, img, el("figcaption", {},
    el("div", { class: "id", text: title }), text ? el("div", { class: "reference", text: `reference: ${text}` }) : null)));
  viewer.hidden = false;
  if (img.complete) fitImage(img);
}
function closeViewer() {
  viewer.hidden = true;
  viewer.replaceChildren();
}
document.addEventListener("keydown", (e) => e.key === "Escape" && closeViewer());

function thumb(src, title, reference) {
  if (!src) return el("div", { class: "empty noimage", text: title });
  const img = el("img", { class: "thumb", src, alt: title, title: "click to enlarge", loading: "lazy",
    onclick: () => openViewer(src, title, reference),
    onload: () => img.classList.toggle("pixelated", img.naturalWidth < 200) }); // small synthetic images stay sharp
  return img;
}

// An image's reference caption and curated questions with their answers (jaxcap.inspect.truth).
function truth(reference, questions) {
  const parts = [];
  if (reference) parts.push(el("div", { class: "reference" }, el("b", { text: "Reference: " }), reference));
  if (questions && questions.length) {
    parts.push(el("details", { class: "truth-questions" }, el("summary", { text: `Ground truth: ${questions.length} questions` }),
      el("table", { class: "ev" }, ...questions.map(([q, a]) => el("tr", {}, el("td", { text: q }), el("td", { class: "answer", text: a }))))));
  }
  return parts.length ? el("div", { class: "truth" }, ...parts) : null;
}
