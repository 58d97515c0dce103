"""The gated delta rule (Qwen3.5's linear attention): jaxcap's jitted chunked scan vs transformers'
`torch_chunk_gated_delta_rule`, forward and forward + backward, on the same inputs and CPU.

    python -m benchmarks.gated_delta [--batch 1] [--tokens 1024] [--key_heads 4] [--value_heads 8] [--dim 128]
                                     [--backward] [--pairs 5] [--json gated_delta.json]

Both in float32, q / k L2-normalised inside, chunks of 64. After one warm-up call each (jaxcap's compile reported
apart), the two sides are timed interleaved (benchmarks/harness.py). Prints tokens/s at the min and median call
time, the ratio of the mins, and the machine and its load. Defaults: a quarter of Qwen3.5-4B's linear heads (16 key
/ 32 value heads of 128) at 1024 tokens.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

if not __package__:  # run as a file: the repository root, for `benchmarks.*`
  sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import Section, add_arguments, interleaved, warm_up  # noqa: E402
from benchmarks.report import report  # noqa: E402


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--batch", type=int, default=1)
  ap.add_argument("--tokens", type=int, default=1024)
  ap.add_argument("--key_heads", type=int, default=4)
  ap.add_argument("--value_heads", type=int, default=8)
  ap.add_argument("--dim", type=int, default=128, help="key and value head dim")
  ap.add_argument("--backward", action="store_true", help="time forward + backward (gradients of q, k, v, g, beta)")
  ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads")
  add_arguments(ap)
  args = ap.parse_args()

  import jax
  import jax.numpy as jnp
  import torch
  from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

  from jaxcap.models.gated_delta import chunk_gated_delta

  torch.set_num_threads(args.threads)
  b, t, hk, hv, d = args.batch, args.tokens, args.key_heads, args.value_heads, args.dim
  rng = np.random.RandomState(0)
  arrays = dict(
    q=rng.randn(b, t, hk, d),
    k=rng.randn(b, t, hk, d),
    v=rng.randn(b, t, hv, d),
    g=-np.log1p(np.exp(rng.randn(b, t, hv))),  # -softplus: log decays <= 0
    beta=1 / (1 + np.exp(-rng.randn(b, t, hv))),
  )
  arrays = {n: a.astype(np.float32) for n, a in arrays.items()}
  ours = {n: jnp.asarray(a) for n, a in arrays.items()}
  torch_names = dict(q="query", k="key", v="value", g="g", beta="beta")  # transformers' argument names
  theirs = {torch_names[n]: torch.tensor(a, requires_grad=args.backward) for n, a in arrays.items()}

  def loss_jax(x):
    out, state = chunk_gated_delta(x["q"], x["k"], x["v"], x["g"], x["beta"])
    return jnp.sum(out**2) + jnp.sum(state**2)

  fn = jax.jit(jax.grad(loss_jax) if args.backward else lambda x: chunk_gated_delta(**x))

  def jax_call():
    jax.block_until_ready(fn(ours))

  def hf_call():
    x = theirs
    if args.backward:
      out, state = torch_chunk_gated_delta_rule(**x, output_final_state=True, use_qk_l2norm_in_kernel=True)
      ((out**2).sum() + (state**2).sum()).backward()
    else:
      with torch.inference_mode():
        torch_chunk_gated_delta_rule(**x, output_final_state=True, use_qk_l2norm_in_kernel=True)

  # the two agree before anything is timed
  want, _ = torch_chunk_gated_delta_rule(
    **{torch_names[n]: torch.tensor(a) for n, a in arrays.items()},
    output_final_state=True,
    use_qk_l2norm_in_kernel=True,
  )
  got, _ = chunk_gated_delta(**ours)
  err = float(np.abs(np.asarray(got) - want.numpy()).max())
  mode = "forward + backward" if args.backward else "forward"
  print(
    f"gated delta rule, {mode}: batch={b} tokens={t} heads={hk}/{hv} dim={d} threads={args.threads} "
    f"max |jaxcap - transformers| = {err:.2e}"
  )
  warmup = {"jaxcap": warm_up(jax_call), "transformers": warm_up(hf_call)}
  with Section() as section:
    jax_s, hf_s = interleaved(jax_call, hf_call, args.pairs, names=("jaxcap", "transformers"))
  report(
    f"gated delta rule ({mode})",
    b * t,
    "tokens/s",
    {"jaxcap": jax_s, "transformers": hf_s},
    warmup,
    section,
    extra=dict(max_abs_error=err, batch=b, tokens=t, key_heads=hk, value_heads=hv, dim=d),
    args=args,
    json_path=args.json,
  )


if __name__ == "__main__":
  main()
