"""What the console says when a run ends: its workdir, what it wrote there, and the commands that read it next
(the inspector, the evaluator on its held-out captions, the annotator on its export)."""

from __future__ import annotations

import shlex
from pathlib import Path

from jaxcap.config.run import Run


def end_of_run(config: Run) -> list[str]:
  """The lines to print after a finished run of `config`: the outputs that exist in its workdir and the next
  commands, with paths as the run was given them (relative to where it was started)."""
  wd = Path(config.workdir)
  q = lambda p: shlex.quote(str(p))
  lines = [f"run finished: {wd}"]
  outputs = [("policy (HF checkpoint)", wd / "export"), ("LoRA adapters", wd / "export_adapters")]
  outputs += [("metrics", wd / "metrics.jsonl"), ("summary", wd / "summary.json"), ("curves", wd / "curves.png")]
  outputs += [("held-out captions", wd / "captions")]
  lines += [f"  {what}: {path}" for what, path in outputs if path.exists()]
  lines += ["next:", f"  python -m jaxcap.inspect {q(wd)}"]
  evaluate = eval_command(config)
  if evaluate:
    lines.append("  " + evaluate)
  if (wd / "export" / "config.json").exists():
    lines.append(f"  python -m jaxcap.caption --checkpoint {q(wd / 'export')} --images IMAGES_DIR --out captions.jsonl")
  return lines


def eval_command(config: Run) -> str | None:
  """`python -m jaxcap.eval` comparing the run's held-out captions at the end of each phase (the first phase the
  baseline) on the held-out images they cover (the manifest's first `eval.num_images`); None when it wrote none."""
  wd = Path(config.workdir)
  ends = sorted((wd / "captions").glob("*_end.jsonl"), key=lambda p: (p.stem != "sft_end", p.stem))
  manifest = config.data.eval_manifest or wd / "world" / "heldout" / "manifest.jsonl"
  if not ends or ("://" not in str(manifest) and not Path(manifest).exists()):
    return None
  q = lambda p: shlex.quote(str(p))
  names = [p.stem.removesuffix("_end") for p in ends]
  parts = ["python -m jaxcap.eval --config=configs/eval.py", f"--config.manifest={q(manifest)}"]
  parts += [f"--config.num_images={int(config.eval.num_images)}"]
  if config.data.eval_manifest and config.data.media_root:  # the run's data root, as the run read the manifest
    parts += [f"--config.media_root={q(config.data.media_root)}"]
  if config.data.eval_manifest and config.data.allow_outside_paths:
    parts += ["--config.allow_outside_paths=true"]
  parts += [f"--captioner {name}=jsonl:{q(p)}" for name, p in zip(names, ends)]
  parts += [f"--config.compare_to={names[0]}", f"--config.out_dir={q(wd / 'eval_report')}"]
  return " ".join(parts)
