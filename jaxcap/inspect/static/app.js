// jaxcap inspect: the tabs. Each view renders once at load; the URL's hash names the view shown (#curves,
// #rollouts, #heldout, #evals), so a view can be linked to and the browser's back / forward move between views.
"use strict";
const VIEWS = { curves: renderCurves, rollouts: renderRollouts, heldout: renderHeldout, evals: renderEvals };
const DEFAULT_VIEW = DOC.steps.length ? "rollouts" : "curves";

function show(view) {
  for (const b of document.querySelectorAll("#tabs button")) b.classList.toggle("active", b.dataset.view === view);
  for (const s of document.querySelectorAll(".view")) s.classList.toggle("active", s.id === `view-${view}`);
}
const route = () => show(VIEWS[location.hash.slice(1)] ? location.hash.slice(1) : DEFAULT_VIEW);

for (const [name, render] of Object.entries(VIEWS)) render(document.getElementById(`view-${name}`));
for (const b of document.querySelectorAll("#tabs button")) {
  b.addEventListener("click", () => {
    location.hash = b.dataset.view; // a history entry: back returns here (hashchange routes it too, later)
    route();
  });
}
window.addEventListener("hashchange", route);
document.getElementById("status").textContent =
  `${DOC.run.workdir} · ${DOC.run.finished ? "finished" : "in progress (rebuild to refresh)"} · ${DOC.steps.length} rollout steps`;
if (!VIEWS[location.hash.slice(1)]) history.replaceState(null, "", `#${DEFAULT_VIEW}`);
route();
