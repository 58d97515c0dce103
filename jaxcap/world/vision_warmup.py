"""Vision warm-up of the embedded student: dense per-token supervision of its ViT before any captioning.

A real Qwen2.5-VL starts from a ViT pretrained on billions of images. The embedded student's ViT starts random,
and captioning alone taught it only what every visual token shows (the background colour): its SFT captions
named the same stock object in almost every image. This stage stands in for that pretraining. Each merged
visual token (a cell of the image; 3x3 cells at 84 px) predicts the colour, shape and size of the object whose
centre lies in its cell, or "none", from the synthetic world's scene graphs, through throw-away linear heads.
Only the vision tower (patch embedding, blocks, merger) keeps what it learns.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P
from PIL import Image

from jaxcap.world import vocabulary as V
from jaxcap.world.render import render_frame
from jaxcap.world.scene import Scene, WorldConfig, sample_scene
from jaxcap.models.families import layout_for
from jaxcap.models.vision import VisionTower
from jaxcap.processing.vision import VisionPreprocessConfig, preprocess_image
from jaxcap.world import student as embedded

# Class 0 of every attribute is "no object centred in this cell".
ATTRIBUTES: dict[str, tuple[str, ...]] = {"colour": tuple(V.COLOURS), "shape": V.SHAPES, "size": tuple(V.SIZES)}


@dataclasses.dataclass(frozen=True)
class CellData:
  """Still images as ViT patches with per-cell targets.

  pixels: [N, patches_per_image, patch_dim] float32; targets: [N, cells, len(ATTRIBUTES)] int32 (0 = empty
  cell, else 1 + index into ATTRIBUTES[name]); grid_thw: [3], the patch grid every image shares."""

  pixels: np.ndarray
  targets: np.ndarray
  grid_thw: np.ndarray


def cell_targets(scene: Scene, rows: int, cols: int) -> np.ndarray:
  """[rows * cols, 3] int32 in raster order: the attributes of the object centred in each cell at frame 0."""
  out = np.zeros((rows * cols, len(ATTRIBUTES)), np.int32)
  for obj in scene.objects:
    if obj.appear_frame > 0:
      continue
    x, y = obj.center
    cell = min(rows - 1, int(y * rows)) * cols + min(cols - 1, int(x * cols))
    out[cell] = [1 + values.index(getattr(obj, name)) for name, values in ATTRIBUTES.items()]
  return out


def fresh_scenes(
  world: WorldConfig,
  *,
  seed: int,
  start: int,
  count: int,
  image_size: int = 0,
  preprocess: VisionPreprocessConfig = VisionPreprocessConfig(),
) -> CellData:
  """Scenes `start .. start + count` of the stream `seed`, rendered as still images (resized to `image_size`
  pixels squared when set, as the run's loader does) and preprocessed as the run's processor does. About
  0.4 ms an image at 84 px, so the warm-up draws a new batch every step: a corpus it cannot memorise."""
  pixels, targets, grid = [], [], None
  merge = preprocess.merge_size
  for i in range(start, start + count):
    scene = sample_scene(np.random.default_rng([seed, i]), f"vision_{i}", world)
    image = render_frame(scene, 0, world.image_size)
    if image_size:
      image = image.resize((image_size, image_size), Image.Resampling.BICUBIC)
    patches, grid = preprocess_image(image, preprocess)
    pixels.append(patches)
    targets.append(cell_targets(scene, int(grid[1]) // merge, int(grid[2]) // merge))
  return CellData(np.stack(pixels), np.stack(targets), np.asarray(grid))


def _split_logits(z: jax.Array) -> list[jax.Array]:
  sizes = np.cumsum([1 + len(v) for v in ATTRIBUTES.values()])[:-1]
  return jnp.split(z, sizes, axis=-1)


def warm_up_vision(
  tower: VisionTower,
  batches: Callable[[int], CellData],
  heldout: CellData | None,
  *,
  steps: int,
  lr: float,
  seed: int,
  mesh,
  log=None,
  tick: Callable[[], None] | None = None,
) -> tuple[nnx.State, dict[str, float]]:
  """Trains `tower`'s parameters (sharded as they are) on per-cell classification for `steps` steps, step s on
  `batches(s)` (Adam, cosine-decayed `lr`). Returns the new tower state and the held-out accuracy per attribute
  over cells that hold an object (`vision/<attr>_acc`); `log(step, metrics)` gets loss and grad norm; `tick()`
  is called after each step (a progress bar's)."""
  graph, tower_params = nnx.split(tower)
  width = tower.cfg.out_hidden_size
  num_classes = sum(1 + len(v) for v in ATTRIBUTES.values())
  replicated = NamedSharding(mesh, P())
  put = lambda tree: jax.tree.map(lambda x: jax.make_array_from_process_local_data(replicated, np.asarray(x)), tree)
  heads = put(
    {
      "kernel": 0.02 * np.random.default_rng(seed).standard_normal((width, num_classes), np.float32),
      "bias": np.zeros(num_classes, np.float32),
    }
  )
  params = (tower_params, heads)
  opt = optax.adam(optax.cosine_decay_schedule(lr, max(1, steps)))

  def logits(params, pixels, grid):
    tower_params, heads = params
    layout = layout_for(np.repeat(np.asarray(grid)[None], pixels.shape[0], axis=0), tower.cfg)
    feats, _ = nnx.merge(graph, tower_params).features(pixels.reshape(-1, pixels.shape[-1]), layout)
    return _split_logits(feats.reshape(pixels.shape[0], -1, width) @ heads["kernel"] + heads["bias"])

  def loss_fn(params, pixels, targets, grid):
    # Occupied and empty cells weigh the same in total: most cells are empty, and a plain mean lets "none"
    # dominate the gradient while the object attributes are still unlearnt.
    occupied = (targets[..., 0] > 0).astype(jnp.float32)
    weight = occupied / jnp.maximum(occupied.sum(), 1) + (1 - occupied) / jnp.maximum((1 - occupied).sum(), 1)
    return sum(
      (optax.softmax_cross_entropy_with_integer_labels(z, targets[..., i]) * weight).sum() / 2
      for i, z in enumerate(logits(params, pixels, grid))
    )

  @functools.partial(jax.jit, static_argnames="grid")
  def step(params, opt_state, pixels, targets, grid):
    loss, grads = jax.value_and_grad(loss_fn)(params, pixels, targets, grid)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, {"loss": loss, "grad_norm": optax.tree.norm(grads)}

  @functools.partial(jax.jit, static_argnames="grid")
  def hits(params, pixels, targets, grid):
    """[attributes] (correct, total) over cells holding an object."""
    occupied = targets[..., 0] > 0
    correct = jnp.stack(
      [((z.argmax(-1) == targets[..., i]) & occupied).sum() for i, z in enumerate(logits(params, pixels, grid))]
    )
    return correct, occupied.sum()

  with jax.set_mesh(mesh):
    opt_state = opt.init(params)
    for s in range(steps):
      batch = batches(s)
      params, opt_state, out = step(
        params, opt_state, put(batch.pixels), put(batch.targets), tuple(batch.grid_thw.tolist())
      )
      if log is not None and (s % 25 == 0 or s == steps - 1):
        log(s + 1, {k: float(v) for k, v in out.items()})
      if tick is not None:
        tick()
    metrics = {}
    if heldout is not None:
      correct, total = hits(params, put(heldout.pixels), put(heldout.targets), tuple(heldout.grid_thw.tolist()))
      correct, total = np.asarray(correct), max(int(total), 1)
      metrics = {f"vision/{name}_acc": float(correct[k] / total) for k, name in enumerate(ATTRIBUTES)}
  return params[0], metrics


def warm_up_embedded_student(
  config, graphdef, params, vision_cfg: VisionPreprocessConfig, mesh, log, progress: bool = False
):
  """The run's warm-up (`config.vision_warmup`) of the embedded student `(graphdef, params)`: a new batch of
  fresh scenes each step, scored on 256 more scenes from another stream. Returns (params with the trained
  tower, held-out metrics); `log(step, metrics)` gets each step's loss. `progress`: a progress bar over the steps
  (phase "vision"), as SFT's and RL's (`jaxcap.train.logs.metrics.StepLog`), so its minute is not silent."""
  from tqdm.auto import tqdm

  w = config.vision_warmup
  world = embedded.world_config(config.world)  # drawn as stills whatever clip_fraction says
  draw = functools.partial(fresh_scenes, world, image_size=config.data.image_size, preprocess=vision_cfg)
  # streams apart from the world's train (seed) and held-out (seed + 10_000) scenes
  train = lambda step: draw(seed=int(config.seed) + 20_000, start=step * w.batch_size, count=w.batch_size)
  heldout = draw(seed=int(config.seed) + 30_000, start=0, count=256)
  model = nnx.merge(graphdef, params)
  bar = tqdm(total=w.steps, desc="vision", disable=not progress, dynamic_ncols=True)
  with bar:
    loss = lambda step, m: (log(step, m), bar.set_postfix(loss=f"{m['loss']:.3f}", refresh=False))
    tower, metrics = warm_up_vision(
      model.visual, train, heldout, steps=w.steps, lr=w.lr, seed=int(config.seed), mesh=mesh, log=loss, tick=bar.update
    )
  nnx.update(model.visual, tower)
  return nnx.split(model)[1], metrics
