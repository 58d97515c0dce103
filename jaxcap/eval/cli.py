"""What `python -m jaxcap.eval` does, as functions: config -> judge, records, captioners -> report files.

Config keys (see configs/eval.py): manifest (empty: generate a synthetic world under out_dir), media_root and
allow_outside_paths (the folder its media must lie in, `jaxcap.data.media_root`), num_images (0:
every manifest image, N: the first N, as a training run's held-out captions with eval.num_images = N), synthetic,
judge, captioners ("NAME=SPEC", ...), baselines {name: spec}, honest (spec or ""), empty_captions and
duplicate_captions (policies, default "error"), suites, per-suite options, bootstrap, vqa_probe (checkpoints
answering the questions with the image, `jaxcap.eval.vqa_probe`), out_dir. Captioner specs are described in
`jaxcap.eval.captioners`.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Mapping, Sequence

import jaxcap.world  # noqa: F401  (registers judge.kind='rule_based')
from jaxcap.eval.captionqa import CaptionQAConfig
from jaxcap.eval.caparena import CapArenaConfig
from jaxcap.eval.captioners import DUPLICATE_POLICIES, CaptionSet, load_captioner
from jaxcap.eval.dcscore import DCScoreConfig
from jaxcap.eval.evaluate import SUITES, EvalConfig, evaluate
from jaxcap.eval.prism import PrismConfig
from jaxcap.eval.redteam import RedTeamConfig
from jaxcap.eval.render import write_report
from jaxcap.eval.vqa_probe import probe_options, run_probe
from jaxcap.config import schema
from jaxcap.data.media_root import Flags
from jaxcap.judges.factory import build_judge, judge_name
from jaxcap.judges.preflight import preflight_judge
from jaxcap.judges.settings import JudgeConfig


def _plain(value: Any) -> Any:
  """ConfigDict / FrozenConfigDict -> plain dicts and lists, recursively."""
  if hasattr(value, "to_dict"):
    value = value.to_dict()
  if isinstance(value, Mapping):
    return {k: _plain(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_plain(v) for v in value]
  return value


EVAL_FLAGS = Flags("--config.media_root=DIR", "--config.allow_outside_paths=true")  # what the refusal names


def parse_captioner_flags(pairs: Sequence[str]) -> dict[str, str]:
  """["sft=runs/sft.jsonl", "rl=runs/rl.jsonl"] -> {"sft": ..., "rl": ...}."""
  out = {}
  for pair in pairs:
    name, sep, spec = pair.partition("=")
    if not sep or not name or not spec:
      raise ValueError(f"Captioner {pair!r}: write NAME=SPEC, e.g. rl=jsonl:runs/rl/captions.jsonl.")
    out[name] = spec
  return out


EMPTY_POLICIES = ("error", "score")


def check_captions(
  sources: Sequence[tuple[CaptionSet, str]], records: Sequence, manifest_size: int, empty: str = "error"
) -> dict[str, int]:
  """Fails, naming the captioner, its spec and the images, when a captioner of `sources` ((captions, spec)
  pairs) misses images of `records` or (with `empty="error"`) has an empty caption for one; returns the number
  of empty captions per captioner."""
  empties = {}
  for c, spec in sources:
    where = f"Captioner {c.name!r} ({spec})"
    missing = [i for i, r in enumerate(records) if not c.captions.get(r.id)]
    if missing:
      covered = len(records) - len(missing)
      prefix = missing[0] == covered  # it captioned exactly the first `covered` images
      if prefix and covered:
        fix = (
          f"it covers the first {covered} of the {manifest_size} manifest images (a training run's held-out "
          f"captions cover the first eval.num_images): pass --config.num_images={covered} to evaluate those, or "
          "caption the rest."
        )
      else:
        fix = "caption them, or evaluate a manifest of the captioned images only."
      ids = ", ".join(repr(records[i].id) for i in missing[:5]) + (", ..." if len(missing) > 5 else "")
      raise ValueError(f"{where} has no caption for {len(missing)} of {len(records)} images ({ids}); {fix}")
    if spec.startswith("builtin:"):
      continue  # built-ins are what they say (builtin:empty is empty on purpose)
    blank = [r.id for r in records if any(not t.strip() for t in c.samples(r.id))]
    if blank and empty == "error":
      ids = ", ".join(map(repr, blank[:5])) + (", ..." if len(blank) > 5 else "")
      raise ValueError(
        f"{where} has an empty caption for {len(blank)} of {len(records)} images ({ids}); re-caption them, or "
        "set --config.empty_captions=score to score empty captions as written."
      )
    empties[c.name] = len(blank)
  return empties


def writable_dir(path: pathlib.Path) -> pathlib.Path:
  """`path`, if it can be created and written (nothing is created here); OSError naming the first folder on its
  way that is a file, or that this user cannot write."""
  import errno
  import os

  existing = path
  while not existing.exists() and existing != existing.parent:
    existing = existing.parent
  if not existing.is_dir():
    raise NotADirectoryError(errno.ENOTDIR, "it is a file, not a folder", str(existing))
  if not os.access(existing, os.W_OK | os.X_OK):
    raise PermissionError(errno.EACCES, "this user cannot write there", str(existing))
  return path


def eval_config(config: Mapping[str, Any]) -> EvalConfig:
  suites = [s.strip() for s in config["suites"].split(",") if s.strip()]
  unknown = set(suites) - set(SUITES) - {"redteam"}
  if unknown:
    raise ValueError(f"config.suites has unknown suites {sorted(unknown)}; use any of {SUITES + ('redteam',)}.")
  rt = config.get("redteam", {})
  masked = tuple(rt.get("length_masked_rewards", ("balcaprl/linguistic",)))
  redteam = RedTeamConfig(**(rt | {"length_masked_rewards": masked})) if "redteam" in suites else None
  qa = config.get("captionqa", {})
  return EvalConfig(
    suites=tuple(s for s in suites if s != "redteam"),
    prism=PrismConfig(**config.get("prism", {})),
    captionqa=CaptionQAConfig(**(qa | {"word_limits": tuple(qa.get("word_limits", (50, 100, 200)))})),
    dcscore=DCScoreConfig(**config.get("dcscore", {})),
    caparena=CapArenaConfig(**config.get("caparena", {})),
    bcapscore_captionqa_metric=config.get("bcapscore_captionqa_metric", "captionqa/full"),
    redteam=redteam,
    compare_to=str(config.get("compare_to", "")),
    bootstrap_resamples=int(config["bootstrap"]["resamples"]),
    confidence=float(config["bootstrap"]["confidence"]),
    seed=int(config["bootstrap"]["seed"]),
  )


def run(config: Any, captioner_overrides: Mapping[str, str] | None = None) -> dict[str, pathlib.Path]:
  """Evaluates the configured captioners and writes the report; returns the written files by kind."""
  from jaxcap.data.manifest import read_manifest
  from jaxcap.world.dataset import generate_dataset

  config = _plain(config)
  settings = eval_config(config)  # validate before any work
  out_dir = writable_dir(pathlib.Path(config["out_dir"]))  # before any work: the report must be writable
  manifest = config.get("manifest") or ""
  if manifest and "://" not in str(manifest) and not pathlib.Path(manifest).exists():
    raise FileNotFoundError(
      f"--config.manifest={manifest}: no such file or folder; give a manifest (JSONL / Parquet, a folder of images, "
      "a saved dataset), e.g. a run's <workdir>/world/heldout/manifest.jsonl, or leave it empty for a synthetic world"
    )
  if not manifest:
    syn = config.get("synthetic", {})
    manifest = generate_dataset(
      out_dir / "synthetic_world",
      int(syn.get("num_scenes", 24)),
      seed=int(syn.get("seed", 0)),
      questions_per_scene=int(syn.get("questions_per_scene", 5)),
    )
  empty, duplicates = config.get("empty_captions", "error"), config.get("duplicate_captions", "error")
  if empty not in EMPTY_POLICIES:
    raise ValueError(f"config.empty_captions={empty!r}: use one of {EMPTY_POLICIES}.")
  if duplicates not in DUPLICATE_POLICIES:
    raise ValueError(f"config.duplicate_captions={duplicates!r}: use one of {DUPLICATE_POLICIES}.")
  num_images = int(config.get("num_images", 0))
  if num_images < 0:
    raise ValueError(f"config.num_images={num_images}: use 0 (every manifest image) or N > 0 (the first N).")
  probe = probe_options(config.get("vqa_probe"))  # checkpoint paths checked before any work
  # the user's manifest: its media confined to media_root (else its folder) unless allowed; a generated world's:
  # to its own folder
  confine = dict(
    media_root=config.get("media_root") or None, allow_outside_paths=bool(config.get("allow_outside_paths"))
  )
  confine = confine if config.get("manifest") else {}
  records, scenes = read_manifest(manifest, require_media=False, flags=EVAL_FLAGS, **confine)
  manifest_size = len(records)
  records = records[:num_images] if num_images else records
  judge_cfg = schema.block(JudgeConfig, config.get("judge", {}), "judge.")
  judge = preflight_judge(build_judge(judge_cfg, scenes=scenes, records=records), judge_cfg, records=records)
  specs = dict(captioner_overrides) if captioner_overrides else parse_captioner_flags(config["captioners"])
  if not specs:
    raise ValueError("No captioners to evaluate; set config.captioners or pass --captioner NAME=SPEC.")
  samples = int(config.get("samples_per_image", 1))
  load = lambda name, spec, **kw: load_captioner(name, spec, records, duplicates=duplicates, **kw)
  captioners = [load(name, spec, num_samples=samples) for name, spec in specs.items()]
  baseline_specs = config.get("baselines", {})
  baselines = {name: load(name, spec) for name, spec in baseline_specs.items()}
  honest = load("honest", config["honest"]) if config.get("honest") else None
  sources = [*zip(captioners, specs.values()), *((baselines[n], s) for n, s in baseline_specs.items())]
  sources += [(honest, config["honest"])] if honest else []
  empties = check_captions(sources, records, manifest_size, empty)  # before any judge call
  if any(empties.values()):
    print(f"scoring empty captions as written: {empties}", flush=True)
  boot = config["bootstrap"]
  vqa = run_probe(
    probe, records, num_resamples=int(boot["resamples"]), confidence=float(boot["confidence"]), seed=int(boot["seed"])
  )
  report = evaluate(
    judge,
    records,
    captioners,
    baselines=baselines,
    honest=honest,
    config=settings,
    judge_name=judge_name(judge_cfg),
    settings={
      "manifest": str(manifest),
      **{k: v for k, v in confine.items() if v},  # the data root the manifest was read under (the inspector's)
      "manifest_images": manifest_size,
      "num_images": len(records),
      "captioners": specs,
      "empty_captions": empty,
      "empty_captions_scored": {k: v for k, v in empties.items() if v},
      "duplicate_captions": duplicates,
    },
  )
  return write_report(dataclasses.replace(report, vqa_probe=vqa), out_dir)
