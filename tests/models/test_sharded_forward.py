"""The forward pass under several ('data', 'fsdp', 'tensor') meshes equals the single-device one."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

import jaxcap.models as M
from jaxcap.checkpoint import load_hf_checkpoint
from jaxcap.processing import Processor
from jaxcap.sharding import make_mesh, param_shardings
from hf_reference import save_tiny_checkpoint


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  directory = tmp_path_factory.mktemp("mesh")
  save_tiny_checkpoint(M.tiny(), 5, directory)
  proc = Processor.from_pretrained(directory)
  imgs = [(np.random.RandomState(i).rand(56 + 28 * i, 84, 3) * 255).astype(np.uint8) for i in range(4)]
  convs = [
    [{"role": "user", "content": [{"type": "image", "image": im}, {"type": "text", "text": "describe the image ."}]}]
    for im in imgs
  ]
  batch = proc(convs)
  model = load_hf_checkpoint(directory)
  want, _ = model(
    jnp.asarray(batch.input_ids), jnp.asarray(batch.positions), jnp.asarray(batch.attention_mask), batch.vision()
  )
  return directory, batch, np.asarray(want)


@jax.jit
def _forward(graphdef, params, ids, pos, mask, vision):
  logits, _ = nnx.merge(graphdef, params)(ids, pos, mask, vision)
  return logits


@pytest.mark.parametrize(
  "shape", [{"data": 8}, {"fsdp": 8}, {"tensor": 2, "fsdp": 4}, {"data": 2, "fsdp": 2, "tensor": 2}], ids=str
)
def test_mesh_forward_equals_single_device(setup, shape):
  assert jax.device_count() == 8
  directory, batch, want = setup
  mesh = make_mesh(shape)
  model = load_hf_checkpoint(directory, mesh=mesh)
  graphdef, params = nnx.split(model)
  leaves = jax.tree.leaves(params)
  if shape.get("tensor", 1) > 1 or shape.get("fsdp", 1) > 1:  # weights really are split over devices
    assert any(len(x.sharding.device_set) > 1 and not x.sharding.is_fully_replicated for x in leaves)
  with jax.set_mesh(mesh):
    got = _forward(
      graphdef,
      params,
      jnp.asarray(batch.input_ids),
      jnp.asarray(batch.positions),
      jnp.asarray(batch.attention_mask),
      batch.vision(),
    )
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=0)


def test_param_rules_shard_the_big_matrices():
  mesh = make_mesh({"fsdp": 2, "tensor": 4})
  cfg = M.tiny()
  abstract = nnx.to_pure_dict(nnx.split(nnx.eval_shape(lambda: M.Qwen25VL(cfg, rngs=nnx.Rngs(0))))[1])
  specs = param_shardings(abstract, mesh)
  assert specs["layers"]["self_attn"]["q_proj"]["kernel"].spec == P(None, "fsdp", "tensor")
  assert specs["layers"]["mlp"]["down_proj"]["kernel"].spec == P(None, "tensor", "fsdp")
  # 2 KV heads x 16 = 32 columns: divisible by 4, sharded; norms replicated
  assert specs["layers"]["self_attn"]["k_proj"]["kernel"].spec == P(None, "fsdp", "tensor")
  assert specs["norm"]["weight"].spec == P(None)
