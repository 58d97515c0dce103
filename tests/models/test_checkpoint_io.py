"""HF checkpoint round trip (transformers -> jaxcap -> transformers) and clear errors for bad directories."""

import json
import shutil

import numpy as np
import pytest
import torch
import transformers
import jax
import jax.numpy as jnp
from safetensors.numpy import load_file, save_file

import jaxcap.models as M
from jaxcap.checkpoint import CheckpointError, load_hf_checkpoint, save_hf_checkpoint
from jaxcap.processing import Processor
from hf_reference import hf_inputs, save_tiny_checkpoint


def _batch(proc):
  img = (np.random.RandomState(0).rand(84, 112, 3) * 255).astype(np.uint8)
  return proc(
    [[{"role": "user", "content": [{"type": "image", "image": img}, {"type": "text", "text": "describe the image ."}]}]]
  )


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  directory = tmp_path_factory.mktemp("src")
  ref = save_tiny_checkpoint(M.tiny(), 3, directory)
  return directory, ref


@pytest.mark.parametrize("shard_bytes", [2**30, 40_000], ids=["single_file", "sharded"])
def test_round_trip_gives_identical_tensors_and_logits(checkpoint, tmp_path, shard_bytes):
  src, ref = checkpoint
  model = load_hf_checkpoint(src)
  out = save_hf_checkpoint(model, tmp_path / "out", tokenizer_dir=src, max_shard_bytes=shard_bytes)
  assert (out / "model.safetensors.index.json").exists() == (shard_bytes < 2**30)
  back = (
    transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(out, attn_implementation="eager").float().eval()
  )
  want_sd = {k: v for k, v in ref.state_dict().items()}
  got_sd = back.state_dict()
  assert set(got_sd) == set(want_sd)
  for name, tensor in want_sd.items():
    torch.testing.assert_close(got_sd[name], tensor, rtol=0, atol=0, msg=name)
  proc = Processor.from_pretrained(out)  # tokenizer files were copied
  batch = _batch(proc)
  with torch.no_grad():
    np.testing.assert_array_equal(
      back(**hf_inputs(batch, proc.cfg)).logits.numpy(), ref(**hf_inputs(batch, proc.cfg)).logits.numpy()
    )
  # and the re-exported checkpoint loads back into jaxcap with the same params
  again = load_hf_checkpoint(out)
  want_params, got_params = nnx_params(model), nnx_params(again)
  assert jax.tree.structure(got_params) == jax.tree.structure(want_params)
  jax.tree.map(np.testing.assert_array_equal, got_params, want_params)


def nnx_params(model):
  from flax import nnx

  return nnx.to_pure_dict(nnx.split(model, nnx.Param)[1])


def test_loads_bf16_and_new_style_key_names(checkpoint, tmp_path):
  """Checkpoints written with `model.language_model.` / `model.visual.` keys in bf16 load too."""
  src, _ = checkpoint
  tensors = load_file(src / "model.safetensors")
  renamed = {}
  for k, v in tensors.items():
    k = ("model." + k) if k.startswith("visual.") else k.replace("model.", "model.language_model.", 1)
    renamed[k] = v.astype(jnp.bfloat16)
  dst = tmp_path / "newstyle"
  shutil.copytree(src, dst)
  save_file(renamed, dst / "model.safetensors")
  model = load_hf_checkpoint(dst, param_dtype=jnp.bfloat16)
  ref = load_hf_checkpoint(src)
  got = nnx_params(model)["layers"]["self_attn"]["q_proj"]["kernel"]
  want = nnx_params(ref)["layers"]["self_attn"]["q_proj"]["kernel"]
  assert got.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want).astype(jnp.bfloat16))


@pytest.mark.slow
def test_bf16_forward_close_to_f32(checkpoint):
  src, _ = checkpoint
  proc = Processor.from_pretrained(src)
  batch = _batch(proc)
  args = (jnp.asarray(batch.input_ids), jnp.asarray(batch.positions), jnp.asarray(batch.attention_mask), batch.vision())
  f32, _ = load_hf_checkpoint(src)(*args)
  bf16, _ = load_hf_checkpoint(src, param_dtype=jnp.bfloat16)(*args)
  assert bf16.dtype == jnp.float32  # logits are always f32
  assert np.abs(np.asarray(bf16) - np.asarray(f32)).max() < 0.05 * np.abs(np.asarray(f32)).max()


@pytest.mark.parametrize("layout", ["t", "plain"])
def test_stacked_leaf_is_read_once_into_the_device_array(tmp_path, layout):
  """A stacked [L, ...] leaf is read layer by layer into one 64-byte-aligned host buffer that XLA:CPU adopts as the
  array (no copy): after the load the traced host memory holds the leaf once, and the transient beside it is one
  layer's read, never a second stacked copy."""
  import tracemalloc

  from safetensors import safe_open

  from jaxcap.checkpoint.tensor_read import place_stacked

  layers, rows, cols = 6, 256, 512  # 0.5 MiB a layer in f32
  rng = np.random.default_rng(0)
  stored = {f"l{i}": rng.standard_normal((rows, cols), np.float32) for i in range(layers)}
  save_file(stored, tmp_path / "w.safetensors")
  shape = (layers, cols, rows) if layout == "t" else (layers, rows, cols)
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  with safe_open(tmp_path / "w.safetensors", "numpy") as f:
    tensors = [f.get_slice(f"l{i}") for i in range(layers)]
    tracemalloc.start()  # numpy reports its data buffers; XLA's own allocations are not traced
    try:
      leaf = place_stacked(tensors, layout, shape, np.float32, sharding)
      held, peak = tracemalloc.get_traced_memory()
    finally:
      tracemalloc.stop()
  want = np.stack([w.T if layout == "t" else w for w in stored.values()])
  np.testing.assert_array_equal(np.asarray(leaf), want)
  layer = rows * cols * 4
  assert leaf.nbytes <= held < leaf.nbytes + layer  # the device array is the buffer the layers were read into
  assert peak - held <= 2 * layer + 2**16  # one layer's read (and its transpose) beside it, not a stacked leaf


def test_layers_apart_reads_each_decoder_layer_into_the_decode_layout(checkpoint, monkeypatch):
  """An owning sampler over `load_hf_checkpoint(layers_apart=True)` holds exactly the weights one over the eagerly
  loaded model holds, and no decoder stack was ever read whole (only the vision tower's stacks are)."""
  from jaxcap.checkpoint import hf_load
  from jaxcap.sampling import Sampler

  src, _ = checkpoint
  read_whole = []
  place_stacked = hf_load.place_stacked
  monkeypatch.setattr(hf_load, "place_stacked", lambda t, *a: read_whole.append(len(t)) or place_stacked(t, *a))
  eager = Sampler(load_hf_checkpoint(src), owns_weights=True).params
  eager_reads, read_whole[:] = len(read_whole), []
  lazy = Sampler(load_hf_checkpoint(src, layers_apart=True), owns_weights=True).params
  decoder_leaves = len(jax.tree.leaves(eager.layers[0]))
  assert decoder_leaves > 0 and len(read_whole) == eager_reads - decoder_leaves
  assert jax.tree.structure(lazy) == jax.tree.structure(eager)
  jax.tree.map(np.testing.assert_array_equal, lazy, eager)


def test_not_a_checkpoint_directory(tmp_path):
  with pytest.raises(CheckpointError, match="config.json"):
    load_hf_checkpoint(tmp_path)
  (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 10}))
  with pytest.raises(CheckpointError, match="qwen2_5_vl"):
    load_hf_checkpoint(tmp_path)


@pytest.mark.parametrize("keep", [0.5, 0.0001])  # the data cut short; the header itself cut short
def test_truncated_safetensors_file_is_named(checkpoint, tmp_path, keep):
  src, _ = checkpoint
  dst = tmp_path / "truncated"
  shutil.copytree(src, dst)
  path = dst / "model.safetensors"
  data = path.read_bytes()
  path.write_bytes(data[: max(8, int(len(data) * keep))])
  with pytest.raises(CheckpointError, match=r"truncated/model\.safetensors: cannot read it as safetensors.*download"):
    load_hf_checkpoint(dst)


def test_missing_tensor_is_named(checkpoint, tmp_path):
  src, _ = checkpoint
  dst = tmp_path / "missing"
  shutil.copytree(src, dst)
  tensors = load_file(dst / "model.safetensors")
  del tensors["model.layers.1.mlp.up_proj.weight"]
  save_file(tensors, dst / "model.safetensors")
  with pytest.raises(CheckpointError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
    load_hf_checkpoint(dst)


def test_misshaped_tensor_is_named(checkpoint, tmp_path):
  src, _ = checkpoint
  dst = tmp_path / "misshaped"
  shutil.copytree(src, dst)
  tensors = load_file(dst / "model.safetensors")
  tensors["visual.blocks.2.attn.qkv.weight"] = tensors["visual.blocks.2.attn.qkv.weight"][:-1]
  save_file(tensors, dst / "model.safetensors")
  with pytest.raises(CheckpointError, match=r"visual\.blocks\.2\.attn\.qkv\.weight.*shape"):
    load_hf_checkpoint(dst)
