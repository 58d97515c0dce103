"""What an experiment is: named arms (configs that differ from one method config by a few fields), the metrics the
report shows, and the paper's claims as (metric, arm, arm, direction) to be checked, never tuned.

Experiment files live in `configs/experiments/<name>.py`; each `get_config()` returns `experiment(...)`.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Mapping, Sequence

import ml_collections

# The papers' ablations, in report order (configs/experiments/<name>.py).
SUITES: dict[str, tuple[str, ...]] = {
  "papers": (
    "cgdpo_vs_grpo",
    "length_mask",
    "caprl_questions",
    "kl_and_presets",
    "rubicap_vs_likert",
    "knowledge_retention",
    "losses",
    "filter_groups",
    "off_policy",
  ),
}
DIRECTIONS = ("+", "=", "none")  # arm a above arm b; no difference; no published figure
PHASES = ("rl", "sft")


def arm(
  method: str = "caprl",
  overrides: Mapping[str, Any] | None = None,
  *,
  phase: str = "rl",
  start: str = "caption",
  curated: bool = True,
) -> dict:
  """One arm: `configs/<method>.py` from the shared start, with `overrides` (nested, merged into the method's
  config; a `reward` block replaces the method's). phase 'rl' runs RL; 'sft' continues SFT on the start's caption
  targets for the same number of sequences RL would update (rl.steps x rl.batch_size x rl.num_samples).
  `start`: 'caption' (warm-up + caption SFT) or 'caption_vqa' (the SFT mix also teaches VQA). `curated=False`
  trains on the world's uncurated questions (held-out questions are always curated)."""
  if phase not in PHASES:
    raise ValueError(f"arm phase {phase!r}: use one of {PHASES}")
  return dict(method=method, overrides=dict(overrides or {}), phase=phase, start=start, curated=curated)


def claim(metric: str, a: str, b: str, direction: str, paper: str) -> dict:
  """The paper says `metric` of arm `a` is above ('+') / equal to ('=') that of arm `b`, or states nothing
  ('none': the row reports the measured direction only); `paper` quotes its figures."""
  if direction not in DIRECTIONS:
    raise ValueError(f"claim direction {direction!r}: use one of {DIRECTIONS}")
  return dict(metric=metric, a=a, b=b, direction=direction, paper=paper)


def experiment(
  *,
  title: str,
  question: str,
  arms: Mapping[str, dict],
  metrics: Sequence[str],
  claims: Sequence[dict],
  smoke_arms: Sequence[str] = (),
  step_metrics: Sequence[str] = (),
) -> ml_collections.ConfigDict:
  """An experiment config; `smoke_arms` (default: the first two) run in smoke mode. `step_metrics`: keys of the
  arms' metrics.jsonl reported as their mean (and largest |value|) over the RL steps, e.g. rollout_corr/kl_k1."""
  names = list(arms)
  for c in claims:
    for side in ("a", "b"):
      if c[side] not in names and c[side] != "start":
        raise ValueError(f"claim on {c['metric']!r} names arm {c[side]!r}; arms are {names} (and 'start')")
  smoke = list(smoke_arms) or names[:2]
  return ml_collections.ConfigDict(
    dict(
      title=title,
      question=question,
      arms={k: dict(v) for k, v in arms.items()},
      order=names,  # ConfigDict sorts its keys; the report keeps the file's order
      metrics=list(metrics),
      claims=list(claims),
      smoke_arms=smoke,
      step_metrics=list(step_metrics),
    )
  )


def configs_dir() -> Path:
  """The run-config presets' folder (`jaxcap.config.presets`: the checkout's configs/, or an install's copy)."""
  from jaxcap.config.presets import preset_dir

  return preset_dir()


def load_module(path: Path):
  spec = importlib.util.spec_from_file_location(f"jaxcap_config_{path.stem}", path)
  if spec is None or not path.exists():
    raise FileNotFoundError(f"{path} does not exist")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def load_experiment(name: str, root: Path | None = None) -> ml_collections.ConfigDict:
  path = (root or configs_dir()) / "experiments" / f"{name}.py"
  if not path.exists():
    known = sorted(p.stem for p in path.parent.glob("*.py") if not p.stem.startswith("_"))
    raise ValueError(f"experiment {name!r}: no {path}; known experiments: {', '.join(known)}")
  return load_module(path).get_config()


def method_config(method: str, root: Path | None = None) -> ml_collections.ConfigDict:
  """configs/<method>.py's default config."""
  path = (root or configs_dir()) / f"{method}.py"
  if not path.exists():
    raise ValueError(f"arm method {method!r}: no {path}")
  return load_module(path).get_config()


def merge(config: ml_collections.ConfigDict, overrides: Mapping[str, Any], replace=("reward",)) -> None:
  """Nested `overrides` into `config` in place; keys in `replace` (and leaves) are set whole. An unknown key is
  an error naming it, as the launcher's overrides are."""
  for key, value in overrides.items():
    if key not in config:
      raise ValueError(f"arm override {key!r}: the config has no such field (fields: {', '.join(sorted(config))})")
    if isinstance(value, Mapping) and key not in replace and isinstance(config[key], ml_collections.ConfigDict):
      merge(config[key], value, replace=())
    else:
      with config.unlocked():
        config[key] = ml_collections.ConfigDict(dict(value)) if isinstance(value, Mapping) else value
