"""One of the 2 processes of tests/sampling/test_sampling_multiprocess.py (a helper script, not a test file).

    python multiprocess_worker.py OUT.json PROCESS_ID PORT IMAGES

Each process holds 2 devices and 2 of the 4 image prompts (native sizes, so the processes' buckets differ), and
runs both samplers under a mesh over all 4 devices; writes what it checked.

- The static sampler (`static_rows`, mesh 'fsdp' over the 4 devices, G = 2 samples at temperature 1), with
  `multihost_utils.process_allgather` made to raise while it samples and decodes: the captions have to come from
  this process's own shards. Checked against the global arrays (gathered only here, for the check): this process's
  block of the global batch holds its prompts, and its tokens, lengths and captions are that block's; greedy
  rollouts of the global batch equal each prompt decoded alone, unpadded, on this process's own device. Also:
  the update's prompts and rollout arrays derived on device (2 micro-batches) equal the host path's uploads.
- The paged engine (`paged_rows`, mesh 'data' over the 4 devices: each device decodes one prompt): the global
  arrays' block of this process holds its rows, and its greedy and sampled tokens (and lengths) equal its rows of
  the one-device engine's rollouts of all 4 prompts.
"""

import json
import os
import sys

import jax
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from PIL import Image

import jaxcap.models as M
from jaxcap.data.records import ImageRecord
from jaxcap.processing import Processor, word_tokenizer
from jaxcap.sampling import Sampler, SamplingConfig
from jaxcap.sampling.engine import EngineConfig, PagedSampler
from jaxcap.sampling.mesh_shards import on
from jaxcap.sampling.scheduler import generate
from jaxcap.sharding import make_mesh
from jaxcap.train.rollouts.batching import Batcher
from jaxcap.config_files import base_config

PROMPT = "describe the image in detail . a red blue green square circle triangle"
SIZES = [(40, 60), (70, 50), (120, 100), (30, 30)]  # process 1's images take more patches and tokens
ROWS, G, M_MICRO = len(SIZES), 2, 2
PER = ROWS // 2  # prompts per process
NEW = 6
ENGINE = EngineConfig(slots=2, page_size=4, segment_steps=2)


def write_images(directory):
  """The 4 images, written once by the test (a record's prompt depends on its path: all read the same files)."""
  os.makedirs(directory, exist_ok=True)
  for i, (h, w) in enumerate(SIZES):
    Image.fromarray((np.random.RandomState(i).rand(h, w, 3) * 255).astype(np.uint8)).save(f"{directory}/{i}.png")


def setup(directory):
  """(config, model, processor, records) shared by both checks."""
  cfg = M.tiny()
  processor = Processor(word_tokenizer(PROMPT.split(), cfg), cfg)
  config = base_config()
  config.data.prompt, config.data.image_size = PROMPT, 0  # native sizes
  records = [ImageRecord(id=str(i), image=f"{directory}/{i}.png") for i in range(ROWS)]
  return config, M.Qwen25VL(cfg, rngs=nnx.Rngs(0)), processor, records


def static_rows(config, model, processor, records):
  mine = records[jax.process_index() * PER : (jax.process_index() + 1) * PER]
  mesh = make_mesh({"fsdp": -1})
  batcher = Batcher(processor, config, mesh)
  with jax.set_mesh(mesh):
    sampler = Sampler(model, processor=processor, sampling=SamplingConfig(temperature=1.0, max_new_tokens=NEW))
    inputs = batcher.inputs(mine)
    bucketed = sampler.bucket(inputs)
    placed = sampler.place(bucketed)

    allgather = multihost_utils.process_allgather

    def refuse(*args, **kw):
      raise AssertionError("process_allgather called while sampling")

    multihost_utils.process_allgather = refuse
    try:
      rollouts = sampler(placed, jax.random.key(3), num_samples=G)
      text, tokens, lengths = rollouts.text, np.asarray(rollouts.tokens), np.asarray(rollouts.lengths)
    finally:
      multihost_utils.process_allgather = allgather
    assert isinstance(rollouts.arrays.tokens, jax.Array) and rollouts.arrays.tokens.shape[0] == ROWS * G
    lo = placed.first_row
    global_ids = allgather(placed.prompts.input_ids, tiled=True)
    local_length = bucketed.prompts.length
    np.testing.assert_array_equal(global_ids[lo : lo + PER, -local_length:], bucketed.prompts.input_ids)
    block = slice(lo * G, (lo + PER) * G)
    all_tokens, all_lengths = (allgather(x, tiled=True) for x in (rollouts.arrays.tokens, rollouts.arrays.lengths))
    np.testing.assert_array_equal(tokens, all_tokens[block])
    np.testing.assert_array_equal(lengths, all_lengths[block])
    rows = [t[:n] for t, n in zip(all_tokens[block], all_lengths[block])]
    assert text == processor.tokenizer.batch_decode(rows, skip_special_tokens=True)

    got, _ = batcher.prompt_batch(placed, M_MICRO)
    want, _ = batcher.prompts(inputs, M_MICRO)
    derived = batcher.rollout_batch(rollouts.arrays, placed, G, M_MICRO)
    host = [batcher.micro(x, M_MICRO) for x in (tokens, np.asarray(rollouts.completion_mask), rollouts.policy_logprobs)]
    pairs = [(getattr(got, f), getattr(want, f)) for f in ("ids", "positions", "mask", "pixel_values")]
    for a, b in pairs + list(zip(derived, host)):
      assert a.shape == b.shape and a.sharding.is_equivalent_to(b.sharding, a.ndim), (a.shape, b.shape)
      np.testing.assert_array_equal(allgather(a, tiled=True), allgather(b, tiled=True))
    greedy = Sampler(model, processor=processor, sampling=SamplingConfig(temperature=0.0, max_new_tokens=4))
    greedy_tokens = np.asarray(greedy(placed, jax.random.key(0)).tokens)
  stops = {processor.cfg.eos_token_id}
  for r, record in enumerate(mine):
    alone = batcher.inputs([record])
    ids, pos, mask = alone.input_ids, alone.positions, alone.attention_mask
    want = []
    for k in range(4):
      logits, _ = model(ids, pos, mask, alone.vision())
      want.append(int(np.argmax(np.asarray(logits[0, -1]))))
      if want[-1] in stops:
        break
      ids = np.concatenate([ids, [[want[-1]]]], 1)
      pos = np.concatenate([pos, pos[:, :, -1:] + 1], 2)
      mask = np.concatenate([mask, [[True]]], 1)
    np.testing.assert_array_equal(greedy_tokens[r, : len(want)], want)
  return {"first_row": lo, "text": text, "tokens": tokens.tolist(), "lengths": lengths.tolist()}


def one_device(sampler, inputs, sampling):
  """The one-device engine (`scheduler.generate` on this process's first device) on `inputs`: tokens [B * G, N]."""
  batch = sampler.bucket(inputs)
  kw = dict(graphdef=sampler.graphdef, cfg=sampler.cfg, engine=ENGINE, sampling=sampling, num_samples=G)
  with on(jax.local_devices()[0]):
    arrays = generate(sampler.params, [batch], jax.random.key(3), pad_id=sampler.pad_id, **kw)
    return np.asarray(arrays.tokens), np.asarray(arrays.lengths)


def paged_rows(config, model, processor, records):
  batcher = Batcher(processor, config, None)
  mine = records[PER * jax.process_index() : PER * (jax.process_index() + 1)]
  result = {}
  with jax.set_mesh(make_mesh({"data": -1})):
    sampler = PagedSampler(model, processor=processor, engine=ENGINE)
    for name, temperature in (("greedy", 0.0), ("sampled", 1.0)):
      sampling = SamplingConfig(temperature=temperature, max_new_tokens=NEW, stop_ids=())
      r = sampler(batcher.inputs(mine), jax.random.key(3), num_samples=G, sampling=sampling)
      tokens, lengths = np.asarray(r.tokens), np.asarray(r.lengths)
      assert r.arrays.tokens.shape[0] == ROWS * G and r.arrays.tokens.sharding.spec[0] == "data"
      every = multihost_utils.process_allgather(r.arrays.tokens, tiled=True)
      lo = PER * jax.process_index() * G
      np.testing.assert_array_equal(every[lo : lo + PER * G], tokens)
      # the one-device engine on all 4 prompts (this process's tokenizer): its rows of them
      want_tokens, want_lengths = one_device(sampler, batcher.inputs(records), sampling)
      result[name] = {
        "tokens": tokens.tolist(),
        "same_tokens": bool(np.array_equal(want_tokens[lo : lo + PER * G], tokens)),
        "same_lengths": bool(np.array_equal(want_lengths[lo : lo + PER * G], lengths)),
      }
    result["text"] = r.text
  return result


def main(out, process_id, port, images):
  jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=int(process_id))
  shared = setup(images)
  result = {"static": static_rows(*shared), "paged": paged_rows(*shared)}
  with open(out, "w") as f:
    json.dump(result, f)
  jax.distributed.shutdown()


if __name__ == "__main__":
  main(*sys.argv[1:])
