"""The page: static/app.css, static/app.js and the run's document (data.load_run) inlined into one index.html, so
the site opens from disk with no server and fetches nothing (no CDN, no fetch(): file:// pages may not)."""

from __future__ import annotations

import html
from jaxcap.train.logs.metrics import to_json
from pathlib import Path
from typing import Any

STATIC = Path(__file__).parent / "static"

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
  css, js = (STATIC / "app.css").read_text(), (STATIC / "app.js").read_text()
  return PAGE.format(title=title, css=css, js=js, data=data)


def write_site(doc: dict[str, Any], out: Path) -> Path:
  out.mkdir(parents=True, exist_ok=True)
  path = out / "index.html"
  tmp = path.with_suffix(".html.tmp")
  tmp.write_text(page(doc))
  tmp.replace(path)
  return path
