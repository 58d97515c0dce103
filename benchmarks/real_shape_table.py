"""jaxcap against transformers on a Hub-layout checkpoint (issue 36): load, one forward, greedy captions, each
implementation in a fresh process, host memory polled from /proc. Not run by the tests.

    python -m benchmarks.real_shape_memory build --preset qwen2.5-vl-3b --out /data/ckpt/3b   # once
    python -m benchmarks.real_shape_table --checkpoint /data/ckpt/3b --images 4 --max_new_tokens 16

Three processes, one after the other: `jaxcap` (load_hf_checkpoint in the checkpoint's dtype, one jitted forward
of a 448x336 image + the annotator's prompt, twice: compile + run, then run), `transformers` (from_pretrained in
the checkpoint's dtype, the same forward once, with `--tf_generate` then `generate` greedy over the images two at
a time) and `caption`
(`python -m jaxcap.caption` on the same images, two at a time). Each prints its phases (seconds, peak RssAnon
within the phase); this process polls each child's RssAnon / RssFile and prints the table, plus the agreement of
the two forwards' last-position logits (argmax, top-10 overlap).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.caption_phases import GIB, Poller, images

PROMPT_SIZE = (448, 336)


def child_status(pid: int) -> dict[str, int]:
  out = {}
  try:
    for line in open(f"/proc/{pid}/status"):
      key = line.split(":")[0]
      if key in ("RssAnon", "RssFile"):
        out[key] = int(line.split()[1]) * 1024
  except OSError:
    pass
  return out


def run_polled(cmd: list[str], env=None) -> tuple[int, float, dict[str, int], str]:
  """(returncode, wall seconds, peak RssAnon / RssFile, stdout) of `cmd`, its /proc status polled every 0.1 s."""
  start = time.perf_counter()
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
  peak = {"RssAnon": 0, "RssFile": 0}
  out: list[str] = []
  reader = threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True)
  reader.start()
  while proc.poll() is None:
    for k, v in child_status(proc.pid).items():
      peak[k] = max(peak[k], v)
    time.sleep(0.1)
  reader.join()
  return proc.returncode, time.perf_counter() - start, peak, "".join(out)


class Timeline:
  """A child's phases: one JSON line each, {phase, s, peak_anon} (peak RssAnon within the phase, GiB)."""

  def __init__(self):
    self.poller, self.last = Poller(), time.perf_counter()

  def done(self, phase: str, **extra):
    now = time.perf_counter()
    line = {"phase": phase, "s": round(now - self.last, 2), "peak_anon": round(self.poller.mark() / GIB, 2)}
    print(json.dumps(line | extra), flush=True)
    self.last = time.perf_counter()


def conversations(paths: list[Path]) -> list:
  from PIL import Image

  from jaxcap.caption import DEFAULT_PROMPT

  return [
    [
      {
        "role": "user",
        "content": [{"type": "image", "image": Image.open(p).convert("RGB")}, {"type": "text", "text": DEFAULT_PROMPT}],
      }
    ]
    for p in paths
  ]


def top10(logits) -> list[int]:
  import numpy as np

  return [int(i) for i in np.argsort(-np.asarray(logits, np.float32))[:10]]


def jaxcap_child(directory: Path, paths: list[Path]) -> None:
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from jaxcap.checkpoint import load_hf_checkpoint
  from jaxcap.models.inference_graph import unrolled_on_cpu
  from jaxcap.processing import Processor

  t = Timeline()
  model = load_hf_checkpoint(directory)
  graphdef, state = nnx.split(model)
  del model
  jax.block_until_ready(jax.tree.leaves(state))
  t.done("load", params_gib=round(sum(x.nbytes for x in jax.tree.leaves(state)) / GIB, 2))
  batch = Processor.from_pretrained(directory)(conversations(paths[:1]))
  args = (jnp.asarray(batch.input_ids), jnp.asarray(batch.positions), jnp.asarray(batch.attention_mask), batch.vision())
  graphdef = unrolled_on_cpu(graphdef, state)  # as jaxcap's inference paths run a 16-bit model on CPU
  forward = jax.jit(lambda state, *a: nnx.merge(graphdef, state)(*a)[0][:, -1])
  jax.block_until_ready(forward(state, *args))
  t.done("forward (compile + run)", tokens=int(batch.input_ids.shape[1]))
  logits = forward(state, *args)
  jax.block_until_ready(logits)
  t.done("forward", top10=top10(logits[0]))


def transformers_child(directory: Path, paths: list[Path], max_new_tokens: int, generate: bool) -> None:
  import torch
  import transformers

  from benchmarks.fixtures import hf_inputs
  from jaxcap.checkpoint import read_config
  from jaxcap.processing import Processor

  t = Timeline()
  cfg = read_config(directory)
  dtype = getattr(torch, json.loads((directory / "config.json").read_text()).get("dtype", "float32"))
  model = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(directory, dtype=dtype).eval()
  t.done("load")
  processor = Processor.from_pretrained(directory)
  kw = hf_inputs(processor(conversations(paths[:1])), cfg)
  with torch.no_grad():
    logits = model(**kw).logits[0, -1].float().numpy()
    t.done("forward", tokens=int(kw["input_ids"].shape[1]), top10=top10(logits))
    if not generate:
      return
    for i in range(0, len(paths), 2):  # same-size images: no padding, so generate's left-padding rule is moot
      kw = hf_inputs(processor(conversations(paths[i : i + 2])), cfg)
      model.generate(**kw, max_new_tokens=max_new_tokens, do_sample=False)
    t.done("generate", images=len(paths))


def measure(args) -> None:
  python = sys.executable
  la = os.getloadavg()
  print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, load average {la}")
  with tempfile.TemporaryDirectory() as tmp:
    folder = Path(tmp) / "images"
    folder.mkdir()
    images(folder, args.images)
    common = [
      "--checkpoint",
      args.checkpoint,
      "--images",
      str(args.images),
      "--max_new_tokens",
      str(args.max_new_tokens),
    ]
    rows = {}
    for impl in args.impls:
      if impl == "caption":
        cmd = [python, "-m", "jaxcap.caption", "--checkpoint", args.checkpoint, "--images", str(folder)]
        cmd += [
          "--out",
          str(Path(tmp) / "captions.jsonl"),
          "--batch_size",
          "2",
          "--max_new_tokens",
          str(args.max_new_tokens),
        ]
      else:
        cmd = [python, "-m", "benchmarks.real_shape_table", "--child", impl, "--image_dir", str(folder), *common]
      rc, wall, peak, out = run_polled(cmd)
      phases = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
      rows[impl] = dict(rc=rc, wall=wall, peak=peak, phases=phases)
      print(
        f"\n{impl}: rc {rc}, {wall:.0f} s, peak RssAnon {peak['RssAnon'] / GIB:.2f} GiB, RssFile {peak['RssFile'] / GIB:.2f} GiB"
      )
      for p in phases:
        print("  ", p)
  report(rows, args)


def report(rows: dict, args) -> None:
  def phase(impl, name):
    return next((p for p in rows.get(impl, {}).get("phases", []) if p["phase"] == name), None)

  print("\n| step | transformers | jaxcap |\n| --- | --- | --- |")
  for label, tf, jx in (
    ("load", "load", "load"),
    ("first forward", "forward", "forward (compile + run)"),
    ("forward", "forward", "forward"),
  ):
    cells = []
    for impl, name in (("transformers", tf), ("jaxcap", jx)):
      p = phase(impl, name)
      cells.append(f"{p['s']:.1f} s, peak anon {p['peak_anon']:.2f} GiB" if p else "-")
    print(f"| {label} | {cells[0]} | {cells[1]} |")
  gen, cap = phase("transformers", "generate"), rows.get("caption")
  tf_cell = f"{gen['images'] / gen['s']:.3f} images/s (generate only)" if gen else "-"
  cap_cell = (
    f"rc {cap['rc']}, {args.images / cap['wall']:.3f} images/s incl. load + compile, {cap['wall']:.0f} s"
    if cap
    else "-"
  )
  print(f"| {args.images} images, {args.max_new_tokens} new tokens, 2 a batch | {tf_cell} | {cap_cell} |")
  peaks = [
    f"{rows[i]['peak']['RssAnon'] / GIB:.2f} anon + {rows[i]['peak']['RssFile'] / GIB:.2f} file" if i in rows else "-"
    for i in ("transformers", "jaxcap")
  ]
  print(f"| process peak RSS (GiB) | {peaks[0]} | {peaks[1]} |")
  if cap:
    print(
      f"| `jaxcap.caption` peak RSS (GiB) | | {cap['peak']['RssAnon'] / GIB:.2f} anon + {cap['peak']['RssFile'] / GIB:.2f} file |"
    )
  a, b = phase("jaxcap", "forward"), phase("transformers", "forward")
  if a and b:
    print(
      f"\nlast-position logits: argmax equal {a['top10'][0] == b['top10'][0]}, "
      f"top-10 overlap {len(set(a['top10']) & set(b['top10']))}/10"
    )


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(prog="python -m benchmarks.real_shape_table")
  ap.add_argument("--checkpoint", required=True, help="a Hub-layout checkpoint directory (real_shape_memory build)")
  ap.add_argument("--images", type=int, default=4, help="448x336 random images to caption")
  ap.add_argument("--max_new_tokens", type=int, default=16)
  ap.add_argument("--impls", nargs="+", default=["jaxcap", "transformers", "caption"])
  ap.add_argument(
    "--tf_generate",
    action="store_true",
    help="transformers also generates (slow in bf16 on CPUs without AVX-512 BF16: torch emulates the dots)",
  )
  ap.add_argument("--child", choices=("jaxcap", "transformers"), help=argparse.SUPPRESS)
  ap.add_argument("--image_dir", help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  if args.child:
    paths = sorted(Path(args.image_dir).glob("*.png"))
    if args.child == "jaxcap":
      from jaxcap.host_memory import retain_on_cpu

      retain_on_cpu()  # as the annotator runs
      jaxcap_child(Path(args.checkpoint), paths)
    else:
      transformers_child(Path(args.checkpoint), paths, args.max_new_tokens, args.tf_generate)
    return 0
  measure(args)
  return 0


if __name__ == "__main__":
  sys.exit(main())
