// The eval reports view: each jaxcap.eval report.json found, its captioners' headline estimates as
// "mean [low, high]" (the bootstrap interval) with the paired difference to the report's `compared_to`, then per
// image each captioner's caption (marked where it differs from the compared-to one) and values.
"use strict";
function renderEvals(root) {
  if (!DOC.evals.length) return root.append(el("p", { class: "empty", text: "No jaxcap.eval report.json under this workdir." }));
  for (const rep of DOC.evals) {
    const base = rep.compared_to && rep.models.includes(rep.compared_to) ? rep.compared_to : null;
    root.append(el("h3", { class: "id", text: rep.name }), rep.judge ? el("p", { class: "hint", text: `judge: ${rep.judge}` }) : null);
    const breakable = (k) => k.replace(/\//g, "/\u200b"); // a long metric name breaks after its slashes
    const head = el("tr", {}, el("th", { text: "captioner" }), ...rep.headline.map((k) => el("th", { text: breakable(k) })));
    // one number of decimals per metric, by the size of its captioners' estimates (percentages or fractions)
    const digits = Object.fromEntries(rep.headline.map((k) => [k, decimals(rep.models.flatMap((m) => {
      const e = rep.estimates[m][k];
      return e ? [e.mean, e.low, e.high] : [];
    }))]));
    const rows = rep.models.map((m) => el("tr", {}, el("th", { text: m }), ...rep.headline.map((k) => {
      const d = rep.differences && rep.differences[m] && rep.differences[m][k];
      return el("td", { class: "estimate", "data-model": m, "data-metric": k }, el("div", { text: fmtEstimate(rep.estimates[m][k], false, digits[k]) }),
        d && isNum(d.mean) ? el("div", { class: "diff", text: `vs ${base || rep.compared_to}: ${fmtEstimate(d, true, digits[k])}` }) : null);
    })));
    root.append(el("table", { class: "evals estimates" }, head, ...rows),
      el("p", { class: "hint", text: "mean [low, high]: the estimate over the report's images and its bootstrap interval" }));
    const imageHead = el("tr", {}, el("th", { text: "image" }), ...rep.models.map((m) => el("th", { text: m })));
    const images = rep.images.map((img) => el("tr", { class: "eval-image", "data-id": img.id },
      el("td", { class: "image" }, thumb(img.thumb, img.id, img.reference), el("div", { class: "id", text: img.id }), truth(img.reference, null)),
      ...rep.models.map((m) => el("td", {},
        img.captions[m] ? diffCaption(img.captions[m], base && m !== base ? img.captions[base] : null) : null,
        ...rep.headline.map((k) => el("div", { class: "nums", text: `${k}: ${fmt(img.values[m][k], digits[k])}` }))))));
    root.append(el("table", { class: "evals per-image" }, imageHead, ...images));
  }
}
