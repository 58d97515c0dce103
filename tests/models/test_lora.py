"""LoRA / QLoRA through qwix (jaxcap.models.lora): zero adapters are the base model bit for bit, the adapters'
gradients are the full model's projected on them, only adapters reach the optimizer, the merged export is what
transformers computes, and the adapters lie by their kernels' sharding rules."""

import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file
import jax
import jax.numpy as jnp
from flax import nnx

import jaxcap.models as M
from jaxcap.checkpoint import load_hf_checkpoint, save_hf_checkpoint
from jaxcap.models import lora
from jaxcap.models.qwen25vl import Qwen25VL
from jaxcap.processing import Processor
from jaxcap.sharding import make_mesh, param_logical_axes, param_shardings, reshard
from jaxcap.train.steps.accumulate import accumulate, apply_update
from jaxcap.config.training import Optim
from jaxcap.train.steps.state import init_train_state, make_optimizer
from hf_reference import hf_inputs, save_tiny_checkpoint

RANK, ALPHA = 4, 8.0


def _text_inputs(batch=2, length=7):
  ids = jax.random.randint(jax.random.key(1), (batch, length), 3, 200)
  positions = jnp.broadcast_to(jnp.arange(length)[None, None], (3, batch, length))
  return ids, positions, jnp.ones((batch, length), bool)


def _logits(graphdef, params, inputs):
  return jax.jit(lambda p: nnx.merge(graphdef, p)(*inputs)[0])(params)


def _with_b(params, value_seed=0, scale=0.05):
  """`params` with every adapter B drawn at random (nonzero adapters)."""
  key = jax.random.key(value_seed)

  def one(path, x):
    name = ".".join(str(getattr(k, "key", k)) for k in path)
    if "_lora_b" not in name:
      return x
    return scale * jax.random.normal(jax.random.fold_in(key, hash(name) % 2**31), x.shape, x.dtype)

  return jax.tree_util.tree_map_with_path(one, params)


@pytest.fixture(scope="module")
def tiny():
  model = Qwen25VL(M.tiny(), rngs=nnx.Rngs(0))
  base_graphdef, base_params = nnx.split(model)
  adapted = lora.apply_lora(nnx.clone(model), rank=RANK, alpha=ALPHA, seed=3)
  graphdef, params = nnx.split(adapted)
  return base_graphdef, base_params, graphdef, params


def test_zero_adapters_give_the_base_logits_bit_for_bit(tiny):
  base_graphdef, base_params, graphdef, params = tiny
  inputs = _text_inputs()
  base = _logits(base_graphdef, base_params, inputs)
  assert np.array_equal(np.asarray(_logits(graphdef, params, inputs)), np.asarray(base))
  # nonzero adapters change the logits; switching them off (B = 0) is the base again, exactly
  trained = _with_b(params)
  assert float(jnp.abs(_logits(graphdef, trained, inputs) - base).max()) > 1e-3
  assert np.array_equal(np.asarray(_logits(graphdef, lora.adapters_off(trained), inputs)), np.asarray(base))


def test_adapters_cover_the_decoder_projections_only(tiny):
  *_, params = tiny
  names = {
    ".".join(str(getattr(k, "key", k)) for k in p[:-1])
    for p, _ in jax.tree_util.tree_leaves_with_path(nnx.state(nnx.merge(tiny[2], params), nnx.LoRAParam))
  }
  cfg = M.tiny().text
  want = {f"layers.{m}.{n}.kernel_lora_{ab}" for m, ns in [("self_attn", "qkvo"), ("mlp", None)] for n in (
    [f"{c}_proj" for c in ns] if ns else ["gate_proj", "up_proj", "down_proj"]) for ab in "ab"}  # fmt: skip
  assert {n.removesuffix(".value") for n in names} == want
  a = params["layers"]["self_attn"]["q_proj"]["kernel_lora_a"][...]
  b = params["layers"]["self_attn"]["q_proj"]["kernel_lora_b"][...]
  assert a.shape == (cfg.num_hidden_layers, cfg.hidden_size, RANK) and a.dtype == jnp.float32
  assert b.shape == (cfg.num_hidden_layers, RANK, cfg.num_attention_heads * cfg.head_dim)
  assert not np.any(np.asarray(b)) and np.all(np.asarray(jnp.abs(a).sum(axis=1)) > 0)
  assert lora.adapter_count(params) == sum(
    x.size for x in jax.tree.leaves(nnx.state(nnx.merge(tiny[2], params), nnx.LoRAParam))
  )


def test_adapter_gradients_are_the_full_gradient_projected(tiny):
  """With W' = W + s A B: dL/dA = s dL/dW' B^T and dL/dB = s A^T dL/dW' (chain rule), dL/dW' from the merged
  plain model's full gradient."""
  base_graphdef, base_params, graphdef, params = tiny
  params = _with_b(params, 1)
  inputs = _text_inputs()
  target = jax.random.normal(jax.random.key(5), (2, 7, M.tiny().text.vocab_size))
  loss = lambda logits: jnp.sum(jnp.tanh(logits) * target)

  trainable, frozen = lora.split_trainable(params)
  grads = jax.jit(jax.grad(lambda t: loss(nnx.merge(graphdef, lora.join(t, frozen))(*inputs)[0])))(trainable)
  merged = nnx.state(nnx.merge(base_graphdef, base_params))
  nnx.replace_by_pure_dict(merged, lora.merged_pure(nnx.merge(graphdef, params)))
  full = jax.jit(jax.grad(lambda p: loss(nnx.merge(base_graphdef, p)(*inputs)[0])))(merged)
  s = ALPHA / RANK
  for group, name in [("self_attn", "q_proj"), ("self_attn", "v_proj"), ("mlp", "down_proj")]:
    g_w = np.asarray(full["layers"][group][name]["kernel"][...], np.float64)
    a = np.asarray(params["layers"][group][name]["kernel_lora_a"][...], np.float64)
    b = np.asarray(params["layers"][group][name]["kernel_lora_b"][...], np.float64)
    want_a = s * g_w @ b.transpose(0, 2, 1)
    want_b = s * a.transpose(0, 2, 1) @ g_w
    got_a = np.asarray(grads["layers"][group][name]["kernel_lora_a"][...])
    got_b = np.asarray(grads["layers"][group][name]["kernel_lora_b"][...])
    np.testing.assert_allclose(got_a, want_a, rtol=2e-3, atol=2e-5 * np.abs(want_a).max(), err_msg=name)
    np.testing.assert_allclose(got_b, want_b, rtol=2e-3, atol=2e-5 * np.abs(want_b).max(), err_msg=name)


def test_only_adapters_have_optimizer_state_and_move(tiny):
  _, _, graphdef, params = tiny
  opt = make_optimizer(Optim(1e-2, weight_decay=0.01), 10)
  state = init_train_state(params, opt, jax.random.key(0))
  moment_paths = [
    ".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in p)
    for p, x in jax.tree_util.tree_leaves_with_path(state.opt_state)
    if x.ndim >= 1
  ]
  assert moment_paths and all("_lora_" in p for p in moment_paths), moment_paths[:5]
  assert sum(x.size for x in jax.tree.leaves(state.opt_state)) <= 2 * lora.adapter_count(params) + 8

  inputs = _text_inputs()

  def loss_fn(p, mb):
    logits = nnx.merge(graphdef, p)(mb, *inputs[1:])[0]
    return -jnp.mean(jax.nn.log_softmax(logits)[..., 0]), {}

  @jax.jit
  def step(state):
    loss, _, grads = accumulate(loss_fn, state.params, inputs[0][None], jnp.ones((1,)))
    return apply_update(state, grads, opt, loss=loss), grads

  (new, _), grads = step(state)
  assert all(
    "_lora_" in ".".join(str(getattr(k, "key", k)) for k in p) for p, _ in jax.tree_util.tree_leaves_with_path(grads)
  )
  before, after = lora.split_trainable(state.params), lora.split_trainable(new.params)
  jax.tree.map(np.testing.assert_array_equal, after[1], before[1])  # the base: bit for bit
  b_moved = [
    float(jnp.abs(x).max())
    for p, x in jax.tree_util.tree_leaves_with_path(after[0])
    if "_lora_b" in ".".join(str(getattr(k, "key", k)) for k in p)
  ]
  assert min(b_moved) > 0  # every B left zero


def test_base_trained_under_held_adapters_is_full_fine_tuning(tiny):
  """`trains_base` (the embedded student's SFT under LoRA): the base gets the plain model's optimizer state and
  update to float rounding (zero B adds exactly 0 to every output and input gradient), the adapters stay as made."""
  base_graphdef, base_params, graphdef, params = tiny
  opt = make_optimizer(Optim(1e-2, weight_decay=0.01), 10)
  inputs = _text_inputs()

  def step_of(gd):
    def loss_fn(p, mb):
      logits = nnx.merge(gd, p)(mb, *inputs[1:])[0]
      return -jnp.mean(jax.nn.log_softmax(logits)[..., 0]), {}

    def step(state):
      loss, _, grads = accumulate(loss_fn, state.params, inputs[0][None], jnp.ones((1,)), trains_base=state.trains_base)
      return apply_update(state, grads, opt, loss=loss)[0]

    return jax.jit(step)

  state = init_train_state(params, opt, jax.random.key(0), trains_base=True)
  assert state.trains_base and not any(
    "_lora_" in str(p) for p, _ in jax.tree_util.tree_leaves_with_path(state.opt_state)
  )
  new = step_of(graphdef)(state)
  plain = step_of(base_graphdef)(init_train_state(base_params, opt, jax.random.key(0)))
  adapters, base = lora.split_trainable(new.params)
  jax.tree.map(np.testing.assert_array_equal, adapters, lora.split_trainable(params)[0])  # held: A and zero B
  want = nnx.to_pure_dict(plain.params)
  got = nnx.to_pure_dict(base)
  moved = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), want, nnx.to_pure_dict(base_params))
  assert max(jax.tree.leaves(moved)) > 1e-3
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7), got, want)


def test_adapter_sharding_follows_the_kernel_rules():
  assert param_logical_axes("layers.self_attn.q_proj.kernel_lora_a.value", 3) == (None, "embed", None)
  assert param_logical_axes("layers.self_attn.q_proj.kernel_lora_b", 3) == (None, None, "heads")
  assert param_logical_axes("layers.mlp.down_proj.kernel_lora_a", 3) == (None, "mlp", None)
  assert param_logical_axes("0.mu.layers.mlp.down_proj.kernel_lora_b", 3) == (None, None, "embed")
  assert param_logical_axes("layers.mlp.up_proj.kernel.array.qvalue", 3) == (None, "embed", "mlp")


def test_sharded_lora_forward_matches_unsharded(tiny):
  _, _, graphdef, params = tiny
  params = _with_b(params, 2)
  inputs = _text_inputs(batch=4)
  want = _logits(graphdef, params, inputs)
  mesh = make_mesh({"fsdp": 2, "tensor": 2}, jax.devices()[:4])
  placed = reshard(params, param_shardings(params, mesh))
  b = placed["layers"]["mlp"]["up_proj"]["kernel_lora_b"][...]
  assert b.sharding.spec[-1] == "tensor"
  with jax.set_mesh(mesh):
    got = _logits(graphdef, placed, inputs)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("qtype", ["int8", "nf4"])
def test_qlora_quantizes_the_base_and_merges(tiny, qtype):
  base_graphdef, base_params, _, _ = tiny
  model = nnx.merge(base_graphdef, base_params)
  q = lora.apply_lora(nnx.clone(model), rank=RANK, alpha=ALPHA, weight_qtype=qtype)
  graphdef, params = nnx.split(q)
  qv = params["layers"]["mlp"]["up_proj"]["kernel"]["array"]["qvalue"][...]
  assert qv.dtype == {"int8": jnp.int8, "nf4": jnp.uint4}[qtype]
  inputs = _text_inputs()
  base = _logits(base_graphdef, base_params, inputs)
  got = _logits(graphdef, _with_b(params, 3), inputs)
  # the merged (dequantized + adapters) plain model computes what the quantized one does, up to rounding
  merged = nnx.state(model)
  nnx.replace_by_pure_dict(merged, lora.merged_pure(nnx.merge(graphdef, _with_b(params, 3))))
  np.testing.assert_allclose(np.asarray(_logits(base_graphdef, merged, inputs)), np.asarray(got), atol=1e-4)
  # and quantization moved the base's logits, but not far (int8 closer than nf4)
  err = float(jnp.abs(_logits(graphdef, params, inputs) - base).max())
  assert 0 < err < {"int8": 0.05, "nf4": 0.5}[qtype]


def test_merged_export_loads_in_transformers_with_the_same_logits(tmp_path):
  src = tmp_path / "src"
  save_tiny_checkpoint(M.tiny(), 4, src)
  model = lora.apply_lora(load_hf_checkpoint(src), rank=RANK, alpha=ALPHA, seed=1)
  graphdef, params = nnx.split(model)
  model = nnx.merge(graphdef, _with_b(params, 4))
  out = save_hf_checkpoint(model, tmp_path / "export", tokenizer_dir=src)
  back = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(out, attn_implementation="eager").float()
  proc = Processor.from_pretrained(out)
  img = (np.random.RandomState(0).rand(84, 112, 3) * 255).astype(np.uint8)
  batch = proc(
    [[{"role": "user", "content": [{"type": "image", "image": img}, {"type": "text", "text": "describe the image ."}]}]]
  )
  with torch.no_grad():
    want = back.eval()(**hf_inputs(batch, proc.cfg), position_ids=torch.as_tensor(batch.positions)).logits.numpy()
  args = (jnp.asarray(batch.input_ids), jnp.asarray(batch.positions), jnp.asarray(batch.attention_mask), batch.vision())
  got, _ = model(*args)
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-4, rtol=0)
  # the adapters moved the logits well beyond the tolerance, so the test sees them
  base = load_hf_checkpoint(src)
  plain, _ = base(*args)
  assert float(np.abs(np.asarray(plain) - want).max()) > 1e-2


def test_adapters_are_float32_and_keep_the_compute_dtype():
  """bfloat16 base and compute: the adapters are float32 (qwix would make them the base's dtype), and an adapted
  layer's output stays bfloat16 (a float32 delta would promote every activation after it)."""
  import dataclasses

  cfg = dataclasses.replace(M.tiny(), dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
  model = lora.apply_lora(Qwen25VL(cfg, rngs=nnx.Rngs(0)), rank=RANK, alpha=ALPHA)
  assert {x.dtype for x in jax.tree.leaves(nnx.state(model, nnx.LoRAParam))} == {jnp.dtype(jnp.float32)}
  assert model.layers.mlp.up_proj.kernel[...].dtype == jnp.bfloat16
  graphdef, params = nnx.split(model)
  ids, positions, mask = _text_inputs()
  hidden = jax.eval_shape(lambda p: (m := nnx.merge(graphdef, p)).decode(m.embed(ids), positions, mask)[0], params)
  assert hidden.dtype == jnp.bfloat16


@pytest.mark.slow  # three compiles of the Qwen3-VL forward
def test_qwen3vl_with_vision_adapters_starts_from_the_base():
  """The other student family, adapters on the vision tower's and merger's Linears too: zero B, the same logits."""
  from jaxcap.models.qwen3vl import Qwen3VL

  model = Qwen3VL(M.qwen3vl_tiny(), rngs=nnx.Rngs(0))
  base_graphdef, base_params = nnx.split(model)
  adapted = lora.apply_lora(
    nnx.clone(model), rank=RANK, alpha=ALPHA, vision=True, targets=lora.LORA_TARGETS + lora.VISION_TARGETS
  )
  graphdef, params = nnx.split(adapted)
  adapted_paths = {
    ".".join(str(getattr(k, "key", k)) for k in p)
    for p, _ in jax.tree_util.tree_leaves_with_path(nnx.state(adapted, nnx.LoRAParam))
  }
  assert any(p.startswith("visual.") for p in adapted_paths) and any(p.startswith("layers.") for p in adapted_paths)
  inputs = _text_inputs()
  base = _logits(base_graphdef, base_params, inputs)
  assert np.array_equal(np.asarray(_logits(graphdef, params, inputs)), np.asarray(base))
  assert float(jnp.abs(_logits(graphdef, _with_b(params), inputs) - base).max()) > 1e-3


def test_peft_adapters_load_on_the_base_in_transformers(tmp_path):
  """The adapters alone in PEFT's layout: peft's PeftModel on the transformers base computes jaxcap's logits."""
  peft = pytest.importorskip("peft")
  from jaxcap.checkpoint.peft import save_peft_adapters

  src = tmp_path / "src"
  save_tiny_checkpoint(M.tiny(), 5, src)
  model = lora.apply_lora(load_hf_checkpoint(src), rank=RANK, alpha=ALPHA, seed=2)
  graphdef, params = nnx.split(model)
  model = nnx.merge(graphdef, _with_b(params, 6))
  out = save_peft_adapters(model, tmp_path / "adapters", base_model=str(src))
  base = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(src, attn_implementation="eager").float()
  back = peft.PeftModel.from_pretrained(base, out).eval()
  proc = Processor.from_pretrained(src)
  img = (np.random.RandomState(1).rand(84, 84, 3) * 255).astype(np.uint8)
  batch = proc(
    [[{"role": "user", "content": [{"type": "image", "image": img}, {"type": "text", "text": "describe the image ."}]}]]
  )
  with torch.no_grad():
    want = back(**hf_inputs(batch, proc.cfg), position_ids=torch.as_tensor(batch.positions)).logits.numpy()
  got, _ = model(
    jnp.asarray(batch.input_ids), jnp.asarray(batch.positions), jnp.asarray(batch.attention_mask), batch.vision()
  )
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-4, rtol=0)
  plain, _ = load_hf_checkpoint(src)(
    jnp.asarray(batch.input_ids), jnp.asarray(batch.positions), jnp.asarray(batch.attention_mask), batch.vision()
  )
  assert float(np.abs(np.asarray(plain) - want).max()) > 1e-2  # the adapters were loaded, not ignored
  adapted = {n.removeprefix("base_model.model.") for n, m in back.named_modules() if hasattr(m, "lora_A")}
  written = {
    k.removeprefix("base_model.model.").rsplit(".lora_", 1)[0] for k in load_file(out / "adapter_model.safetensors")
  }
  assert adapted == written and not any("visual" in n for n in adapted)  # no fresh adapters beside the trained ones
