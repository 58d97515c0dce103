"""`python -m jaxcap.eval --config=configs/eval.py [--captioner NAME=SPEC ...]` writes report.md/.json/plots.

Bad input (a missing manifest, captions file or checkpoint, an output folder that cannot be written, a config value
that cannot work) is one `error:` line and exit status 2.

Compare several captioners in one report, e.g. the SFT warm start and the RL student:
    python -m jaxcap.eval --config=configs/eval.py --config.manifest=data/val/manifest.jsonl \
        --captioner sft=jsonl:runs/sft/captions.jsonl --captioner rl=jsonl:runs/rl/captions.jsonl
"""

from absl import app, flags
from ml_collections import config_flags

from jaxcap.config.presets import preset_dir
from jaxcap.eval.cli import parse_captioner_flags, run

# the packaged preset by default, so the command runs from any directory (jaxcap.config.presets)
_CONFIG = config_flags.DEFINE_config_file(
  "config", str(preset_dir() / "eval.py"), "Evaluation config file (a path, or a preset's name: eval)."
)
_CAPTIONERS = flags.DEFINE_multi_string(
  "captioner",
  [],
  "NAME=SPEC (builtin:<name>, jsonl:<path>, callable:<module>:<fn>); repeatable. "
  "When given, replaces config.captioners.",
)


# bad input: a missing or unreadable manifest / captions file / checkpoint, an output folder that cannot be written,
# a config value or caption file that cannot be used (every such error names the thing and the fix)
BAD_INPUT = (OSError, ValueError)


def main(argv):
  from jaxcap.config.cli import fail, loaded

  if len(argv) > 1:
    fail(f"unexpected arguments {argv[1:]}; pass options as flags (--config.x=..., --captioner NAME=SPEC)")
  try:
    paths = run(loaded(_CONFIG.value), parse_captioner_flags(_CAPTIONERS.value))
  except BAD_INPUT as e:  # one line, exit 2, no traceback
    what = f"cannot use {e.filename}: {e.strerror}" if isinstance(e, OSError) and e.filename else str(e)
    fail(" ".join(line.strip() for line in what.splitlines() if line.strip()))
  for kind, path in paths.items():
    print(f"{kind}: {path}")


if __name__ == "__main__":
  from jaxcap.host_memory import retain_on_cpu

  retain_on_cpu()
  from jaxcap.config.cli import parse_flags

  app.run(main, flags_parser=parse_flags)  # a bad --config.x value: exit 2
