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

if not __package__:  # run as a file (python benchmarks/real_shape_table.py): the repository root, for `benchmarks.*`
  sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks.caption_phases import GIB, images  # noqa: E402
from benchmarks.real_shape_children import jaxcap_child, transformers_child  # noqa: E402

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
