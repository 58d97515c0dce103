"""Where the run-config presets are, and what a `--config=` value names.

The presets' source is `configs/` at the top of the repository (`configs/<name>.py`, `configs/experiments/`). A
checkout or an editable install reads them there; a wheel installs the same files as `jaxcap/config_presets/`
(setup.py maps that package to `configs/`). So `--config=caprl`, `--config=caprl.py:paper` and
`--config=configs/caprl.py` work from any directory: a path that exists is taken as it is, anything else is looked
up among the presets.
"""

from __future__ import annotations

import difflib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]  # jaxcap/


def preset_dir() -> Path:
  """The presets' folder: a wheel's `jaxcap/config_presets`, else the checkout's `configs/`."""
  installed = PACKAGE / "config_presets"
  return installed if installed.is_dir() else PACKAGE.parent / "configs"


def preset_names() -> list[str]:
  """The run-config presets (`caprl`, `rubicap`, ...), sorted."""
  return sorted(p.stem for p in preset_dir().glob("*.py") if not p.stem.startswith("_"))


def resolve(spec: str, flag: str = "--config") -> str:
  """The config file `spec` ('<path or name>[:variant]') names: the path itself when it exists, else the preset of
  that name (`caprl`, `caprl.py`, `configs/caprl.py`, `configs/experiments/losses.py`), with its variant. Raises
  FileNotFoundError (one line: the presets and the closest name) when it is neither."""
  path, sep, variant = spec.partition(":")
  if Path(path).expanduser().is_file():
    return spec
  relative = Path(path if path.endswith(".py") else f"{path}.py")
  parts = relative.parts[1:] if relative.parts[:1] == ("configs",) else relative.parts
  found = preset_dir().joinpath(*parts) if parts and not relative.is_absolute() else None
  if found is not None and found.is_file():
    return str(found) + sep + variant
  names = preset_names()
  near = difflib.get_close_matches(Path(path).stem, names, n=1)
  hint = f" (did you mean {near[0]}?)" if near else ""
  raise FileNotFoundError(
    f"{flag}={spec}: no such config file{hint}; give the path of one, or a preset: {', '.join(names)} "
    f"(e.g. {flag}=caprl or {flag}=caprl:paper)"
  )
