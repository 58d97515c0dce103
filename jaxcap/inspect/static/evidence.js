// What the judge said about one caption (a rollout record's `evidence`, by reward family), as tables: CapRL's
// questions with each option's text, the gold and the answered option; RubiCap's criteria with weights and
// verdicts; BalCapRL's claims, reference units and language scores; the length mask's decision. A family this
// file does not know is shown as a key / value table.
"use strict";
const mark = (ok) => (ok === true ? el("span", { class: "ok", text: "✓" }) : ok === false ? el("span", { class: "bad", text: "✗" }) : el("span", { class: "na", text: "—" }));
const table = (cls, head, rows) => el("table", { class: `ev ${cls}` }, el("tr", {}, ...head.map((h) => el("th", { text: h }))), ...rows);

// CapRL: each question as asked (options in the order shown, with their letters), the gold and the answer.
function questionsTable(questions) {
  const rows = questions.filter((q) => q && typeof q === "object").map((q, k) => {
    const options = q.options || [];
    const labels = q.labels || LETTERS.slice(0, options.length).split(""); // records before labels were kept: A, B, ...
    const text = (letter) => (labels.indexOf(letter) >= 0 ? options[labels.indexOf(letter)] : null);
    const option = (letter, note) => (letter ? `${letter}. ${text(letter) ?? "(not an option)"}` : note);
    const answered = q.failed ? "judge failed (not scored)" : option(q.letter, "no option picked");
    const list = el("ol", { class: "options" }, ...options.map((o, i) => el("li", {
      class: [labels[i] === q.gold ? "gold" : "", labels[i] === q.letter ? "chosen" : ""].join(" ").trim() || null,
      text: `${labels[i]}. ${o}` })));
    return el("tr", { class: q.failed ? "failed" : q.correct ? "right" : "wrong" }, el("td", { text: String(k + 1) }),
      el("td", { class: "question", text: q.question }), el("td", {}, list),
      el("td", { class: "answered", text: answered }), el("td", { class: "gold", text: option(q.gold, "—") }),
      el("td", {}, mark(q.failed ? null : !!q.correct)));
  });
  return table("questions", ["#", "question", "options (as shown)", "answered", "gold", ""], rows);
}

function criteriaTable(criteria) {
  const judged = criteria.filter((c) => c.passed !== null && c.passed !== undefined);
  const total = judged.reduce((s, c) => s + (c.weight || 0), 0), passed = judged.reduce((s, c) => s + (c.passed ? c.weight || 0 : 0), 0);
  return el("div", {}, table("criteria", ["criterion", "weight", "verdict"], criteria.map((c) =>
    el("tr", {}, el("td", { text: c.criterion }), el("td", { class: "num", text: fmt(c.weight, 1) }),
      el("td", {}, mark(c.passed === null || c.passed === undefined ? null : c.passed), c.passed === null ? " not judged" : "")))),
    el("div", { class: "ev-total", text: `weighted pass rate ${passed}/${total} = ${total ? fmt(passed / total) : "—"}` }));
}

function balcaprl(what) {
  const parts = [];
  if (what.claims) {
    parts.push(el("h6", { text: "precision: the caption's claims" }), table("claims", ["claim", "correct", "pointable", "holds"],
      what.claims.filter((c) => c && typeof c === "object").map((c) => el("tr", {}, el("td", { text: c.claim }), el("td", {}, mark(c.correct)),
        el("td", {}, mark(c.pointable)), el("td", {}, mark(!!(c.correct && c.pointable)))))));
  }
  if (what.units) {
    parts.push(el("h6", { text: "recall: the reference's units" }), table("units", ["reference unit", "covered"],
      what.units.filter((u) => u && typeof u === "object").map((u) => el("tr", {}, el("td", { text: u.unit }), el("td", {}, mark(u.covered))))));
  }
  if (what.language) {
    const l = what.language;
    parts.push(el("h6", { text: "linguistic quality (1-10)" }), table("language", ["clarity", "fluency", "coherence"],
      [el("tr", {}, ...["clarity", "fluency", "coherence"].map((k) => el("td", { class: "num", text: fmt(l[k], 1) })))]));
  }
  return el("div", {}, ...parts);
}

function lengthMask(m) {
  const ratio = m.reference_words ? m.words / m.reference_words : null;
  return el("div", { class: m.in_band ? "ok" : "bad",
    text: `${m.words} words / ${m.reference_words} reference words = ${fmt(ratio, 2)}: ` +
      (m.in_band ? "in band, rewards kept" : `outside the band: ${(m.dims || []).join(", ")} set to 0`) });
}

function generic(what) {
  if (what === null || typeof what !== "object") return el("div", { text: String(what) });
  return table("generic", ["field", "value"], Object.entries(what).map(([k, v]) =>
    el("tr", {}, el("td", { text: k }), el("td", { class: "json", text: typeof v === "object" ? JSON.stringify(v) : String(v) }))));
}

// [summary line, body] of one family's evidence.
function describe(family, what) {
  if (what && Array.isArray(what.questions)) {
    const qs = what.questions.filter((q) => q && typeof q === "object"), scored = qs.filter((q) => !q.failed);
    return [`${family}: ${scored.filter((q) => q.correct).length}/${scored.length} questions answered right`, questionsTable(qs)];
  }
  if (what && Array.isArray(what.criteria)) {
    const cs = what.criteria.filter((c) => c && typeof c === "object");
    return [`${family}: ${cs.filter((c) => c.passed).length}/${cs.length} criteria passed`, criteriaTable(cs)];
  }
  if (what && (what.claims || what.units || what.language)) {
    const claims = (what.claims || []).filter((c) => c && typeof c === "object");
    const hold = claims.filter((c) => c.correct && c.pointable).length;
    return [`${family}: ${hold}/${claims.length} claims hold` + (what.units ? `, ${what.units.filter((u) => u.covered).length}/${what.units.length} reference units covered` : ""), balcaprl(what)];
  }
  if (what && "in_band" in what) return [`${family}: ${what.in_band ? "in band" : "outside the band (masked)"}`, lengthMask(what)];
  if (what && "score" in what) return [`${family}: score ${fmt(what.score, 1)}`, generic(what)];
  return [family, generic(what)];
}

function evidence(ev) {
  if (!ev || !Object.keys(ev).length) return null;
  return el("div", { class: "evidence-list" }, ...Object.entries(ev).map(([family, what]) => {
    const [summary, body] = describe(family, what);
    return el("details", { class: "evidence", "data-family": family }, el("summary", { text: summary }), body);
  }));
}
