"""The page: static/app.css, the static/ scripts (SCRIPTS, in order) and the run's document (data.load_run) inlined
into one index.html, so the site opens from disk with no server and fetches nothing (no CDN, no fetch(): file://
pages may not)."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from jaxcap.train.logs.metrics import to_json

STATIC = Path(__file__).parent / "static"
# One file per concept, shared helpers first and the tabs (which render every view) last.
SCRIPTS = ("core.js", "diff.js", "charts.js", "evidence.js", "rollouts.js", "heldout.js", "evals.js", "app.js")

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{css}</style>
</head><body>
<header><h1>{title}</h1><span id="status"></span>
<nav id="tabs"><button data-view="curves">Curves</button><button data-view="rollouts">Rollouts</button>
<button data-view="heldout">Held-out: SFT vs RL</button><button data-view="evals">Eval reports</button></nav>
</header>
<main>
<section id="view-curves" class="view"></section>
<section id="view-rollouts" class="view"></section>
<section id="view-heldout" class="view"></section>
<section id="view-evals" class="view"></section>
</main>
<script type="application/json" id="run-data">{data}</script>
<script>{js}</script>
</body></html>
"""


def page(doc: dict[str, Any]) -> str:
  """index.html for `doc`: the JSON is escaped so no string in it can close its script element."""
  data = to_json(doc).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
  title = html.escape(f"jaxcap inspect: {doc['run']['name']}")
  css = (STATIC / "app.css").read_text()
  js = "\n".join((STATIC / name).read_text() for name in SCRIPTS)
  return PAGE.format(title=title, css=css, js=js, data=data)


def write_site(doc: dict[str, Any], out: Path) -> Path:
  out.mkdir(parents=True, exist_ok=True)
  path = out / "index.html"
  tmp = path.with_suffix(".html.tmp")
  tmp.write_text(page(doc))
  tmp.replace(path)
  return path
