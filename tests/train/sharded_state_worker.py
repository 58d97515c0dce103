"""One process of tests/train/test_sharded_state.py: loads an HF checkpoint onto an 8-device mesh (one process x 8
devices, or one of two processes x 4), builds the full train state, takes two SFT steps on a fixed batch and
writes what it saw as JSON. Run as a script: python sharded_state_worker.py CKPT OUT [PROCESS_ID NUM PORT]."""

import functools
import json
import sys

import jax

if len(sys.argv) > 3:
  jax.distributed.initialize(f"127.0.0.1:{sys.argv[5]}", int(sys.argv[4]), int(sys.argv[3]))

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402

from jaxcap.checkpoint import load_hf_checkpoint  # noqa: E402
from jaxcap.models.vision import vision_layout  # noqa: E402
from jaxcap.processing import Processor  # noqa: E402
from jaxcap.sharding import (  # noqa: E402
  logical_to_spec,
  make_mesh,
  path_name,
  put_replicated_value,
  replicated_leaves,
)  # noqa: E402
from jaxcap.config.training import Optim
from jaxcap.train.steps.state import make_optimizer, phase_train_state  # noqa: E402
from jaxcap.train.steps.updates import PromptBatch, sft_step  # noqa: E402

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
from hf_reference import image_conversations  # noqa: E402


def main(ckpt: str, out: str):
  mesh = make_mesh({"fsdp": 4, "tensor": 2})
  model = load_hf_checkpoint(ckpt, mesh=mesh)
  graphdef, params = nnx.split(model)
  # eps well above rounding noise: Adam turns a gradient element of ~1e-9 (whose sign depends on the reduction
  # order, e.g. the k-projection bias) into a full lr step; with eps=1e-8 the two layouts then differ by whole steps
  opt = make_optimizer(Optim(1e-3, schedule="constant", weight_decay=0.01, eps=1e-5, grad_clip=1.0), 10)
  state = phase_train_state(opt, params, jax.random.key(0), mesh, with_reference=True)

  # every process builds the same global batch on the host and fills only its own shards
  proc = Processor.from_pretrained(ckpt)
  inputs = proc(image_conversations(8, 56, np.random.RandomState(0)), padding_side="left")
  b = inputs.input_ids.shape[0]
  batch = PromptBatch(
    inputs.input_ids[None],
    inputs.positions[:, None].transpose(1, 0, 2, 3),
    inputs.attention_mask[None],
    inputs.pixel_values[None],
  )
  layout = vision_layout(inputs.grid_thw, model.cfg.vision)
  targets = np.random.RandomState(1).randint(0, 200, size=(1, b, 6)).astype(np.int32)
  target_mask = np.ones_like(targets, bool)
  spec = lambda x, logical: NamedSharding(mesh, logical_to_spec(logical, x.shape, mesh))
  placed = put_replicated_value(
    (batch, targets, target_mask),
    (
      PromptBatch(
        spec(batch.ids, (None, "batch", None)),
        spec(batch.positions, (None, None, "batch", None)),
        spec(batch.mask, (None, "batch", None)),
        spec(batch.pixel_values, (None, None, None)),
      ),
      spec(targets, (None, "batch", None)),
      spec(target_mask, (None, "batch", None)),
    ),
  )
  step = jax.jit(functools.partial(sft_step, layout=layout, graphdef=graphdef, optimizer=opt), donate_argnums=0)
  losses = []
  with jax.set_mesh(mesh):
    for _ in range(2):
      state, metrics = step(state, *placed)
      losses.append([float(metrics["loss"]), float(metrics["grad_norm"])])
    sums = jax.jit(lambda p: jax.tree.map(lambda x: jnp.sum(jnp.square(x.astype(jnp.float32))), p))(state.params)
    sums = {path_name(p): float(v) for p, v in jax.tree_util.tree_leaves_with_path(sums)}
  leaves = jax.tree_util.tree_leaves_with_path(state)
  report = {
    "processes": jax.process_count(),
    "devices": jax.device_count(),
    "losses": losses,
    "param_sums": sums,
    "replicated_over_1mib": [p for p, *_ in replicated_leaves(state, mesh)],
    "largest_leaf_bytes_per_device": max(
      x.addressable_shards[0].data.nbytes for _, x in leaves if hasattr(x, "addressable_shards")
    ),
    "largest_leaf_bytes": max(x.nbytes for _, x in leaves if hasattr(x, "nbytes")),
    "moment_leaves_sharded": sum(
      1 for p, x in leaves if "opt_state" in jax.tree_util.keystr(p) and not x.sharding.is_fully_replicated
    ),
    "spans_processes": all(not x.is_fully_addressable for _, x in leaves if getattr(x, "ndim", 0) >= 2)
    if jax.process_count() > 1
    else None,
  }
  if jax.process_index() == 0:
    with open(out, "w") as f:
      json.dump(report, f)


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2])
