"""Reproducible installs (issue 57): constraints.txt, what CI installs (PIP_CONSTRAINT in .ci/run), pins every package
setup.cfg asks for at a version inside setup.cfg's own range, and setup.cfg's ranges stay open except below the
release lines known to break jaxcap."""

import configparser
import pathlib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = pathlib.Path(__file__).resolve().parents[1]
# the extras CI installs with the constraints (.ci/run); llama-cpp-python is built from source there, unpinned
PINNED_EXTRAS = ("test", "tracking", "data", "llm-judge")
UNPINNED = {"llama-cpp-python"}
# the only upper bounds: the next release line breaks jaxcap (setup.cfg says why)
UPPER_BOUNDS = {"jax": "0.12", "transformers": "6", "numpy": "3"}


def _requirements(section: str, key: str) -> list[Requirement]:
  cfg = configparser.ConfigParser()
  cfg.read(ROOT / "setup.cfg")
  lines = [line.strip() for line in cfg[section][key].splitlines()]
  return [Requirement(line) for line in lines if line and not line.startswith("#")]


def _pins() -> dict[str, Version]:
  pins = {}
  for line in (ROOT / "constraints.txt").read_text().splitlines():
    line = line.split("#", 1)[0].strip()
    if line:
      name, _, version = line.partition("==")
      assert version, f"constraints.txt: {line!r} is not a pin (name==version)"
      pins[canonicalize_name(name)] = Version(version)
  return pins


def _ranges() -> list[Requirement]:
  reqs = _requirements("options", "install_requires")
  for extra in PINNED_EXTRAS:
    reqs += _requirements("options.extras_require", extra)
  return reqs


def test_constraints_pin_every_required_package_inside_its_range():
  pins = _pins()
  for req in _ranges():
    name = canonicalize_name(req.name)
    if name in UNPINNED:
      continue
    assert name in pins, f"constraints.txt pins no {req.name} (setup.cfg: {req})"
    assert req.specifier.contains(pins[name], prereleases=True), (
      f"constraints.txt pins {req.name}=={pins[name]}, outside setup.cfg's {req}"
    )


def test_upper_bounds_only_below_the_release_lines_known_to_break():
  bounded = {}
  for req in _requirements("options", "install_requires"):
    below = [s.version for s in req.specifier if s.operator == "<"]
    if below:
      bounded[canonicalize_name(req.name)] = below[0]
    assert all(s.operator in (">=", "<", "==") for s in req.specifier), req
  assert bounded == UPPER_BOUNDS


def test_the_ranges_are_parsed_as_pip_reads_them():
  """A range that would exclude the tested pin fails the first test; this one keeps the parser honest on a known
  line and a local version (torch's `+cpu` wheel)."""
  (jax,) = [r for r in _requirements("options", "install_requires") if r.name == "jax"]
  assert jax.specifier.contains("0.10.2") and jax.specifier.contains("0.11.2") and not jax.specifier.contains("0.12.0")
  (torch,) = [r for r in _requirements("options.extras_require", "test") if r.name == "torch"]
  assert torch.specifier.contains(Version("2.13.0+cpu"))
