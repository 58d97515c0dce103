"""The training program: SFT warm start, then RL (sample -> judge -> advantages -> update), with evaluation,
checkpoints that resume exactly, metrics, and export. The imperative shell around the pure steps in step.py."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import json
import time
from pathlib import Path
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxcap.checkpoint import load_hf_checkpoint, save_hf_checkpoint
from jaxcap.models.qwen25vl import Qwen25VL
from jaxcap.processing import Processor
from jaxcap.rewards.mix import build_reward
from jaxcap.rewards.record import ImageRecord
from jaxcap.rl import PolicyLossConfig, apply_length_mask
from jaxcap.sampling import Sampler, SamplingConfig
from jaxcap.sharding import logical_to_spec, make_mesh, param_shardings, put_replicated_value
from jaxcap.train import data as data_lib
from jaxcap.train import embedded, vision_warmup
from jaxcap.train.checkpointing import RunCheckpointer
from jaxcap.train.metrics import MetricsWriter, plot_curves, to_scalars
from jaxcap.train.state import init_train_state, make_optimizer
from jaxcap.train.step import PromptBatch, RolloutBatch, rl_step, sequence_logprobs, sft_step


@dataclasses.dataclass
class Setup:
  """What a run is made of, built once from the config."""

  model: Qwen25VL
  processor: Processor
  train_records: list[ImageRecord]
  eval_records: list[ImageRecord]
  judge: Any
  scenes: dict  # scene id -> synthetic-world Scene, for rows that carry one (empty for other data)
  sft_targets: Any  # callable(record, rng) -> caption, for the SFT phase
  mesh: Any


# ------------------------------------------------------------------------------------------------ building
def build(config: ml_collections.ConfigDict, workdir: Path) -> Setup:
  mesh = make_mesh(dict(config.mesh.shape))
  key_seed = int(config.seed)
  if config.model.checkpoint:
    model = load_hf_checkpoint(
      config.model.checkpoint,
      mesh=mesh,
      dtype=_dtype(config.model.dtype),
      param_dtype=_dtype(config.model.param_dtype),
      remat=config.model.remat,
    )
    processor = Processor.from_pretrained(config.model.checkpoint, cfg=model.cfg)
  else:
    tok = _first_process_then_others(
      lambda: embedded.build_tokenizer(workdir, config.world.vocab_size, key_seed), "jaxcap-tokenizer"
    )
    s = config.model.student
    cfg = embedded.student_config(
      tok,
      vision_width=s.vision_width,
      vision_depth=s.vision_depth,
      text_width=s.text_width,
      text_layers=s.text_layers,
      text_heads=s.text_heads,
      rope_theta=s.rope_theta,
    )
    cfg = cfg.replace(
      dtype=_dtype(config.model.dtype), param_dtype=_dtype(config.model.param_dtype), remat=config.model.remat
    )
    model = Qwen25VL(cfg, rngs=nnx.Rngs(key_seed))
    graphdef, params = nnx.split(model)
    params = put_replicated_value(params, param_shardings(params, mesh))
    model = nnx.merge(graphdef, params)
    processor = Processor(tok, cfg, system=None)  # the tiny student needs no system turn

  if config.data.train_manifest:
    train_path, eval_path = Path(config.data.train_manifest), Path(config.data.eval_manifest or "")
  else:
    w = config.world
    train_path, eval_path = _first_process_then_others(
      lambda: embedded.build_world(
        workdir, world=embedded.world_config(w), train_scenes=w.train_scenes, eval_scenes=w.eval_scenes, seed=key_seed
      ),
      "jaxcap-world",
    )
  train_records = data_lib.read_manifest(train_path)
  eval_records = data_lib.read_manifest(eval_path) if str(eval_path) not in ("", ".") else train_records[:0]
  data_lib.check_media(train_records + eval_records)
  from jaxcap.data.synthetic.manifest import read_manifest as read_world

  scenes = {}
  for m in [train_path] + ([eval_path] if eval_records else []):
    scenes.update(read_world(m)[1])
  judge = build_judge(config, scenes, train_records + eval_records)
  return Setup(model, processor, train_records, eval_records, judge, scenes, sft_target_fn(config, scenes), mesh)


def _first_process_then_others(fn, name: str):
  """Runs a step that writes shared files on process 0 first; the others then find them and reuse them."""
  if jax.process_count() == 1:
    return fn()
  from jax.experimental import multihost_utils

  out = fn() if jax.process_index() == 0 else None
  multihost_utils.sync_global_devices(name)
  return out if out is not None else fn()


def build_judge(config, scenes: dict, records: Sequence[ImageRecord]):
  if config.judge.kind == "rule_based":
    from jaxcap.judges.rule_based import RuleBasedJudge

    if not scenes:
      raise ValueError(
        "judge.kind='rule_based' needs a synthetic-world manifest (rows with a 'scene' field); "
        "for other data use an LLM judge fleet (judge.kind='http')."
      )
    return RuleBasedJudge(scenes, failure_rate=config.judge.failure_rate, seed=int(config.seed))
  if config.judge.kind == "http":
    return http_judge(config.judge, records)
  raise ValueError(f"judge.kind={config.judge.kind!r}; choose 'rule_based' or 'http'.")


def http_judge(j, records: Sequence[ImageRecord]):
  """An `HttpJudge` over an OpenAI-compatible fleet: `judge.fleet_config` (JSON: role -> RoleConfig fields) or
  the comma-separated `judge.endpoints` serving `judge.model` for every role."""
  from jaxcap.judges.endpoint import Endpoint
  from jaxcap.judges.fleet import JudgeFleet, RoleConfig
  from jaxcap.judges.http_judge import HttpJudge, images_from_records

  if j.fleet_config:
    roles = {name: RoleConfig.from_json(row) for name, row in json.loads(Path(j.fleet_config).read_text()).items()}
  else:
    urls = [u.strip() for u in j.endpoints.split(",") if u.strip()]
    if not urls:
      raise ValueError(
        "judge.kind='http' needs --config.judge.endpoints=http://host:port/v1[,...] or "
        "--config.judge.fleet_config=FILE.json (see launch/ for starting a vLLM/SGLang fleet)"
      )
    roles = {
      "judge": RoleConfig(
        endpoints=tuple(Endpoint(u, j.api_key_env) for u in urls),
        model=j.model or "judge",
        timeout_s=j.timeout_s,
        max_concurrency=j.max_concurrency,
        send_images=j.send_images,
        structured_output=j.structured_output,
      )
    }
  return HttpJudge(JudgeFleet(roles), images=images_from_records(records))


def sft_target_fn(config, scenes: dict):
  """SFT target per record: the configured source ('incomplete' world captions, 'complete', or 'reference')."""
  source = config.sft.targets
  if source == "reference":
    return lambda rec, rng: rec.reference_caption
  if not scenes:
    raise ValueError(f"sft.targets={source!r} needs synthetic-world scenes; use sft.targets='reference'.")
  if source == "incomplete":
    return lambda rec, rng: embedded.incomplete_caption(scenes[rec.id], rng, config.sft.max_fraction)
  if source == "complete":
    return lambda rec, rng: embedded.complete_caption(scenes[rec.id])
  raise ValueError(f"sft.targets={source!r}; choose 'incomplete', 'complete' or 'reference'.")


def _dtype(name: str):
  return {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "f32": jnp.float32, "bf16": jnp.bfloat16}[name]


# ------------------------------------------------------------------------------------------------ batching
class Batcher:
  """Turns records into device batches with a leading micro-batch axis, sharded over the batch axes."""

  def __init__(self, processor: Processor, config, mesh):
    self.processor, self.config, self.mesh = processor, config, mesh

  def inputs(self, records: Sequence[ImageRecord]):
    convs = [data_lib.conversation(r, self.config.data.prompt, self.config.data.image_size) for r in records]
    return self.processor(convs, padding_side="left", pad_to_multiple_of=self.config.data.pad_to_multiple)

  def prompts(self, inputs, num_micro: int):
    """ModelInputs of B prompts -> (PromptBatch [M, B/M, ...], shared VisionLayout of one micro-batch)."""
    b = inputs.input_ids.shape[0]
    if b % num_micro:
      raise ValueError(f"batch of {b} prompts does not split into {num_micro} micro-batches")
    mb = b // num_micro
    layout, pixels = None, None
    if inputs.pixel_values is not None:
      grids = inputs.grid_thw
      if not (grids == grids[0]).all():
        raise ValueError("all images of a step must share one size; set data.image_size (pixels) to resize them")
      per_item = int(np.prod(grids[0]))
      pixels = inputs.pixel_values.reshape(num_micro, mb * per_item, -1)
      from jaxcap.models.vision import vision_layout

      # The step sees the global micro-batch (every process's images, all of one size).
      layout = vision_layout(np.repeat(grids[:1], mb * jax.process_count(), axis=0), self.processor.cfg.vision)
    split = lambda x: x.reshape(num_micro, mb, *x.shape[1:])
    pos = inputs.positions.reshape(3, num_micro, mb, -1).transpose(1, 0, 2, 3)
    batch = PromptBatch(split(inputs.input_ids), pos, split(inputs.attention_mask), pixels)
    return self.place(
      batch,
      {
        "ids": (None, "batch", None),
        "positions": (None, None, "batch", None),
        "mask": (None, "batch", None),
        # whole images per device when the micro-batch divides the batch axes
        "pixel_values": (None, "batch", None),
      },
    ), layout

  def place(self, tree, logical: dict | None = None):
    """Host arrays -> global device arrays sharded over ('data', 'fsdp') on their batch axis."""

    def put(path, x):
      if x is None:
        return None
      name = str(getattr(path[0], "name", getattr(path[0], "key", ""))) if path else ""
      axes = (logical or {}).get(name, (None, "batch") + (None,) * (np.ndim(x) - 2))
      spec = logical_to_spec(axes[: np.ndim(x)], np.shape(x), self.mesh)
      return jax.make_array_from_process_local_data(NamedSharding(self.mesh, spec), np.asarray(x))

    return jax.tree_util.tree_map_with_path(put, tree)


def _encode_targets(tokenizer, captions: Sequence[str], length: int, eos_id: int):
  ids = np.zeros((len(captions), length), np.int32)
  mask = np.zeros((len(captions), length), bool)
  for i, c in enumerate(captions):
    t = tokenizer(c, add_special_tokens=False)["input_ids"][: length - 1] + [eos_id]
    ids[i, : len(t)] = t
    mask[i, : len(t)] = True
  return ids, mask


# ------------------------------------------------------------------------------------------------ the run
class Trainer:
  """Runs one config in `workdir`, resuming from its latest checkpoint if there is one."""

  def __init__(self, config: ml_collections.ConfigDict):
    self.config = config
    self.workdir = Path(config.workdir)
    self.workdir.mkdir(parents=True, exist_ok=True)
    self.setup = build(config, self.workdir)
    self.graphdef, params = nnx.split(self.setup.model)
    self.params0 = params
    self.batcher = Batcher(self.setup.processor, config, self.setup.mesh)
    self.tokenizer = self.setup.processor.tokenizer
    self.eos_id = self.setup.model.cfg.eos_token_id
    s = config.sampling
    self.sampling = SamplingConfig(
      temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_new_tokens=s.max_new_tokens
    )
    self.greedy = dataclasses.replace(self.sampling, temperature=0.0)
    # Rollouts never need activation checkpointing (no backward pass), and remat inside the decode loop cannot
    # trace: sample from the same params through a graph built without it.
    cfg = self.setup.model.cfg
    sampling_graph = nnx.split(nnx.eval_shape(lambda: Qwen25VL(cfg.replace(remat="none"), rngs=nnx.Rngs(0))))[0]
    self.sampler = Sampler(
      nnx.merge(sampling_graph, params),
      processor=self.setup.processor,
      sampling=self.sampling,
      length_multiple=config.data.pad_to_multiple,
    )
    self.reward_fn = build_reward(config.reward.to_dict(), self.setup.judge)
    # Rubrics written against this run's policy replace the manifest's (see config.rubrics).
    self.policy_rubrics = "rubicap" in config.reward and config.rubrics.source == "policy"
    if self.policy_rubrics:
      strip = lambda rs: [dataclasses.replace(r, rubric=None) for r in rs]
      self.setup.train_records, self.setup.eval_records = (
        strip(self.setup.train_records),
        strip(self.setup.eval_records),
      )
    self.eval_fn = build_reward(
      {"caprl": {"preset": "paper", "questions_per_caption": 64, "seed": 12345}}, self.setup.judge
    )
    self.metrics = MetricsWriter(self.workdir)
    self.ckpt = RunCheckpointer(self.workdir / "checkpoints", max_to_keep=config.checkpoint.max_to_keep)
    self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    self.summary: dict[str, Any] = {}

  # -------------------------------------------------------------- phases
  def phases(self):
    c = self.config
    out = []
    if c.sft.steps > 0:
      out.append(("sft", c.sft.steps, c.sft.batch_size, c.sft.optim))
    if c.rl.steps > 0:
      out.append(("rl", c.rl.steps, c.rl.batch_size, c.rl.optim))
    return out

  def new_state(self, phase, steps, optim, params, key):
    opt = make_optimizer(
      optim.lr,
      steps,
      warmup_ratio=optim.warmup_ratio,
      warmup_steps=optim.warmup_steps,
      schedule=optim.schedule,
      weight_decay=optim.weight_decay,
      b1=optim.b1,
      b2=optim.b2,
      eps=optim.eps,
      grad_clip=optim.grad_clip,
      frozen=("visual",) if self.config[phase].freeze_vision else (),
    )
    with_ref = phase == "rl" and self.config.rl.loss.kl_coef > 0
    with jax.set_mesh(self.setup.mesh):
      state = init_train_state(params, opt, key, with_reference=with_ref)
    # Commit every leaf to its sharding (scalars replicated) so the jitted steps see the same argument
    # signature on every call and compile once.
    replicated = NamedSharding(self.setup.mesh, P())
    shardings = jax.tree.map(lambda x: x.sharding if isinstance(x.sharding, NamedSharding) else replicated, state)
    return opt, put_replicated_value(state, shardings)

  def run(self) -> dict:
    c = self.config
    phases = self.phases()
    if not phases:
      raise ValueError("nothing to do: sft.steps and rl.steps are both 0")
    resume = self._restore_point()
    params = self.params0
    if resume is None:
      self.metrics.reset()  # records of a run killed before its first checkpoint
      if c.vision_warmup.steps > 0 and not c.model.checkpoint:
        params = self.warm_up_vision(params)
    key = jax.random.key(int(c.seed))
    start_phase = 0
    if resume is not None:
      start_phase = [p[0] for p in phases].index(resume["phase"])
    for i, (phase, steps, batch_size, optim) in enumerate(phases):
      if i < start_phase:
        continue
      opt, state = self.new_state(phase, steps, optim, params, jax.random.fold_in(key, i))
      meta = None
      if resume is not None and i == start_phase:
        state, meta = self.ckpt.restore(resume["global_step"], state)
        self.summary.update(meta.get("summary", {}))
        self.metrics.truncate_after(phase, int(meta["step"]))
        if jax.process_index() == 0:
          print(f"resumed {phase} at step {meta['step']} from {self.ckpt.manager.directory}", flush=True)
        resume = None
      if phase == "rl" and self.policy_rubrics:
        self.prepare_rubrics(state.params, int(state.step))
      loader = data_lib.record_loader(self.setup.train_records, batch_size, seed=int(c.seed) + i)
      if meta is not None:
        loader.set_state(meta["loader"])
      elif phase == "rl" and "sft_end" in self.summary and not self.policy_rubrics:
        # same params as the SFT phase's end: reuse its eval
        self.summary["rl_start"] = self.summary["sft_end"]
        self.summary["rl_start_samples"] = self.summary.get("sft_end_samples", [])
        self.metrics.write(phase, 0, self.summary["rl_start"])
      elif phase == "rl" or (phase == "sft" and int(state.step) == 0 and c.eval.at_start):
        self.evaluate(state.params, phase, 0, tag="start")
      state = self.run_phase(phase, i, steps, state, opt, loader)
      params = state.params
      self.evaluate(params, phase, steps, tag="end")
    self.ckpt.wait()
    self.finish(params)
    return self.summary

  def warm_up_vision(self, params):
    """The embedded student's ViT trained on per-cell object attributes of freshly drawn synthetic scenes, a
    new batch each step (train/vision_warmup.py); scored on 256 more scenes from another stream."""
    c, w = self.config, self.config.vision_warmup
    world = embedded.world_config(c.world)  # drawn as stills whatever clip_fraction says
    draw = functools.partial(
      vision_warmup.fresh_scenes, world, image_size=c.data.image_size, preprocess=self.setup.processor.vision_cfg
    )
    # streams apart from the world's train (seed) and held-out (seed + 10_000) scenes
    train = lambda step: draw(seed=int(c.seed) + 20_000, start=step * w.batch_size, count=w.batch_size)
    heldout = draw(seed=int(c.seed) + 30_000, start=0, count=256)
    model = nnx.merge(self.graphdef, params)
    tower, metrics = vision_warmup.warm_up_vision(
      model.visual,
      train,
      heldout,
      steps=w.steps,
      lr=w.lr,
      seed=int(c.seed),
      mesh=self.setup.mesh,
      log=lambda step, m: self.metrics.write("vision", step, m),
    )
    nnx.update(model.visual, tower)
    if metrics:
      self.metrics.write("vision", w.steps, metrics)
      self.summary["vision_warmup"] = metrics
      if jax.process_index() == 0:
        print(
          "vision warm-up, held-out accuracy on object cells: "
          + ", ".join(f"{k.split('/')[1]}={v:.3f}" for k, v in metrics.items()),
          flush=True,
        )
    return nnx.split(model)[1]

  def _restore_point(self):
    step = self.ckpt.latest_step()
    if step is None:
      return None
    meta = self.ckpt.meta(step)
    return {"phase": meta["phase"], "global_step": step, "step": meta["step"]}

  def run_phase(self, phase, phase_index, steps, state, opt, loader):
    c = self.config
    mesh = self.setup.mesh
    if phase == "sft":
      fn = functools.partial(sft_step, graphdef=self.graphdef, optimizer=opt)
    else:
      lc = c.rl.loss
      loss_cfg = PolicyLossConfig(
        eps_low=lc.eps_low,
        eps_high=lc.eps_high,
        dual_clip_c=lc.dual_clip_c,
        aggregation=lc.aggregation,
        max_gen_len=c.sampling.max_new_tokens,
        kl_coef=lc.kl_coef,
        kl_estimator=lc.kl_estimator,
        entropy_coef=lc.entropy_coef,
      )
      fn = functools.partial(
        rl_step, graphdef=self.graphdef, optimizer=opt, loss_config=loss_cfg, estimator=c.rl.estimator
      )
    state_shardings = jax.tree.map(lambda x: x.sharding, state)
    step_fn = jax.jit(fn, donate_argnums=0, out_shardings=(state_shardings, None))
    logprob_fn = jax.jit(functools.partial(sequence_logprobs, self.graphdef))
    first = int(state.step)
    progress = _progress(steps, first, phase)
    base = 0 if phase == "sft" else c.sft.steps
    for step in range(first, steps):
      records = next(loader)
      t0 = time.perf_counter()
      step_rng = np.random.default_rng([int(c.seed), phase_index, step])  # per step, so a resume replays it
      with jax.set_mesh(mesh):
        if phase == "sft":
          metrics = self.sft_update(step_fn, state, records, step_rng)
        else:
          metrics = self.rl_update(step_fn, logprob_fn, state, records, step)
      state, metrics = metrics
      metrics["time/step_s"] = time.perf_counter() - t0
      self.metrics.write(phase, step + 1, metrics)
      progress.update(1)
      progress.set_postfix({k: f"{metrics[k]:.3f}" for k in ("loss", "reward/mean", "length/mean") if k in metrics})
      done = step + 1
      if c.eval.every and done % c.eval.every == 0 and done < steps and phase == "rl":
        self.evaluate(state.params, phase, done)
      if (c.checkpoint.every and done % c.checkpoint.every == 0) or done == steps:
        meta = {"phase": phase, "step": done, "loader": loader.get_state(), "summary": self.summary}
        self.ckpt.save(base + done, state, json.loads(json.dumps(meta, default=_jsonable)))
    progress.close()
    return state

  # -------------------------------------------------------------- steps
  def sft_update(self, step_fn, state, records, rng):
    c = self.config
    inputs = self.batcher.inputs(records)
    prompts, layout = self.batcher.prompts(inputs, c.sft.micro_batches)
    captions = [self.setup.sft_targets(r, rng) for r in records]
    ids, mask = _encode_targets(self.tokenizer, captions, c.sft.max_target_tokens, self.eos_id)
    m = c.sft.micro_batches
    targets = self.batcher.place({"t": ids.reshape(m, -1, ids.shape[1]), "m": mask.reshape(m, -1, ids.shape[1])})
    state, metrics = step_fn(state, prompts, targets["t"], targets["m"], layout)
    return state, to_scalars(metrics)

  def rl_update(self, step_fn, logprob_fn, state, records, step):
    c = self.config
    g, m = c.rl.num_samples, c.rl.micro_batches
    inputs = self.batcher.inputs(records)
    key = jax.random.fold_in(state.key, step)
    rollouts = self.sampler(inputs, key, num_samples=g, params=state.params)
    texts = rollouts.text
    # The judge runs on the host while the device computes the old / reference log-probs (async dispatch).
    future = self.pool.submit(self.reward_fn, texts, records, step=step)
    prompts, layout = self.batcher.prompts(inputs, m)
    tokens = self.batcher.place({"t": np.asarray(rollouts.tokens).reshape(m, -1, rollouts.tokens.shape[1])})["t"]
    cmask = self.batcher.place({"m": np.asarray(rollouts.completion_mask).reshape(m, -1, tokens.shape[2])})["m"]
    old = (
      logprob_fn(state.params, prompts, layout, tokens)
      if c.rl.recompute_old_logprobs
      else self.batcher.place({"o": np.asarray(rollouts.policy_logprobs).reshape(tokens.shape)})["o"]
    )
    ref = logprob_fn(state.ref_params, prompts, layout, tokens) if state.ref_params is not None else None
    rewards = future.result()
    valid = rewards.valid
    r = valid.shape[1]
    values, length_in_band = self.length_masked(rewards)
    rb = self.batcher.place({"v": values.reshape(m, -1, g, r).astype(np.float32), "ok": valid.reshape(m, -1, g, r)})
    weights = jnp.asarray(rewards.weights, jnp.float32)
    batch = RolloutBatch(tokens, cmask, old, rb["v"], rb["ok"], weights, ref)
    state, metrics = step_fn(state, prompts, batch, layout)
    out = to_scalars(metrics)
    lengths = np.asarray(rollouts.lengths)
    out.update(
      {
        "reward/mean": _weighted_mean(values, valid, rewards.weights),
        "length/mean": float(lengths.mean()),
        "length/words": float(rewards.caption_lengths.mean()),
        "judge/failed": float(sum(rewards.failed_judgments.values())),
      }
    )
    if c.rl.length_mask.dims:
      out["length/in_band"] = length_in_band
    for k, name in enumerate(rewards.names):
      ok = valid[:, k]
      out[f"reward/{name}"] = float(values[ok, k].mean()) if ok.any() else float("nan")
    return state, out

  def length_masked(self, rewards) -> tuple[np.ndarray, float | None]:
    """Reward values [N, R] with the two-sided length-conditional mask applied to `rl.length_mask.dims`
    (zero outside tau_low <= words / reference words <= tau_high), and the share of captions in the band."""
    lm = self.config.rl.length_mask
    if not lm.dims:
      return rewards.values, None
    unknown = [n for n in lm.dims if n not in rewards.names]
    if unknown:
      raise ValueError(f"rl.length_mask.dims {unknown} are not rewards of this run ({list(rewards.names)})")
    dims = [rewards.names.index(n) for n in lm.dims]
    n, r = rewards.values.shape
    masked, in_range = apply_length_mask(
      rewards.values.reshape(n, 1, r).astype(np.float32),
      rewards.caption_lengths.reshape(n, 1),
      rewards.reference_lengths.reshape(n, 1),
      dims,
      lm.tau_low,
      lm.tau_high,
    )
    return np.asarray(masked).reshape(n, r), float(np.asarray(in_range).mean())

  # -------------------------------------------------------------- evaluation and the end
  def greedy_captions(self, params, records, batch_size: int) -> tuple[list[str], list[int]]:
    """Greedy captions of `records` (every process passes the same records) and their lengths in tokens."""
    captions, lengths = [], []
    with jax.set_mesh(self.setup.mesh):
      for i in range(0, len(records), batch_size):
        out = self.sampler(
          self.batcher.inputs(records[i : i + batch_size]),
          jax.random.key(0),
          num_samples=1,
          sampling=self.greedy,
          params=params,
        )
        captions += out.text
        lengths += np.asarray(out.lengths).tolist()
    return captions, lengths

  def prepare_rubrics(self, params, step: int) -> None:
    """RubiCap stage 1 against the policy entering RL: for every train and held-out image without a stored
    rubric, its greedy caption is checked against the committee consensus and each failure becomes a weighted
    criterion. Rubrics are saved under workdir/rubrics as they are made, so a resumed run reuses them."""
    from jaxcap.rewards.rubric import RubricStore, RubricSynthesisConfig, jobs_from_records

    store = RubricStore(self.workdir / "rubrics")
    records = self.setup.train_records + self.setup.eval_records
    todo = [r for r in records if r.id not in store]
    if todo:
      bare = [r.id for r in todo if not r.teacher_captions]
      if bare:  # before captioning anything
        raise ValueError(
          f"rubrics.source='policy' needs teacher_captions (the committee) in every manifest row; "
          f"{len(bare)} rows have none, e.g. {bare[:3]}. Add them, or use rubrics.source='manifest' "
          "with rubrics from `python -m jaxcap.synthesize_rubrics`."
        )
      if step > 0 and jax.process_index() == 0:
        print(
          f"warning: {len(todo)} rubrics missing from {store.directory} at RL step {step}; writing them "
          "against the current policy, not the one RL started from",
          flush=True,
        )
      t0 = time.perf_counter()
      captions, _ = self.greedy_captions(params, todo, self.config.rubrics.batch_size)
      jobs, _ = jobs_from_records(todo, {r.id: cap for r, cap in zip(todo, captions)})
      cfg = RubricSynthesisConfig(min_agreement=self.config.rubrics.min_agreement)
      outcomes = (
        _first_process_then_others(lambda: store.synthesize(self.setup.judge, jobs, config=cfg), "jaxcap-rubrics") or []
      )
      failed = [o for o in outcomes if o.rubric is None]
      if jax.process_index() == 0:
        print(
          f"rubrics: {len(jobs) - len(failed)} written against the policy's captions in "
          f"{time.perf_counter() - t0:.1f}s, {len(failed)} failed (their captions get no RubiCap reward)"
          + (f", e.g. {failed[0].image_id}: {failed[0].error}" if failed else ""),
          flush=True,
        )
    attach = lambda rs: [dataclasses.replace(r, rubric=store.load(r.id)) for r in rs]
    self.setup.train_records = attach(self.setup.train_records)
    self.setup.eval_records = attach(self.setup.eval_records)

  def evaluate(self, params, phase, step, tag=""):
    """Held-out QA accuracy (every question of each image, caption-only), the run's own reward, and length,
    on greedy captions."""
    records = self.setup.eval_records[: self.config.eval.num_images]
    if not records:
      return {}
    captions, lengths = self.greedy_captions(params, records, self.config.eval.batch_size)
    qa = self.eval_fn(captions, records, step=0)
    own = self.reward_fn(captions, records, step=0)
    # The run's own reward as RL optimises it, length mask included.
    values, in_band = self.length_masked(own)
    metrics = {"eval/qa_accuracy": float(qa.values[qa.valid[:, 0], 0].mean())}
    if own.valid.any(axis=0).all():  # not, e.g. no RubiCap reward before rubrics are written against the policy
      metrics["eval/reward"] = _weighted_mean(values, own.valid, own.weights)
    metrics.update({"eval/length": float(np.mean(lengths)), "eval/words": float(own.caption_lengths.mean())})
    if in_band is not None:
      metrics["eval/length_in_band"] = in_band
    for k, name in enumerate(own.names):
      if own.valid[:, k].any():
        metrics[f"eval/{name}"] = float(values[own.valid[:, k], k].mean())
    self.metrics.write(phase, step, metrics)
    if tag:
      self.summary[f"{phase}_{tag}"] = metrics
      self.summary[f"{phase}_{tag}_samples"] = captions[:3]
      if jax.process_index() == 0:  # for `python -m jaxcap.eval --captioner NAME=jsonl:PATH`
        out = self.workdir / "captions"
        out.mkdir(exist_ok=True)
        with open(out / f"{phase}_{tag}.jsonl", "w") as f:
          for rec, cap in zip(records, captions):
            f.write(json.dumps({"id": rec.id, "caption": cap}) + "\n")
    if jax.process_index() == 0:
      from tqdm.auto import tqdm

      tqdm.write(f"eval {phase} step {step}: " + ", ".join(f"{k}={v:.4g}" for k, v in metrics.items()))
    return metrics

  def finish(self, params):
    if jax.process_index() == 0 and self.metrics.path.exists():
      plot_curves(self.metrics.path, self.workdir / "curves.png")
    if self.config.export.hf:
      model = nnx.merge(self.graphdef, params)
      src = self.config.model.checkpoint or str(self.workdir / "tokenizer")
      save_hf_checkpoint(model, self.workdir / "export", tokenizer_dir=src)
    (self.workdir / "summary.json").write_text(json.dumps(self.summary, indent=2, default=_jsonable))
    self.metrics.close()
    self.ckpt.close()


def _weighted_mean(values: np.ndarray, valid: np.ndarray, weights: np.ndarray) -> float:
  """Mean over captions of the weighted reward, each dimension averaged over its valid entries only."""
  means = np.array([values[valid[:, k], k].mean() if valid[:, k].any() else 0.0 for k in range(values.shape[1])])
  return float(means @ np.asarray(weights))


def _jsonable(x):
  if isinstance(x, (np.integer, np.floating)):
    return x.item()
  if isinstance(x, np.ndarray):
    return x.tolist()
  raise TypeError(f"not JSON serialisable: {type(x)}")


def _progress(total, initial, desc):
  from tqdm.auto import tqdm

  return tqdm(total=total, initial=initial, desc=desc, disable=jax.process_index() != 0, dynamic_ncols=True)
