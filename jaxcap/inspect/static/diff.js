// Word-level differences between two captions: the longest common subsequence of their words (case and
// punctuation ignored). `diffCaption(text, base)` is an element whose textContent is exactly `text`: its words
// that `base` lacks are <mark class="add">, and the words of `base` it lacks are empty <span class="del"> whose
// CSS ::before shows them struck out (so selecting or reading the caption gives the caption, nothing else).
"use strict";
const MAX_DIFF_CELLS = 4e6; // longer pairs (thousands of words each) are shown without a diff

function wordTokens(text) {
  return (text.match(/\S+\s*/g) || []).map((t) => ({ text: t, key: t.trim().toLowerCase().replace(/[^\p{L}\p{N}]+/gu, "") }));
}

// [{op: "same" | "add" | "del", text}] turning `base` into `text`, or null when the pair is too long to compare.
function diffWords(base, text) {
  const a = wordTokens(base), b = wordTokens(text);
  const n = a.length, m = b.length;
  if ((n + 1) * (m + 1) > MAX_DIFF_CELLS) return null;
  const L = new Int32Array((n + 1) * (m + 1)); // L[i][j]: LCS length of a[i:] and b[j:]
  for (let i = n - 1; i >= 0; i--) {
    for (let j = m - 1; j >= 0; j--) {
      L[i * (m + 1) + j] = a[i].key === b[j].key ? L[(i + 1) * (m + 1) + j + 1] + 1
        : Math.max(L[(i + 1) * (m + 1) + j], L[i * (m + 1) + j + 1]);
    }
  }
  const ops = [];
  let i = 0, j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && a[i].key === b[j].key) { ops.push({ op: "same", text: b[j].text }); i++; j++; }
    else if (j < m && (i === n || L[i * (m + 1) + j + 1] >= L[(i + 1) * (m + 1) + j])) { ops.push({ op: "add", text: b[j].text }); j++; }
    else { ops.push({ op: "del", text: a[i].text }); i++; }
  }
  return ops;
}

function diffCaption(text, base, cls = "caption") {
  const node = el("div", { class: cls });
  const ops = base === null || base === undefined || base === text ? null : diffWords(base, text);
  if (!ops) {
    node.textContent = text;
    return node;
  }
  node.append(text.match(/^\s*/)[0]);
  let added = 0, dropped = 0;
  for (const o of ops) {
    if (o.op === "same") node.append(o.text);
    else if (o.op === "add") {
      const word = o.text.trimEnd();
      node.append(el("mark", { class: "add", text: word }), o.text.slice(word.length));
      added++;
    } else {
      node.append(el("span", { class: "del", "data-text": o.text.trim() }));
      dropped++;
    }
  }
  node.dataset.added = added;
  node.dataset.dropped = dropped;
  return node;
}
