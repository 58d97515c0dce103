"""`python -m jaxcap.experiments --suite papers [--only NAME[,NAME]] [--smoke]`: the papers' ablations on the
embedded world, from one cached warm-up + SFT start; writes <workdir>/<suite>/report.md, report.json and PNGs."""

from __future__ import annotations

import sys
from pathlib import Path

from absl import app, flags

_SUITE = flags.DEFINE_string("suite", "papers", "the suite to run (jaxcap.experiments.spec.SUITES)")
_ONLY = flags.DEFINE_list("only", [], "run only these experiments of the suite (configs/experiments/<name>.py)")
_SMOKE = flags.DEFINE_bool("smoke", False, "few steps on a tiny world, the first two arms of each experiment, 2 seeds")
_WORKDIR = flags.DEFINE_string("workdir", "experiments", "report under <workdir>/<suite>, cache under <workdir>/cache")
_STEPS = flags.DEFINE_integer("rl_steps", 100, "RL steps per arm (SFT arms: as many sequences)")
_SEEDS = flags.DEFINE_integer("seeds", 2, "seeds per arm (each its own RL run from the shared start)")
_IMAGES = flags.DEFINE_integer("eval_images", 256, "held-out images every arm is measured on")


def main(argv):
  del argv
  from absl import logging as absl_logging

  absl_logging.set_verbosity(absl_logging.WARNING)
  from jaxcap.experiments.report import write_report
  from jaxcap.experiments.runs import Settings
  from jaxcap.experiments.spec import SUITES
  from jaxcap.experiments.suite import SuiteRunner

  if _SUITE.value not in SUITES:
    print(f"error: --suite={_SUITE.value}: known suites are {', '.join(SUITES)}", file=sys.stderr)
    sys.exit(2)
  unknown = [n for n in _ONLY.value if n not in SUITES[_SUITE.value]]
  if unknown:
    print(f"error: --only {unknown}: the suite's experiments are {', '.join(SUITES[_SUITE.value])}", file=sys.stderr)
    sys.exit(2)
  if _SEEDS.value < 1 or _STEPS.value < 1:
    print("error: --seeds and --rl_steps must be >= 1", file=sys.stderr)
    sys.exit(2)
  workdir = Path(_WORKDIR.value).resolve()
  settings = Settings(
    workdir=workdir,
    rl_steps=_STEPS.value,
    seeds=tuple(range(_SEEDS.value)),
    smoke=_SMOKE.value,
    eval_images=_IMAGES.value,
  )
  runner = SuiteRunner(_SUITE.value, settings, only=_ONLY.value, log=lambda m: print(m, flush=True))
  out = runner.run()
  name = _SUITE.value + ("_smoke" if settings.smoke else "") + ("_" + "_".join(_ONLY.value) if _ONLY.value else "")
  paths = write_report(out, workdir / name)
  print(f"report: {paths['markdown']} ({out['wall_s'] / 60:.1f} min)", flush=True)


if __name__ == "__main__":
  from jaxcap.host_memory import retain_on_cpu

  retain_on_cpu()
  from jaxcap.config.cli import parse_flags

  app.run(main, flags_parser=parse_flags)  # --help: exit 0
