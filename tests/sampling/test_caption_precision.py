"""Inference at the checkpoint's own precision (issue 36): the annotator, the sampler, the VQA probe and the
experiments' eval hold a checkpoint's weights in the dtype its config.json states unless told otherwise, and the
annotator checks its estimated peak against the memory available before it loads anything."""

import io
import json
import shutil
from contextlib import redirect_stderr

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from PIL import Image

import jaxcap.checkpoint as checkpoint_lib
import jaxcap.eval.vqa as vqa_lib
import jaxcap.models as M
from jaxcap import caption
from jaxcap.checkpoint import checkpoint_dtype, load_hf_checkpoint
from jaxcap.host_memory import BUDGET, available_memory, parse_bytes
from jaxcap.sampling.footprint import MemoryShortError, check_fits, sampling_footprint
from hf_reference import save_tiny_checkpoint


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  """A tiny float32 checkpoint, the same weights cast to bfloat16 (as transformers saves a bf16 model), and two
  images."""
  import torch

  root = tmp_path_factory.mktemp("precision")
  model = save_tiny_checkpoint(M.tiny(), 0, root / "f32")
  shutil.copytree(root / "f32", root / "bf16")
  model.to(torch.bfloat16).save_pretrained(root / "bf16")
  images = root / "images"
  images.mkdir()
  rng = np.random.RandomState(0)
  for i, (h, w) in enumerate([(56, 56), (56, 84)]):
    Image.fromarray((rng.rand(h, w, 3) * 255).astype(np.uint8)).save(images / f"img{i}.png")
  return root


def _dtypes(model) -> set[str]:
  return {x.dtype.name for x in jax.tree.leaves(nnx.state(model, nnx.Param))}


class _Loaded(Exception):
  """Stops a run right after the checkpoint is loaded."""


def _recording_loader(monkeypatch, seen: list, stop: bool = True):
  """Wraps load_hf_checkpoint (as the inference paths import it) to record the loaded params' dtypes."""
  real = checkpoint_lib.load_hf_checkpoint

  def load(*args, **kw):
    model = real(*args, **kw)
    seen.append(_dtypes(model))
    if stop:
      raise _Loaded
    return model

  monkeypatch.setattr(checkpoint_lib, "load_hf_checkpoint", load)


def _caption_args(root, ckpt, out, *extra):
  return [
    *("--checkpoint", str(root / ckpt), "--images", str(root / "images"), "--out", str(out)),
    *("--batch_size", "2", "--max_new_tokens", "4", "--prompt", "describe the image .", "--no_progress", *extra),
  ]


def test_checkpoint_dtype_is_the_stored_one_unless_overridden(setup, tmp_path):
  assert checkpoint_dtype(setup / "f32") == jnp.float32
  assert checkpoint_dtype(setup / "bf16") == jnp.bfloat16
  assert checkpoint_dtype(setup / "bf16", "float32") == jnp.float32
  assert checkpoint_dtype(setup / "f32", "bfloat16") == jnp.bfloat16
  assert checkpoint_dtype(setup / "bf16", "checkpoint") == jnp.bfloat16
  base = json.loads((setup / "f32" / "config.json").read_text())
  for stored, held in [({"torch_dtype": "bfloat16"}, jnp.bfloat16), ({"dtype": "float16"}, jnp.float32), ({}, None)]:
    cfg = {k: v for k, v in base.items() if k != "dtype"} | stored
    cfg["text_config"] = {k: v for k, v in cfg["text_config"].items() if k != "dtype"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert checkpoint_dtype(tmp_path) == (held or jnp.float32), stored
  with pytest.raises(ValueError, match="float16"):
    checkpoint_dtype(setup / "f32", "float16")
  # the loader's own default is the checkpoint's dtype too; training passes its float32 masters explicitly
  assert _dtypes(load_hf_checkpoint(setup / "bf16")) == {"bfloat16"}
  assert _dtypes(load_hf_checkpoint(setup / "bf16", param_dtype=jnp.float32)) == {"float32"}


def test_annotator_holds_the_weights_in_the_checkpoints_dtype(setup, tmp_path, monkeypatch):
  seen = []
  _recording_loader(monkeypatch, seen)
  for ckpt, extra in [("bf16", ()), ("f32", ()), ("bf16", ("--dtype", "float32")), ("f32", ("--dtype", "bfloat16"))]:
    with pytest.raises(_Loaded):
      caption.main(_caption_args(setup, ckpt, tmp_path / f"{ckpt}{len(seen)}.jsonl", *extra))
  assert seen == [{"bfloat16"}, {"float32"}, {"float32"}, {"bfloat16"}]


def test_sampler_probe_and_experiments_load_at_the_checkpoints_dtype(setup, monkeypatch):
  from jaxcap.eval.vqa_probe import probe_options, run_probe
  from jaxcap.experiments.suite import vqa_metric
  from jaxcap.sampling import Sampler

  floats = lambda s: {x.dtype.name for x in jax.tree.leaves(s.params) if jnp.issubdtype(x.dtype, jnp.floating)}
  assert floats(Sampler.from_checkpoint(setup / "bf16")) == {"bfloat16"}
  assert floats(Sampler.from_checkpoint(setup / "bf16", param_dtype="float32")) == {"float32"}

  seen = []

  def scores(model, *args, **kw):
    seen.append(_dtypes(model))
    raise _Loaded

  monkeypatch.setattr(vqa_lib, "vqa_scores", scores)
  for options in [{"checkpoints": f"a={setup / 'bf16'}"}, {"checkpoints": f"a={setup / 'bf16'}", "dtype": "float32"}]:
    with pytest.raises(_Loaded):
      run_probe(options, [])
  with pytest.raises(_Loaded):
    vqa_metric(setup / "bf16", [], 0)
  assert seen == [{"bfloat16"}, {"float32"}, {"bfloat16"}]
  with pytest.raises(ValueError, match="vqa_probe.dtype"):
    probe_options({"dtype": "half"})


def test_bf16_captions_equal_captions_forced_to_bf16(setup, tmp_path):
  rows = {}
  for name, extra in [("default", ()), ("forced", ("--dtype", "bfloat16"))]:
    out = tmp_path / f"{name}.jsonl"
    assert caption.main(_caption_args(setup, "bf16", out, *extra)) == 0
    rows[name] = [json.loads(line) for line in out.read_text().splitlines()]
  assert [r["id"] for r in rows["default"]] == ["img0.png", "img1.png"]
  assert rows["default"] == rows["forced"]


def test_too_small_a_budget_fails_before_loading_with_the_numbers_and_the_fix(setup, tmp_path, monkeypatch):
  seen = []
  _recording_loader(monkeypatch, seen)
  monkeypatch.setenv(BUDGET, "1MiB")
  err = io.StringIO()
  out = tmp_path / "captions.jsonl"
  with redirect_stderr(err):
    assert caption.main(_caption_args(setup, "f32", out)) == 2
  lines = [line for line in err.getvalue().splitlines() if line.startswith("error:")]
  assert len(lines) == 1, err.getvalue()
  line = lines[0]
  assert "jaxcap.caption needs about" in line and "params" in line and "in float32" in line and "KV cache" in line
  assert "but 0.00 GiB is available (JAXCAP_MEMORY_BUDGET)" in line
  # nothing fits a MiB: no flag is offered, only more memory
  assert "--dtype" not in line and "--batch_size 1" not in line and "--max_pixels" not in line
  assert "a machine with more memory" in line and f"{BUDGET}=off" in line
  assert "for 2 rows x" in line  # --batch_size's
  err = io.StringIO()
  with redirect_stderr(err):  # the paged engine: the KV cache of one device's --slots
    assert caption.main(_caption_args(setup, "f32", out, "--engine", "paged", "--slots", "1")) == 2
  assert "for 1 rows x" in err.getvalue(), err.getvalue()
  assert seen == [] and not out.exists()  # nothing loaded, nothing written
  monkeypatch.setenv(BUDGET, "off")  # the check can be turned off: the run reaches the load
  with pytest.raises(_Loaded):
    caption.main(_caption_args(setup, "f32", out))


def test_footprint_counts_the_real_params_and_cache_and_names_what_fits(setup):
  from jaxcap.models.qwen25vl import KVCache

  cfg = M.tiny()
  for ckpt in ("f32", "bf16"):
    model = load_hf_checkpoint(setup / ckpt)
    c = model.cfg
    f = sampling_footprint(c, rows=3, prompt_tokens=40, max_new_tokens=8, vision_patches=16)
    assert f.params == sum(x.nbytes for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert f.rows == 4 and f.slots == 48  # rows padded to a power of two, as the sampler's buckets
    assert f.kv_cache == sum(x.nbytes for x in jax.tree.leaves(KVCache.zeros(c, 4, 48)))
  kw = dict(prompt_tokens=40, max_new_tokens=8, vision_patches=16)
  one, four = sampling_footprint(cfg, 1, **kw), sampling_footprint(cfg, 4, **kw)
  assert check_fits(cfg, (four.total, "test"), rows=4, **kw) == four
  assert check_fits(cfg, None, rows=4, **kw) == four  # no figure: no check
  with pytest.raises(MemoryShortError, match=r"--batch_size 1 \(") as e:
    check_fits(cfg, (one.total, "test"), rows=4, **kw)
  assert "--dtype bfloat16" in str(e.value) and "(test)" in str(e.value)
  with pytest.raises(MemoryShortError, match=r"--slots 1 \("):  # the paged engine's rows
    check_fits(cfg, (one.total, "test"), rows=4, rows_flag="--slots", **kw)
  with pytest.raises(MemoryShortError) as e:  # bf16 already: no dtype to suggest
    check_fits(cfg.replace(dtype=jnp.bfloat16, param_dtype=jnp.bfloat16), (1, "test"), rows=4, **kw)
  assert "--dtype" not in str(e.value) and "--batch_size" not in str(e.value)


def test_available_memory_reads_the_budget_override_and_the_machine():
  assert available_memory({BUDGET: "12GiB"}) == (12 * 1024**3, BUDGET)
  assert available_memory({BUDGET: "off"}) is None
  assert parse_bytes("512M") == parse_bytes("512MiB") == 512 * 1024**2 and parse_bytes("100") == 100
  with pytest.raises(ValueError, match=BUDGET):
    parse_bytes("lots")
  found = available_memory({})
  assert found is not None and found[0] > 0  # /proc/meminfo on Linux


def test_hub_layout_builder_writes_a_checkpoint_both_loaders_read(tmp_path):
  """benchmarks.real_shape_memory's random checkpoints (here at tiny shapes): the Hub's key layout in shards, bf16,
  read whole by transformers and by jaxcap, which holds it in bf16."""
  import torch
  import transformers

  from benchmarks.real_shape_memory import build_checkpoint

  directory = build_checkpoint(M.tiny(), tmp_path / "ckpt", shards=2)
  index = json.loads((directory / "model.safetensors.index.json").read_text())["weight_map"]
  assert len(set(index.values())) == 2 and any(k.startswith("model.language_model.layers.") for k in index)
  ref, info = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
    directory, output_loading_info=True, dtype="auto"
  )
  assert not info["missing_keys"] and not info["unexpected_keys"] and ref.dtype == torch.bfloat16
  ours = load_hf_checkpoint(directory)
  assert _dtypes(ours) == {"bfloat16"}
  np.testing.assert_array_equal(
    np.asarray(ours.embed_tokens.embedding[...], np.float32),
    ref.model.language_model.embed_tokens.weight.detach().float().numpy(),
  )
