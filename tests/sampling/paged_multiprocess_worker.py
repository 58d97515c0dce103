"""One of the 2 processes of tests/sampling/test_paged_mesh.py's multi-process test (a helper script, not a test
file).

    python paged_multiprocess_worker.py OUT.json PROCESS_ID PORT IMAGES

Each process holds 2 devices and 2 image prompts of its own (native sizes, so the processes' buckets differ) and
runs the paged engine under a mesh over all 4 devices: each of its devices decodes one of its prompts. Checks that
the global arrays' block of this process holds its rows, and writes its greedy and sampled tokens and whether they
(and their lengths) equal its rows of the one-device engine's rollouts of all 4 prompts.
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
from jaxcap.sampling import SamplingConfig
from jaxcap.sampling.engine import EngineConfig, PagedSampler
from jaxcap.sampling.mesh_shards import on
from jaxcap.sampling.scheduler import generate
from jaxcap.sharding import make_mesh
from jaxcap.train.batching import Batcher
from jaxcap.train.config import base_config

PROMPT = "describe the image in detail . a red blue green square circle triangle"
SIZES = [(40, 60), (70, 50), (120, 100), (30, 30)]
G, NEW = 2, 6
ENGINE = EngineConfig(slots=2, page_size=4, segment_steps=2)


def write_images(directory):
  """The 4 images, written once by the test (a record's prompt depends on its path: all read the same files)."""
  os.makedirs(directory, exist_ok=True)
  for i, (h, w) in enumerate(SIZES):
    Image.fromarray((np.random.RandomState(i).rand(h, w, 3) * 255).astype(np.uint8)).save(f"{directory}/{i}.png")


def setup(directory):
  """(batcher, model, processor, records) shared by the workers and the test's one-device reference."""
  cfg = M.tiny()
  processor = Processor(word_tokenizer(PROMPT.split(), cfg), cfg)
  config = base_config()
  config.data.prompt, config.data.image_size = PROMPT, 0  # native sizes
  records = [ImageRecord(id=str(i), image=f"{directory}/{i}.png") for i in range(len(SIZES))]
  return Batcher(processor, config, None), M.Qwen25VL(cfg, rngs=nnx.Rngs(0)), processor, records


def rollouts(sampler, inputs):
  got = {}
  for name, temperature in (("greedy", 0.0), ("sampled", 1.0)):
    sampling = SamplingConfig(temperature=temperature, max_new_tokens=NEW, stop_ids=())
    r = sampler(inputs, jax.random.key(3), num_samples=G, sampling=sampling)
    got[name] = (r, np.asarray(r.tokens).tolist(), np.asarray(r.lengths).tolist())
  return got


def one_device(sampler, inputs, sampling):
  """The one-device engine (`scheduler.generate` on this process's first device) on `inputs`: tokens [B * G, N]."""
  batch = sampler.bucket(inputs)
  kw = dict(graphdef=sampler.graphdef, cfg=sampler.cfg, engine=ENGINE, sampling=sampling, num_samples=G)
  with on(jax.local_devices()[0]):
    arrays = generate(sampler.params, [batch], jax.random.key(3), pad_id=sampler.pad_id, **kw)
    return np.asarray(arrays.tokens), np.asarray(arrays.lengths)


def main(out, process_id, port, images):
  jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=int(process_id))
  batcher, model, processor, all_records = setup(images)
  mine = all_records[2 * jax.process_index() : 2 * jax.process_index() + 2]
  mesh = make_mesh({"data": -1})
  result = {}
  with jax.set_mesh(mesh):
    sampler = PagedSampler(model, processor=processor, engine=ENGINE)
    for name, temperature in (("greedy", 0.0), ("sampled", 1.0)):
      sampling = SamplingConfig(temperature=temperature, max_new_tokens=NEW, stop_ids=())
      r = sampler(batcher.inputs(mine), jax.random.key(3), num_samples=G, sampling=sampling)
      tokens, lengths = np.asarray(r.tokens), np.asarray(r.lengths)
      assert r.arrays.tokens.shape[0] == 4 * G and r.arrays.tokens.sharding.spec[0] == "data"
      every = multihost_utils.process_allgather(r.arrays.tokens, tiled=True)
      lo = 2 * jax.process_index() * G
      np.testing.assert_array_equal(every[lo : lo + 2 * G], tokens)
      # the one-device engine on all 4 prompts (this process's tokenizer): its rows of them
      want_tokens, want_lengths = one_device(sampler, batcher.inputs(all_records), sampling)
      result[name] = {
        "tokens": tokens.tolist(),
        "same_tokens": bool(np.array_equal(want_tokens[lo : lo + 2 * G], tokens)),
        "same_lengths": bool(np.array_equal(want_lengths[lo : lo + 2 * G], lengths)),
      }
    result["text"] = r.text
  with open(out, "w") as f:
    json.dump(result, f)
  jax.distributed.shutdown()


if __name__ == "__main__":
  main(*sys.argv[1:])
