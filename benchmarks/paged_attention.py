"""One decode step's paged attention on CPU: the blocked jnp path ('auto' on CPU) vs the reference.

    OMP_WAIT_POLICY=PASSIVE python -m benchmarks.paged_attention [--rows 64 --pages 36 --length 560]

One layer's attention (`jaxcap.sampling.paged_attention`) at the `mid()` model's heads (8 query, 2 key/value heads
of 64), float32: each of --rows rows reads --length cache positions through a table of --pages pages of
--page_size tokens (its pages scattered over the pool, as a refilled engine's are). The reference gathers every
row's whole table into one array and then runs two batched dots over it; the blocked path gathers --block_tokens
positions at a time with an online softmax and stops after the longest row. Each side is jitted, warmed up and timed
over --calls calls a sample, interleaved (benchmarks/harness.py): min and median, ratio of mins, CPU and load.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if not __package__:  # run as a file: the repository root, for `benchmarks.*`
  sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import Section, add_arguments, interleaved, warm_up  # noqa: E402
from benchmarks.report import report  # noqa: E402


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--rows", type=int, default=64)
  ap.add_argument("--pages", type=int, default=36, help="pages in each row's table (the live bucket)")
  ap.add_argument("--page_size", type=int, default=16)
  ap.add_argument("--length", type=int, default=560, help="cache positions each row reads")
  ap.add_argument("--block_tokens", type=int, default=0, help="the blocked path's block (0: its default)")
  ap.add_argument("--calls", type=int, default=20, help="calls per timed sample")
  add_arguments(ap)
  args = ap.parse_args()

  import jax
  import jax.numpy as jnp
  import numpy as np

  from jaxcap.sampling import paged_attention
  from jaxcap.sampling.paged_attention import DecodeAttention

  if args.block_tokens:
    paged_attention.CPU_BLOCK_TOKENS = args.block_tokens
  r, n, z, kv, heads, h = args.rows, args.pages, args.page_size, 2, 8, 64
  rng = np.random.default_rng(0)
  pool = lambda: jnp.asarray(rng.normal(size=(kv, r * n + 1, z, h)), jnp.float32)
  k_pages, v_pages = pool(), pool()
  table = jnp.asarray(1 + rng.permutation(r * n).reshape(r, n), jnp.int32)
  lengths = jnp.full((r,), args.length, jnp.int32)
  q = jnp.asarray(rng.normal(size=(r, heads, h)), jnp.float32)
  sides = {name: jax.jit(DecodeAttention(name), static_argnums=5) for name in ("blocked", "reference")}
  err = np.abs(np.asarray(sides["blocked"](q, k_pages, v_pages, lengths, table, 0.125)) - np.asarray(
    sides["reference"](q, k_pages, v_pages, lengths, table, 0.125)
  )).max()  # fmt: skip
  print(f"{r} rows x {n} pages of {z}, {args.length} positions read; max |blocked - reference| {err:.1e}")

  def calls(fn):
    def run():
      for _ in range(args.calls):
        out = fn(q, k_pages, v_pages, lengths, table, 0.125)
      jax.block_until_ready(out)

    return run

  runs = {name: calls(fn) for name, fn in sides.items()}
  warmup = {name: warm_up(run) for name, run in runs.items()}
  with Section() as section:
    blocked_s, reference_s = interleaved(runs["blocked"], runs["reference"], args.pairs, names=tuple(runs))
  report(
    f"paged attention, {args.calls} calls",
    args.calls * r * args.length,
    "positions/s",
    {"blocked": blocked_s, "reference": reference_s},
    warmup,
    section,
    extra=dict(rows=r, pages=n, page_size=z, length=args.length, block_tokens=paged_attention.CPU_BLOCK_TOKENS),
    args=args,
    json_path=args.json,
  )


if __name__ == "__main__":
  main()
