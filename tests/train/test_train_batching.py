"""The RL loop without needless host trips: the update's prompts and rollout arrays derived on device equal what
the host path uploads (values and shardings); the loader's prefetch yields the same batches, ahead of time, and
resumes at the same place; deferred metrics are the values an eager fetch gives; the launcher's compilation
cache."""

import functools
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from PIL import Image

import jaxcap.models as M
from jaxcap.data.records import ImageRecord
from jaxcap.processing import Processor, word_tokenizer
from jaxcap.sampling import Sampler, SamplingConfig
from jaxcap.sharding import make_mesh
from jaxcap.train.rollouts.batching import Batcher, micro_major
from jaxcap.config_files import base_config
from image_records import random_image_records
from jaxcap.train.rollouts.loader import record_loader
from jaxcap.train.steps.logprobs import completion_logprobs
from jaxcap.train.logs.metrics import PendingMetrics
from jaxcap.train.steps.updates import sequence_logprobs

CFG = M.tiny()
PROMPT = "describe the image in detail ."


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
  records = random_image_records(tmp_path_factory.mktemp("images"), 8)
  config = base_config()
  config.data.prompt, config.data.image_size = PROMPT, 56
  processor = Processor(word_tokenizer(PROMPT.split(), CFG), CFG)
  return records, config, processor, M.Qwen25VL(CFG, rngs=nnx.Rngs(0))


def _same(got, want):
  assert got.shape == want.shape and got.dtype == want.dtype
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  assert got.sharding.is_equivalent_to(want.sharding, got.ndim), (got.sharding, want.sharding)


@pytest.mark.parametrize(
  "rows, num_micro", [(4, 2), (3, 1), pytest.param(6, 3, marks=pytest.mark.slow)]
)  # 3 and 6 rows are padded to buckets 4, 8
def test_device_side_batches_equal_the_host_path(parts, rows, num_micro):
  records, config, processor, model = parts
  mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  batcher, g = Batcher(processor, config, mesh), 2
  with jax.set_mesh(mesh):
    sampler = Sampler(model, processor=processor, sampling=SamplingConfig(max_new_tokens=5))
    inputs = batcher.inputs(records[:rows])
    placed = sampler.place(sampler.bucket(inputs))
    got, got_layout = batcher.prompt_batch(placed, num_micro)
    want, want_layout = batcher.prompts(inputs, num_micro)  # the host path: a second upload of the same prompts
    for name in ("ids", "positions", "mask", "pixel_values"):
      _same(getattr(got, name), getattr(want, name))
    assert got_layout is want_layout  # one layout per shape, uploaded once

    rollouts = sampler(placed, jax.random.key(1), num_samples=g)
    tokens, mask, logprobs = batcher.rollout_batch(rollouts.arrays, placed, g, num_micro)
    _same(tokens, batcher.micro(np.asarray(rollouts.tokens), num_micro))
    _same(mask, batcher.micro(np.asarray(rollouts.completion_mask), num_micro))
    _same(logprobs, batcher.micro(np.asarray(rollouts.policy_logprobs), num_micro))
    assert batcher.rollout_batch(rollouts.arrays, placed, g, num_micro, with_logprobs=False)[2] is None
  assert len(rollouts.text) == rows * g
  np.testing.assert_array_equal(rollouts.host_lengths, np.asarray(rollouts.lengths))
  assert mask.sum() == rollouts.host_lengths.sum() > 0
  batcher.close()


@pytest.mark.slow
def test_mixed_size_micro_batches_score_each_prompt_as_alone(parts, tmp_path):
  """Native sizes (and a video) in one step: each micro-batch's images are gathered from the sampler's pack into
  their own padded pack, and every prompt's completion log-probs equal that prompt run alone, unpadded."""
  _, config, processor, model = parts
  config = config.copy_and_resolve_references()
  config.data.image_size = 0
  sizes = [(40, 60), (120, 100), (30, 30), (70, 50), (56, 140), (84, 84)]
  records = []
  for i, (h, w) in enumerate(sizes):
    path = tmp_path / f"{i}.png"
    Image.fromarray((np.random.RandomState(i).rand(h, w, 3) * 255).astype(np.uint8)).save(path)
    records.append(ImageRecord(id=str(i), image=str(path)))
  frames = []
  for k in range(3):
    frames.append(str(tmp_path / f"f{k}.png"))
    Image.fromarray((np.random.RandomState(10 + k).rand(56, 84, 3) * 255).astype(np.uint8)).save(frames[-1])
  records.insert(2, ImageRecord(id="clip", frames=tuple(frames)))
  records = records[:6]  # 6 prompts (a block of 8 rows), 3 micro-batches of 2
  mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  batcher, num_micro = Batcher(processor, config, mesh), 3
  tokens = np.random.RandomState(0).randint(0, CFG.text.vocab_size, (num_micro, 2, 5)).astype(np.int32)
  graphdef, params = nnx.split(model)
  with jax.set_mesh(mesh):
    inputs = batcher.inputs(records)
    prompts, layouts = batcher.prompts(inputs, num_micro)
    assert layouts.window_index.shape[0] == num_micro
    got = jax.jit(functools.partial(sequence_logprobs, graphdef))(
      params, prompts, layouts, batcher.micro(tokens.reshape(-1, 5), num_micro)
    )
  got = np.asarray(got).reshape(len(records), -1)
  for i, record in enumerate(records):
    alone = batcher.inputs([record])
    want, _ = completion_logprobs(
      model, alone.input_ids, alone.positions, alone.attention_mask, alone.vision(), tokens.reshape(-1, 5)[i : i + 1]
    )
    np.testing.assert_allclose(got[i], np.asarray(want)[0], atol=2e-5, rtol=2e-5, err_msg=f"prompt {i}")
  batcher.close()


@pytest.mark.parametrize("axis", [0, 1])
def test_micro_major_lays_out_processes_like_the_host_upload(axis):
  """Two processes' blocks of 4 rows (3 real) -> micro-batch m = [process 0's m-th slice, process 1's m-th slice],
  the layout `make_array_from_process_local_data` gives every process's [M, rows / M, ...] host batch."""
  procs, block, real, m = 2, 4, 3, 3
  rng = np.random.default_rng(0)
  local = [rng.normal(size=(2, block, 5) if axis else (block, 5)).astype(np.float32) for _ in range(procs)]
  got = micro_major(jnp.asarray(np.concatenate(local, axis)), axis, procs, block, real, m)
  per_process = []
  for x in local:
    x = x[:, :real] if axis else x[:real]
    per_process.append(np.moveaxis(x.reshape(2, m, real // m, 5), 1, 0) if axis else x.reshape(m, real // m, 5))
  np.testing.assert_array_equal(np.asarray(got), np.concatenate(per_process, axis + 1))


def test_prefetching_loader_yields_the_same_batches_ahead_and_resumes():
  records = [ImageRecord(id=str(i), image="x") for i in range(10)]
  main = threading.current_thread()
  threads, second = [], threading.Event()

  def prepare(batch):
    threads.append(threading.current_thread())
    if len(threads) >= 2:
      second.set()
    return [r.id for r in batch]

  plain = record_loader(records, 3, seed=0, process_index=0, process_count=1)
  want = [[r.id for r in next(plain)] for _ in range(9)]  # crosses epoch boundaries
  ahead = record_loader(records, 3, seed=0, process_index=0, process_count=1, prepare=prepare, prefetch=2)
  assert next(ahead) == want[0]
  assert second.wait(10), "the next batch was not prepared ahead of the step that needs it"
  got = [want[0]] + [next(ahead) for _ in range(5)]
  assert got == want[:6]
  assert main not in threads and len(threads) <= 6 + 2  # on the loader's thread, at most `prefetch` ahead
  resumed = record_loader(records, 3, seed=0, process_index=0, process_count=1, prepare=prepare)
  resumed.set_state(ahead.get_state())  # the position of the batches consumed, not of those prepared
  assert [next(resumed) for _ in range(3)] == want[6:9]
  ahead.close()
  resumed.close()


def test_a_global_batch_of_one_prefetches(parts):
  """One record a step, prepared ahead (a first real run's smallest setting): grain once overflowed len() here."""
  records = parts[0][:4]
  plain = record_loader(records, 1, seed=0, process_index=0, process_count=1)
  want = [[r.id for r in next(plain)] for _ in range(6)]
  ahead = record_loader(records, 1, seed=0, process_index=0, process_count=1, prepare=lambda b: [r.id for r in b])
  assert [next(ahead) for _ in range(6)] == want and sorted(sum(want[:4], [])) == sorted(r.id for r in records)
  ahead.close()


def test_pending_metrics_are_the_eager_values_in_order():
  device = {"loss": jnp.float32(0.25), "adv/reward_mean": jnp.arange(2, dtype=jnp.float32), "grad_norm": jnp.ones(())}
  pending = PendingMetrics(device, {"reward/mean": 0.5, "length/mean": 3.0})
  got = pending.result()
  assert list(got) == ["loss", "adv/reward_mean/0", "adv/reward_mean/1", "grad_norm", "reward/mean", "length/mean"]
  assert got == {
    "loss": 0.25,
    "adv/reward_mean/0": 0.0,
    "adv/reward_mean/1": 1.0,
    "grad_norm": 1.0,
    "reward/mean": 0.5,
    "length/mean": 3.0,
  }


def test_compilation_cache_in_the_workdir(monkeypatch, tmp_path):
  from jaxcap.launch import enable_compilation_cache

  updates = []
  monkeypatch.setattr(jax.config, "update", lambda name, value: updates.append((name, value)))
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
  c = base_config()
  c.workdir = str(tmp_path / "run")
  assert enable_compilation_cache(c) == str(tmp_path / "run" / "compile_cache")  # the default
  c.compile_cache = str(tmp_path / "shared")
  assert enable_compilation_cache(c) == str(tmp_path / "shared")
  c.compile_cache = ""
  assert enable_compilation_cache(c) is None  # off
  assert updates == [
    ("jax_compilation_cache_dir", str(tmp_path / "run" / "compile_cache")),
    ("jax_compilation_cache_dir", str(tmp_path / "shared")),
  ]
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "env"))  # as the tests set it: it wins
  c.compile_cache = "compile_cache"
  assert enable_compilation_cache(c) == str(tmp_path / "env") and len(updates) == 2
