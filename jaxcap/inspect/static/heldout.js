// The held-out view: per image, the SFT-end and RL-end greedy captions side by side (the RL caption marked where
// it differs from the SFT one), each one's QA accuracy and reward, the change, and the image's ground truth.
"use strict";
const HELDOUT_FILTERS = {
  all: ["all images", () => true],
  regressed: ["regressed (QA accuracy fell)", (r) => isNum(r.delta) && r.delta < 0],
  improved: ["improved", (r) => isNum(r.delta) && r.delta > 0],
  unchanged: ["unchanged", (r) => isNum(r.delta) && r.delta === 0],
};

function side(title, s, base) {
  if (!s) return el("div", { class: "side" }, el("h5", { text: title }), el("div", { class: "empty", text: "not written yet" }));
  return el("div", { class: "side" }, el("h5", { text: title }), flags(s.flags), diffCaption(s.caption, base),
    el("div", { class: "nums" }, el("span", { text: `QA accuracy ${fmt(s.qa_accuracy)}` }),
      el("span", { text: `reward ${fmt(s.reward)}` }), el("span", { text: `${fmt(s.words, 0)} words` })));
}

function renderHeldout(root) {
  const h = DOC.heldout;
  if (!h.rows.length) return root.append(el("p", { class: "empty", text: "No held-out captions yet (written at each phase's end)." }));
  const mean = (k, at) => {
    const v = h.rows.map((r) => r[at] && r[at][k]).filter(isNum);
    return v.length ? v.reduce((a, b) => a + b, 0) / v.length : null;
  };
  const filter = el("select", { id: "heldout-filter" }, ...Object.entries(HELDOUT_FILTERS).map(([k, [t]]) =>
    el("option", { value: k, text: `${t} (${h.rows.filter(HELDOUT_FILTERS[k][1]).length})` })));
  const order = el("select", { id: "heldout-order" }, el("option", { value: "id", text: "image id" }),
    el("option", { value: "delta", text: "change in QA accuracy, worst first" }));
  const list = el("div", { id: "pairs" });
  const draw = () => {
    let rows = h.rows.filter(HELDOUT_FILTERS[filter.value][1]);
    if (order.value === "delta") rows = [...rows].sort((a, b) => (a.delta ?? Infinity) - (b.delta ?? Infinity));
    list.replaceChildren(...rows.map((r) => el("div", { class: `pair${isNum(r.delta) && r.delta < 0 ? " regressed" : ""}`, "data-id": r.id },
      el("div", { class: "image" }, thumb(r.thumb, r.id, r.reference), el("div", { class: "id", text: r.id }),
        isNum(r.delta) ? badge(r.delta < 0 ? "worse" : r.delta > 0 ? "better" : "same", `QA ${signed(r.delta)}`) : null,
        truth(r.reference, r.truth)),
      el("div", { class: "left" }, side(h.left || "before", r.left, null)),
      el("div", { class: "right" }, side(h.right || "RL end", r.right, r.left ? r.left.caption : null)))));
  };
  filter.addEventListener("change", draw);
  order.addEventListener("change", draw);
  root.append(el("p", { id: "heldout-summary",
    text: `${h.rows.length} images: ${h.left || "—"} vs ${h.right || "(RL end not written yet)"}; mean QA accuracy ` +
      `${fmt(mean("qa_accuracy", "left"))} -> ${fmt(mean("qa_accuracy", "right"))}` }),
  el("div", { class: "toolbar" }, el("label", { text: "show " }, filter), el("label", { text: "order by " }, order),
    el("span", { class: "hint", text: "the RL caption's words the SFT caption lacks are marked, the ones it dropped struck out" })), list);
  draw();
}
