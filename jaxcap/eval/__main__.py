"""`python -m jaxcap.eval --config=configs/eval.py [--captioner NAME=SPEC ...]` writes report.md/.json/plots.

Compare several captioners in one report, e.g. the SFT warm start and the RL student:
    python -m jaxcap.eval --config=configs/eval.py --config.manifest=data/val/manifest.jsonl \
        --captioner sft=jsonl:runs/sft/captions.jsonl --captioner rl=jsonl:runs/rl/captions.jsonl
"""

from absl import app, flags
from ml_collections import config_flags

from jaxcap.eval.cli import parse_captioner_flags, run

_CONFIG = config_flags.DEFINE_config_file("config", "configs/eval.py", "Evaluation config file.")
_CAPTIONERS = flags.DEFINE_multi_string(
  "captioner",
  [],
  "NAME=SPEC (builtin:<name>, jsonl:<path>, callable:<module>:<fn>); repeatable. "
  "When given, replaces config.captioners.",
)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments {argv[1:]}; pass options as flags.")
  paths = run(_CONFIG.value, parse_captioner_flags(_CAPTIONERS.value))
  for kind, path in paths.items():
    print(f"{kind}: {path}")


if __name__ == "__main__":
  from jaxcap.host_memory import retain_on_cpu

  retain_on_cpu()
  from jaxcap.config.cli import parse_flags

  app.run(main, flags_parser=parse_flags)  # a bad --config.x value: exit 2
