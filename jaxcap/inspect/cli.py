"""python -m jaxcap.inspect <workdir> [--out DIR] [--eval_report report.json ...] [--serve [--port N]]

Writes <out>/index.html (default <workdir>/site) and the thumbnails it shows; open it from disk. Rerun to refresh a
run in progress. `--serve` then serves the site on 127.0.0.1 only (never another interface) until interrupted."""

from __future__ import annotations

import argparse
import functools
import http.server
import sys
from pathlib import Path

from jaxcap.inspect.data import load_run
from jaxcap.inspect.render import write_site


def build_site(workdir: str | Path, out: str | Path | None = None, eval_reports: list[str] = ()) -> Path:
  """Writes the site of `workdir` and returns its index.html."""
  workdir = Path(workdir)
  if not workdir.is_dir():
    raise FileNotFoundError(f"{workdir} is not a directory: give a run's workdir (--config.workdir of its launch)")
  site = Path(out) if out else workdir / "site"
  return write_site(load_run(workdir, site, [Path(p) for p in eval_reports]), site)


def serve(site: Path, port: int) -> None:
  handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
  with http.server.ThreadingHTTPServer(("127.0.0.1", port), handler) as server:
    print(f"serving {site} at http://127.0.0.1:{server.server_address[1]}/ (Ctrl-C stops)", flush=True)
    try:
      server.serve_forever()
    except KeyboardInterrupt:
      pass


def main(argv: list[str] | None = None) -> None:
  p = argparse.ArgumentParser(prog="python -m jaxcap.inspect", description=__doc__.split("\n\n")[1])
  p.add_argument("workdir", help="the run's workdir")
  p.add_argument("--out", default=None, help="where to write the site (default <workdir>/site)")
  p.add_argument("--eval_report", action="append", default=[], help="a jaxcap.eval report.json outside the workdir")
  p.add_argument("--serve", action="store_true", help="serve the site on 127.0.0.1 after writing it")
  p.add_argument("--port", type=int, default=8000, help="port for --serve (0 = any free one)")
  args = p.parse_args(argv)
  try:
    index = build_site(args.workdir, args.out, args.eval_report)
  except FileNotFoundError as e:
    print(f"error: {e}", file=sys.stderr)
    raise SystemExit(2) from None
  print(f"wrote {index}", flush=True)
  if args.serve:
    serve(index.parent, args.port)
