"""Rollout throughput: jaxcap's compiled sampler vs `transformers` generate, same model, images, G and tokens.

    OMP_WAIT_POLICY=PASSIVE python -m benchmarks.rollout --images 8 --samples 4 --new_tokens 64 [--pairs 5]

(PASSIVE keeps torch's OpenMP threads from spin-waiting, which collapses its throughput when other work shares
the cores; on a quiet machine it makes little difference.)

Both sides sample (temperature 1, no top-k / top-p) exactly --new_tokens tokens per sequence from the same
random-init weights of `jaxcap.models.mid()` (~60M params), on CPU. tokens/s = images * samples * new_tokens /
wall time of one call, prefill and vision included. Each side is warmed up once first and that time reported
apart (jaxcap's first call compiles; transformers gets one short 2-token call), then the two are timed
interleaved, jaxcap then transformers, --pairs times (benchmarks/harness.py): min and median per side, the ratio
of the mins, the machine and its load.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

if not __package__:  # run as a file (python benchmarks/rollout.py): the repository root, for `benchmarks.*`
  sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks.ceilings import measured_ceilings, print_ceilings  # noqa: E402
from benchmarks.fixtures import run_config  # noqa: E402
from benchmarks.harness import Section, add_arguments, interleaved, warm_up  # noqa: E402
from benchmarks.report import report  # noqa: E402


def _images(count: int, size: int):
  rng = np.random.RandomState(0)
  return [(rng.rand(size, size, 3) * 255).astype(np.uint8) for _ in range(count)]


def _hf_kwargs(batch, cfg) -> dict:
  """transformers generate kwargs for an image-only jaxcap `ModelInputs` batch."""
  import torch

  ids = torch.as_tensor(batch.input_ids, dtype=torch.long)
  return dict(
    input_ids=ids,
    attention_mask=torch.as_tensor(batch.attention_mask, dtype=torch.long),
    mm_token_type_ids=(ids == cfg.image_token_id).int(),
    pixel_values=torch.as_tensor(batch.pixel_values),
    image_grid_thw=torch.as_tensor(batch.image_grid_thw),
  )


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--images", type=int, default=8)
  ap.add_argument("--samples", type=int, default=4, help="G, samples per image")
  ap.add_argument("--new_tokens", type=int, default=64)
  ap.add_argument("--image_size", type=int, default=224, help="square images, pixels per side")
  ap.add_argument("--skip_hf", action="store_true", help="time jaxcap only")
  add_arguments(ap)
  args = ap.parse_args()

  import jax
  import torch
  import transformers
  from jaxcap.checkpoint import load_hf_checkpoint
  from jaxcap.models import mid
  from jaxcap.processing import Processor, word_tokenizer
  from jaxcap.sampling import Sampler
  from jaxcap.train.steps.programs import sampling_config

  cfg = mid()
  torch.manual_seed(0)
  hf = transformers.Qwen2_5_VLForConditionalGeneration(transformers.Qwen2_5_VLConfig(**cfg.to_hf_dict()))
  hf = hf.float().eval()
  tokenizer = word_tokenizer("describe the image in detail .".split(), cfg)
  with tempfile.TemporaryDirectory() as tmp:
    hf.save_pretrained(tmp)
    model = load_hf_checkpoint(tmp)
  processor = Processor(tokenizer, cfg)
  conversations = [
    [
      {
        "role": "user",
        "content": [{"type": "image", "image": im}, {"type": "text", "text": "describe the image in detail ."}],
      }
    ]
    for im in _images(args.images, args.image_size)
  ]
  batch = processor(conversations, padding_side="left")
  n_seq, n_new = args.images * args.samples, args.new_tokens
  total = n_seq * n_new
  n_params = sum(p.numel() for p in hf.parameters())
  print(
    f"mid(): {n_params / 1e6:.1f}M params; {args.images} images x "
    f"{args.samples} samples = {n_seq} sequences, {n_new} new tokens each, prompt {batch.input_ids.shape[1]} "
    f"tokens; jax {jax.__version__} on {jax.devices()[0].platform}, torch threads {torch.get_num_threads()}"
  )

  # temperature 1, no top-k / top-p, no stop tokens: every sequence runs to n_new (jaxcap.train.steps.programs)
  config = run_config(max_new_tokens=n_new)
  sampler = Sampler(model, processor=processor, sampling=sampling_config(config, stop_ids=()))
  keys = itertools.count()  # a fresh key per call: same shapes, so the same compiled bucket
  lengths = []  # checked after timing, so the check's own dispatch stays out of the timed calls

  def jax_rollout():
    out = sampler(batch, jax.random.key(next(keys)), num_samples=args.samples)
    jax.block_until_ready(out.tokens)
    lengths.append(out.lengths)

  warmup = {"jaxcap": warm_up(jax_rollout)}  # compiles
  hf_rollout = None
  if not args.skip_hf:
    kw = _hf_kwargs(batch, cfg)
    gen = dict(
      do_sample=True,
      temperature=config.sampling.temperature,
      top_k=config.sampling.top_k,
      top_p=config.sampling.top_p,
      num_return_sequences=args.samples,
      pad_token_id=tokenizer.pad_token_id,
      eos_token_id=cfg.eos_token_id,
    )

    def hf_rollout():
      with torch.no_grad():
        seqs = hf.generate(**kw, max_new_tokens=n_new, min_new_tokens=n_new, **gen)
      assert seqs.shape == (n_seq, batch.input_ids.shape[1] + n_new), seqs.shape

    def hf_warm_up():
      with torch.no_grad():
        hf.generate(**kw, max_new_tokens=2, min_new_tokens=2, **gen)

    warmup["transformers"] = warm_up(hf_warm_up)
  ceilings = measured_ceilings(args, cfg, n_seq, with_torch=False)
  with Section() as section:
    jax_s, hf_s = interleaved(jax_rollout, hf_rollout, args.pairs, names=("jaxcap", "transformers"))
  ceilings = measured_ceilings(args, cfg, n_seq, with_torch=False, previous=ceilings)  # and after: the best of both
  assert all(int(n.sum()) == total for n in lengths), "jaxcap stopped early"
  record = report(
    "rollout (sampling)",
    total,
    "tokens/s",
    {"jaxcap": jax_s, "transformers": hf_s},
    warmup,
    section,
    extra=dict(
      params_m=round(n_params / 1e6, 1), sequences=n_seq, new_tokens=n_new, prompt_tokens=batch.input_ids.shape[1]
    ),
    args=args,
    json_path=args.json,
  )
  if ceilings is not None:
    print_ceilings(ceilings)
    roof = rollout_roofline(cfg, model, batch, n_seq, n_new, ceilings)
    call_s = record["sides"]["jaxcap"]["min_s"]
    print(
      f"roofline (f32, this machine): prefill {roof['prefill_s']:.3f} s + {n_new} decode steps x "
      f"{1e3 * roof['decode_step_s']:.1f} ms ({roof['decode_bound']}-bound: {roof['decode_gflop']:.2f} GFLOP, "
      f"{roof['decode_mb']:.0f} MB per step) = {roof['total_s']:.3f} s; jaxcap's min "
      f"{call_s:.3f} s is {roof['total_s'] / call_s:.0%} of it"
    )
    # The decode step from the call less a measured prefill: the same call with max_new_tokens=1 (prefill, vision
    # and the first token; the decode loop runs no step), so the prefill's own efficiency does not count here.
    # The cache then has 63 fewer slots, which the prefill does not read.
    one = sampling_config(config, max_new_tokens=1, stop_ids=())
    prefill_call = lambda: jax.block_until_ready(
      sampler(batch, jax.random.key(0), num_samples=args.samples, sampling=one).tokens
    )
    prefill_call()  # compiles
    prefill_s = min(_seconds(prefill_call) for _ in range(args.pairs))
    step_s = (call_s - prefill_s) / (n_new - 1)
    print(
      f"decode step: ({call_s:.3f} s call - {prefill_s:.3f} s measured prefill) / {n_new - 1} steps = "
      f"{1e3 * step_s:.1f} ms = {step_s / roof['decode_step_s']:.2f}x its roofline; with the roofline prefill instead: "
      f"{1e3 * (call_s - roof['prefill_s']) / n_new:.1f} ms = {(call_s - roof['prefill_s']) / n_new / roof['decode_step_s']:.2f}x"
    )


def _seconds(fn) -> float:
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def rollout_roofline(cfg, model, batch, n_seq: int, n_new: int, ceilings: dict) -> dict:
  """Lower bound on one rollout's time on this machine: the prefill's model FLOPs at the GEMM ceiling, plus per
  decode step the larger of its FLOPs at the GEMM ceiling and its bytes (f32 weights and the KV cache read once)
  at the copy bandwidth."""
  from flax import nnx

  from jaxcap.models.flops import model_flops, param_counts

  t = cfg.text
  counts = param_counts(nnx.state(model, nnx.Param))
  b, p = batch.input_ids.shape
  per_image = int(np.prod(batch.grid_thw[0]))
  prefill = model_flops(cfg, counts, sequences=b, prompt=p, completion=0, images=b, patches_per_image=per_image)
  prefill_flops = prefill["total"] / 3 + 2 * t.hidden_size * t.vocab_size * b
  slots = p + n_new / 2  # the average attended cache length
  head = t.hidden_size * t.vocab_size
  flops = (
    2 * (counts["decoder"] + head) * n_seq
    + 4 * t.num_hidden_layers * t.num_attention_heads * t.head_dim * slots * n_seq
  )
  kv = 2 * t.num_hidden_layers * n_seq * slots * t.num_key_value_heads * t.head_dim
  nbytes = 4 * (counts["decoder"] + head + kv)
  gemm, bandwidth = ceilings["xla_gemm_gflops"] * 1e9, ceilings["bandwidth_gbs"] * 1e9
  step = max(flops / gemm, nbytes / bandwidth)
  return dict(
    prefill_s=prefill_flops / gemm,
    decode_step_s=step,
    decode_bound="compute" if flops / gemm >= nbytes / bandwidth else "memory",
    decode_gflop=flops / 1e9,
    decode_mb=nbytes / 1e6,
    total_s=prefill_flops / gemm + n_new * step,
  )


if __name__ == "__main__":
  from jaxcap.host_memory import retain_on_cpu

  retain_on_cpu()  # as the launcher does (JAXCAP_HOST_MALLOC=system: glibc defaults)
  main()
