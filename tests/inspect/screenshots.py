"""The inspector's documentation screenshots (docs/inspector/*.png), one per view, taken in headless Chromium from
a run's files:

    python tests/inspect/screenshots.py runs/caprl docs/inspector

Builds the run's site, opens each view at its URL (#rollouts, #curves, #heldout, #evals), shows what the docs
describe (a caption's evidence table open; held-out images ordered worst change first) and saves the window as a
256-colour PNG (small enough to commit). Needs selenium and the system's Chromium (tests/inspect/browser.py)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from browser import chrome  # noqa: E402

from jaxcap.inspect.cli import build_site  # noqa: E402

# view -> JS run once the view is shown, before the screenshot
SETUP = {
  "rollouts": "document.querySelector('#groups .sample details.evidence').open = true;",
  "curves": "",
  "heldout": "const o = document.getElementById('heldout-order'); o.value = 'delta'; o.dispatchEvent(new Event('change'));",
  "evals": "",
}


def shoot(workdir: Path, out: Path, site: Path | None = None) -> list[Path]:
  """One PNG per view of `workdir`'s site under `out`; returns their paths."""
  index = build_site(workdir, site or workdir / "site")
  out.mkdir(parents=True, exist_ok=True)
  driver, paths = chrome(), []
  try:
    driver.set_window_size(1400, 1000)
    for view, script in SETUP.items():
      driver.get("about:blank")  # a fresh load: a hash change alone keeps the previous scroll position
      driver.get(f"{index.as_uri()}#{view}")
      if script:
        driver.execute_script(script)
      time.sleep(0.3)
      path = out / f"{view}.png"
      driver.save_screenshot(str(path))
      Image.open(path).convert("RGB").quantize(256).save(path, optimize=True)
      paths.append(path)
  finally:
    driver.quit()
  return paths


if __name__ == "__main__":
  for p in shoot(Path(sys.argv[1]), Path(sys.argv[2])):
    print(f"wrote {p} ({p.stat().st_size // 1024} KiB)")
