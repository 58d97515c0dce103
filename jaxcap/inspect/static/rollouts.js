// The rollouts view: one RL step's recorded groups (jaxcap.train.logs.rollout_records), each with its image
// (click to enlarge), reference caption and ground truth, and its G captions side by side, each marked where it
// differs from the group's best caption (or the reference), with its rewards and the judge's evidence.
"use strict";
const GROUP_FILTERS = {
  all: ["all groups", () => true],
  flagged: ["groups with flagged captions", (g) => g.samples.some((s) => s.flags.length)],
  nosignal: ["no signal (zero reward spread)", (g) => g.no_signal],
  signal: ["groups with signal", (g) => !g.no_signal],
};

function bars(names, sample) {
  const rows = [];
  for (const n of names) {
    const v = sample.rewards[n], valid = sample.valid[n];
    const width = v === null ? 0 : Math.max(0, Math.min(1, v)) * 100;
    rows.push(el("span", { class: "dim", text: n }),
      el("div", { class: valid ? "bar" : "bar invalid", "data-dim": n, "data-value": v === null ? "" : String(v) },
        el("span", { style: `width:${width}%` })),
      el("span", { text: valid ? fmt(v) : "masked" }));
  }
  return el("div", { class: "bars" }, ...rows);
}

// One caption: #k in the group's reward order, `sameAs` the first caption with the same text (or -1).
function sampleCard(s, base, isBase, k, sameAs) {
  return el("div", { class: "sample", "data-reward": String(s.reward) },
    el("div", { class: "nums" }, el("span", { class: "rank", text: `#${k + 1}` }),
      el("b", { text: `reward ${fmt(s.reward)}` }), el("span", { class: "advantage", text: `advantage ${signed(s.advantage)}` }),
      el("span", { text: `${s.tokens} tokens, ${s.words} words` }),
      el("span", { class: s.stop === "stop" ? "ok" : "bad", text: s.stop === "stop" ? "stopped" : "cut at max length" }),
      isBase ? badge("base", "diff base") : null, sameAs >= 0 ? badge("same", `same text as #${sameAs + 1}`) : null),
    flags(s.flags), diffCaption(s.caption, isBase ? null : base), bars(s.names, s), evidence(s.evidence));
}

function group(g, diffBase) {
  const samples = [...g.samples].sort((a, b) => (b.reward ?? -Infinity) - (a.reward ?? -Infinity));
  for (const s of samples) s.names = g.reward_names;
  const base = diffBase === "best" ? samples[0] && samples[0].caption : diffBase === "reference" ? g.reference || null : null;
  const own = Object.entries(g.own_questions || {});
  const badges = [
    badge(g.rank, g.rank === "sample" ? "sampled" : `${g.rank} group`),
    g.no_signal ? badge("nosignal", "no signal", "every caption of the group got the same reward: all advantages are 0, so the group does not move the policy") : null,
    own.length ? badge("ownq", "own questions", "each caption was judged on its own sample of the image's questions") : null,
  ];
  const head = el("div", { class: "group-head" }, thumb(g.thumb, g.record_id, g.reference),
    el("div", { class: "info" }, el("div", { class: "id", text: g.record_id }), el("div", { class: "badges" }, ...badges),
      el("div", { class: "nums" }, el("span", { text: `mean reward ${fmt(g.group_reward)}` }),
        el("span", { text: `spread ${fmt(g.spread)}` }), el("span", { text: `G = ${g.samples.length}` })),
      el("div", { class: "prompt", text: `prompt: ${g.prompt}` }), truth(g.reference, g.truth),
      own.length ? el("p", { class: "note" }, ...own.map(([family, n]) =>
        `${family}: each caption was judged on its own sample of ${n} questions (drawn per caption, options shuffled), ` +
        "so the captions' rewards are not on the same questions. ")) : null));
  return el("div", { class: `group ${g.rank}${g.no_signal ? " nosignal" : ""}`, "data-record": g.record_id }, head,
    el("div", { class: "samples" }, ...samples.map((s, k) => sampleCard(s, base, diffBase === "best" && k === 0, k,
      samples.findIndex((t, j) => j < k && t.caption === s.caption)))));
}

function renderRollouts(root) {
  if (!DOC.steps.length) {
    return root.append(el("p", { class: "empty", text: "No rollout records yet (logging.rollouts_every RL steps)." }));
  }
  const select = el("select", { id: "step-select" }, ...DOC.steps.map((s, i) => el("option", { value: i, text: `step ${s.step}` })));
  select.value = DOC.steps.length - 1;
  const filter = el("select", { id: "group-filter" }, ...Object.entries(GROUP_FILTERS).map(([k, [t]]) => el("option", { value: k, text: t })));
  const diffBase = el("select", { id: "diff-base" }, el("option", { value: "best", text: "the group's best caption" }),
    el("option", { value: "reference", text: "the reference caption" }), el("option", { value: "none", text: "nothing (no marks)" }));
  const count = el("span", { class: "count" });
  const list = el("div", { id: "groups" });
  const draw = () => {
    const step = DOC.steps[Number(select.value)];
    const groups = [...step.groups].sort((a, b) => (b.group_reward ?? -Infinity) - (a.group_reward ?? -Infinity));
    const shown = groups.filter(GROUP_FILTERS[filter.value][1]);
    const silent = groups.filter((g) => g.no_signal).length;
    count.textContent = `${shown.length} of ${groups.length} groups shown; ${silent} with no signal`;
    list.replaceChildren(...shown.map((g) => group(g, diffBase.value)));
  };
  const move = (d) => () => { select.value = Math.min(DOC.steps.length - 1, Math.max(0, Number(select.value) + d)); draw(); };
  for (const c of [select, filter, diffBase]) c.addEventListener("change", draw);
  root.append(el("div", { class: "toolbar" },
    el("label", { text: "RL " }, el("button", { class: "small", onclick: move(-1), text: "◀" }), select, el("button", { class: "small", onclick: move(1), text: "▶" })),
    el("label", { text: "show " }, filter), el("label", { text: "mark differences from " }, diffBase), count,
    el("span", { class: "legend-diff" }, el("mark", { class: "add", text: "added" }), " ", el("span", { class: "del", "data-text": "missing" }))), list);
  draw();
}
