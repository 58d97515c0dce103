"""One of the 2 processes of tests/sampling/test_sampling_multiprocess.py (a helper script, not a test file).

    python multiprocess_worker.py OUT.json PROCESS_ID PORT

Samples G = 2 captions for 4 image prompts of 4 native sizes, 2 per process (so the processes must agree on one
bucket), under a mesh over both processes' devices, with
`multihost_utils.process_allgather` made to raise while the sampler runs and decodes: the captions have to come
from this process's own shards. Then checks them against the global arrays (gathered only here, for the check):
this process's block of the global batch holds its prompts, and its tokens, lengths and captions are that
block's; greedy rollouts of the global batch equal each prompt decoded alone, unpadded, on this process's own
device. Also checks that the update's prompts and rollout arrays derived on device (2 micro-batches) equal the
host path's uploads. Writes what it checked.
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
from jaxcap.sharding import make_mesh
from jaxcap.train.batching import Batcher
from jaxcap.train.config import base_config

PROMPT = "describe the image in detail . a red blue green square circle triangle"
ROWS, G, M_MICRO = 4, 2, 2
SIZES = [(40, 60), (70, 50), (120, 100), (30, 30)]  # process 1's images take more patches and tokens


def main(out, process_id, port):
  jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=int(process_id))
  cfg = M.tiny()
  processor = Processor(word_tokenizer(PROMPT.split(), cfg), cfg)
  config = base_config()
  config.data.prompt, config.data.image_size = PROMPT, 0  # native sizes
  directory = out + ".images"
  os.makedirs(directory, exist_ok=True)
  records = []
  for i in range(ROWS):
    path = f"{directory}/{i}.png"
    h, w = SIZES[i]
    Image.fromarray((np.random.RandomState(i).rand(h, w, 3) * 255).astype(np.uint8)).save(path)
    records.append(ImageRecord(id=str(i), image=path))
  per = ROWS // jax.process_count()
  mine = records[jax.process_index() * per : (jax.process_index() + 1) * per]

  mesh = make_mesh({"fsdp": -1})
  batcher = Batcher(processor, config, mesh)
  model = M.Qwen25VL(cfg, rngs=nnx.Rngs(0))
  with jax.set_mesh(mesh):
    sampler = Sampler(model, processor=processor, sampling=SamplingConfig(temperature=1.0, max_new_tokens=6))
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
    np.testing.assert_array_equal(global_ids[lo : lo + per, -local_length:], bucketed.prompts.input_ids)
    block = slice(lo * G, (lo + per) * G)
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
  with open(out, "w") as f:
    json.dump({"first_row": lo, "text": text, "tokens": tokens.tolist(), "lengths": lengths.tolist()}, f)
  jax.distributed.shutdown()


if __name__ == "__main__":
  main(*sys.argv[1:])
