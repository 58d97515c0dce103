"""One of the 2 processes of tests/sampling/test_paged_mesh.py's multi-process test (a helper script, not a test
file).

    python paged_multiprocess_worker.py OUT.json PROCESS_ID PORT

Each process holds 2 devices and 2 image prompts of its own (native sizes, so the processes' buckets differ) and
runs the paged engine under a mesh over all 4 devices: each of its devices decodes one of its prompts. Checks that
the global arrays' block of this process holds its rows, then writes its greedy and sampled tokens and lengths.
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
from jaxcap.sharding import make_mesh
from jaxcap.train.batching import Batcher
from jaxcap.train.config import base_config

PROMPT = "describe the image in detail . a red blue green square circle triangle"
SIZES = [(40, 60), (70, 50), (120, 100), (30, 30)]
G, NEW = 2, 6
ENGINE = EngineConfig(slots=2, page_size=4, segment_steps=2)


def records(directory):
  os.makedirs(directory, exist_ok=True)
  out = []
  for i, (h, w) in enumerate(SIZES):
    path = f"{directory}/{i}.png"
    Image.fromarray((np.random.RandomState(i).rand(h, w, 3) * 255).astype(np.uint8)).save(path)
    out.append(ImageRecord(id=str(i), image=path))
  return out


def setup(directory):
  """(batcher, model, processor) shared by the workers and the test's one-device reference."""
  cfg = M.tiny()
  processor = Processor(word_tokenizer(PROMPT.split(), cfg), cfg)
  config = base_config()
  config.data.prompt, config.data.image_size = PROMPT, 0  # native sizes
  return Batcher(processor, config, None), M.Qwen25VL(cfg, rngs=nnx.Rngs(0)), processor, records(directory)


def rollouts(sampler, inputs):
  got = {}
  for name, temperature in (("greedy", 0.0), ("sampled", 1.0)):
    sampling = SamplingConfig(temperature=temperature, max_new_tokens=NEW, stop_ids=())
    r = sampler(inputs, jax.random.key(3), num_samples=G, sampling=sampling)
    got[name] = (r, np.asarray(r.tokens).tolist(), np.asarray(r.lengths).tolist())
  return got


def main(out, process_id, port):
  jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=int(process_id))
  batcher, model, processor, all_records = setup(out + ".images")
  mine = all_records[2 * jax.process_index() : 2 * jax.process_index() + 2]
  mesh = make_mesh({"data": -1})
  with jax.set_mesh(mesh):
    sampler = PagedSampler(model, processor=processor, engine=ENGINE)
    got = rollouts(sampler, batcher.inputs(mine))
  result = {"text": got["sampled"][0].text}
  for name, (r, tokens, lengths) in got.items():
    assert r.arrays.tokens.shape[0] == 4 * G and r.arrays.tokens.sharding.spec[0] == "data"
    every = multihost_utils.process_allgather(r.arrays.tokens, tiled=True)
    lo = 2 * jax.process_index() * G
    np.testing.assert_array_equal(every[lo : lo + 2 * G], tokens)
    result[name] = {"tokens": tokens, "lengths": lengths}
  with open(out, "w") as f:
    json.dump(result, f)
  jax.distributed.shutdown()


if __name__ == "__main__":
  main(*sys.argv[1:])
