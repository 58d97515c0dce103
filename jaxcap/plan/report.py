"""A plan in words: what to change when a program does not fit, and the printed table."""

from __future__ import annotations

from jaxcap.train.steps.adapters import format_breakdown, lora_advice
from jaxcap.train.steps.programs import packs

GIB = 2**30


def advice(
  config, results, state_bytes: int, budget: float, mesh, slots_fit: int | None = None, base_dtype: str | None = None
) -> list[str]:
  """What to change when a program does not fit (largest term first); `base_dtype`: the planned params' dtype."""
  out = []
  # remat is a fix only where it is not full already
  remat = "" if config.model.remat == "full" else f"set model.remat='full' (now '{config.model.remat}'), "
  for r in results:
    if r.peak <= budget:
      continue
    over = (r.peak - budget) / GIB
    if r.name in ("rl_step", "logprobs") and packs(config):
      out.append(
        f"{r.name} is {over:.1f} GiB over ({r.temporaries / GIB:.1f} GiB temporaries): lower rl.micro_batch_tokens "
        f"(now {config.rl.micro_batch_tokens} tokens per packed micro-batch), {remat}or add devices"
      )
    elif r.name == "rl_step" and r.temporaries > r.arguments:
      m = config.rl.micro_batches
      out.append(
        f"rl_step is {over:.1f} GiB over, mostly activations ({r.temporaries / GIB:.1f} GiB temporaries): raise "
        f"rl.micro_batches (now {m}; it must divide rl.batch_size), {remat}lower model.logprob_chunk (now "
        f"{config.model.logprob_chunk} positions of "
        "float32 logits over the whole vocabulary per sequence) or lower sampling.max_new_tokens"
      )
    elif r.name in ("prefill", "decode"):
      out.append(
        f"{r.name} is {over:.1f} GiB over: the KV cache grows with rl.batch_size x (prompt + rl.num_samples x "
        "sampling.max_new_tokens); sample fewer rows at once or add devices on the batch axes"
      )
    elif r.name in ("paged_prefill", "segment"):  # one engine per device holds the whole compute-dtype model
      held = f"each device's engine holds the whole model in the compute dtype ({config.model.dtype}) beside its pages"
      if slots_fit == 0:
        out.append(
          f"{r.name} is {over:.1f} GiB over: {held}, and no slot count fits; use rollout.engine='static' (weights "
          "sharded over the mesh) or devices with more memory"
        )
      else:
        fit = "" if slots_fit is None else f"; about {slots_fit} fit"
        out.append(
          f"{r.name} is {over:.1f} GiB over: {held}; lower rollout.slots (now {config.rollout.slots}{fit}) or "
          f"rollout.pages (now {config.rollout.pages}, 0 = as many as a call can use), or use "
          "rollout.engine='static' (weights sharded over the mesh)"
        )
    else:
      out.append(f"{r.name} is {over:.1f} GiB over: raise rl.micro_batches or add devices")
  if state_bytes > 0.6 * budget:
    out.append(
      f"the train state alone takes {state_bytes / GIB:.1f} of {budget / GIB:.0f} GiB per device: shard it over "
      f"more devices on mesh axis 'fsdp' (now {dict(mesh.shape)})" + lora_advice(config, base_dtype)
    )
  return out


def decoder_line(result: dict) -> str:
  """The update's decoder FLOPs as the run lays the passes out, against each prompt repeated per completion."""
  d = result["update_decoder_tflop"]
  if not result["prompt_shared"]:
    return f"decoder FLOPs per RL update: {d['as_run']:.1f} TFLOP (each prompt repeated per completion)"
  return (
    f"decoder FLOPs per RL update: {d['as_run']:.1f} TFLOP, each prompt once per group (model.share_prompt); "
    f"{d['prompt_repeated']:.1f} TFLOP repeated per completion ({d['prompt_repeated'] / d['as_run']:.2f}x)"
  )


def layout_lines(result: dict) -> list[str]:
  """Where the learner and the rollouts run (rollout.devices), and what a version moves (nothing colocated)."""
  layout = result.get("layout") or {}
  if layout.get("rollouts", "colocated") == "colocated":
    return []
  learner, rollouts = layout["learner"], layout["rollouts"]
  return [
    f"disaggregated: learner on {learner['devices']} devices (mesh {learner['mesh']}), rollouts on "
    f"{rollouts['devices']} (mesh {rollouts['mesh']}, the whole model on each); each update moves "
    f"{result['weight_sync_gib']:.2f} GiB to each rollout device, device to device (rollout programs' "
    "'other state': the next version arriving)"
  ]


def format_plan(result: dict) -> str:
  lines = [
    f"model {result['model']['params'] / 1e9:.2f}B params on {result['devices']} x {result['device_kind']}, "
    f"mesh {result['mesh']}",
    "batch: {prompts} prompts x G {samples} in {micro_batches} micro-batches, prompt {prompt_tokens} + "
    "completion {completion} tokens".format(**result["batch"]),
    f"model FLOPs per RL update: {result['update_model_tflop']:.1f} TFLOP"
    + (
      f" (~{result['update_s_at_40pct_mfu']:.1f} s per update at 40% MFU on this chip)"
      if result["update_s_at_40pct_mfu"]
      else ""
    ),
    decoder_line(result),
    *layout_lines(result),
    f"train state per device: {result['train_state_gib_per_device']:.2f} GiB "
    f"(params {result['params_gib_per_device']:.2f} GiB)",
    format_breakdown(result["train_state_parts"]),
    "",
    f"{'program':<14}{'args':>9}{'temp':>9}{'out':>9}{'aliased':>9}{'other state':>13}{'peak':>9}{'compile':>10}",
  ]
  for r in result["programs"]:
    gib = lambda k: f"{r[k] / GIB:9.2f}"
    lines.append(
      f"{r['name']:<14}{gib('arguments')}{gib('temporaries')}{gib('outputs')}{gib('aliased')}"
      f"{r['resident_outside'] / GIB:13.2f}{r['peak'] / GIB:9.2f}{r['compile_s']:9.1f}s"
    )
  for r in result["programs"]:
    if r.get("error"):
      lines.append(f"{r['name']}: not compiled, {r['error']}")
  if result.get("queued_round_gib"):
    lines.append(
      f"rl.max_staleness: the queued rounds' prompts and rollouts, {result['queued_round_gib']:.2f} GiB per device, "
      "held through the RL step and the log-prob pass (in their 'other state')"
    )
  for r in result["programs"]:
    if r["name"] in ("decode", "segment") and r.get("bytes_accessed"):
      lines.append(f"{r['name']}: {r['bytes_accessed'] / GIB:.2f} GiB accessed per decode step (XLA's count)")
  e = result.get("engine")
  if e:
    lines.append(
      f"paged engine: {e['slots']} slots, a pool of {e['pages']} pages x {e['page_size']} tokens "
      f"({e['pool_bytes'] / GIB:.2f} GiB), a slot reads at most {e['read_pages']} pages"
      + (f"; linear states {e['state_bytes'] / GIB:.2f} GiB (slots and prompts)" if e.get("state_bytes") else "")
      + (f"; {e['shards']} engines, one per device's block of prompts" if e.get("shards", 1) > 1 else "")
    )
    if e.get("slots_fit") is not None:
      lines.append(
        f"rollout.slots that fit {result['hbm_gib']:g} GiB per device: about {e['slots_fit']} (the engine's "
        f"programs compiled again at {2 * e['slots']} slots: their peaks linear in the slots)"
      )
    if e.get("attention", "reference") != "reference":  # XLA cannot see into a Pallas kernel's page reads
      lines.append(
        f"decode attention: JAX's Pallas paged-attention kernel ({e['attention']}), reading each slot's filled "
        f"pages only, at most {e['read_bytes'] / GIB:.2f} GiB of keys and values per decode step (not in XLA's count)"
      )
  verdict = "fits" if result["fits"] else "does NOT fit"
  lines += ["", f"peak {result['peak_gib']:.2f} GiB per device of {result['hbm_gib']:.0f} GiB: {verdict}"]
  lines += [f"  - {a}" for a in result["advice"]]
  if result["device_kind"] == "cpu":
    lines.append("(XLA:CPU figures: bf16 temporaries are kept in f32 there, so this is an upper bound)")
  return "\n".join(lines)
