"""Test inputs of the Qwen3-VL-style families (Qwen3-VL, Qwen3.5): token ids, masks, patches and grids of one case,
as transformers takes them and as jaxcap's model takes them (positions from `qwen3vl_rope_index`)."""

import jax
import jax.numpy as jnp
import numpy as np
import torch

from jaxcap.models.qwen25vl import VisionInput
from jaxcap.models.qwen3vl_config import Qwen3VLConfig
from jaxcap.models.qwen3vl_vision import qwen3_vision_layout
from jaxcap.models.rope_index import qwen3vl_rope_index


def case(cfg: Qwen3VLConfig, kind: str, side: str = "left") -> dict:
  """Token ids, attention mask, patches and grids of one test case (rows padded on `side`)."""
  rng = np.random.RandomState(len(kind))
  text = lambda n: list(rng.randint(0, cfg.text.vocab_size - 16, n))
  m2 = cfg.vision.spatial_merge_size**2

  def image(t, h, w, token):
    return [cfg.vision_start_token_id] + [token] * (t * h * w // m2) + [cfg.vision_end_token_id]

  images, videos, rows = [], [], []
  if kind == "single_image":
    images = [(1, 4, 6)]
    rows = [text(2) + image(1, 4, 6, cfg.image_token_id) + text(5)]
  elif kind == "two_images":  # different sizes (one larger than the 4x4 learned grid), text between
    images = [(1, 4, 6), (1, 8, 4)]
    rows = [text(3) + image(1, 4, 6, cfg.image_token_id) + text(4) + image(1, 8, 4, cfg.image_token_id) + text(3)]
  elif kind == "text_only":
    rows = [text(9)]
  elif kind == "video":  # two temporal patches, each after its own text timestamp (as Qwen3-VL's processor lays out)
    videos = [(2, 4, 4)]
    frame = image(1, 4, 4, cfg.video_token_id)
    rows = [text(2) + text(3) + frame + text(3) + frame + text(4)]
  elif kind == "mixed_batch":  # an image row, a two-image + video row, a text-only row
    images, videos = [(1, 4, 4), (1, 6, 4), (1, 4, 8)], [(2, 4, 4)]
    frame = image(1, 4, 4, cfg.video_token_id)
    rows = [
      text(2) + image(1, 4, 4, cfg.image_token_id) + text(3),
      image(1, 6, 4, cfg.image_token_id) + text(2) + image(1, 4, 8, cfg.image_token_id) + text(1) + frame + frame,
      text(6),
    ]
  else:
    raise KeyError(kind)
  width = max(map(len, rows))
  ids = np.zeros((len(rows), width), np.int64)
  mask = np.zeros((len(rows), width), np.int64)
  for r, row in enumerate(rows):
    at = slice(width - len(row), width) if side == "left" else slice(0, len(row))
    ids[r, at], mask[r, at] = row, 1
  patches = lambda grids: rng.randn(sum(int(np.prod(g)) for g in grids), cfg.vision.patch_dim).astype(np.float32)
  return dict(
    ids=ids,
    mask=mask,
    image_grid=np.array(images, np.int64).reshape(-1, 3) if images else None,
    video_grid=np.array(videos, np.int64).reshape(-1, 3) if videos else None,
    image_px=patches(images) if images else None,
    video_px=patches(videos) if videos else None,
  )


def hf_kwargs(cfg: Qwen3VLConfig, c: dict) -> dict:
  ids = torch.as_tensor(c["ids"])
  types = torch.zeros_like(ids, dtype=torch.int)
  types[ids == cfg.image_token_id], types[ids == cfg.video_token_id] = 1, 2
  kw = dict(input_ids=ids, attention_mask=torch.as_tensor(c["mask"]), mm_token_type_ids=types)
  if c["image_grid"] is not None:
    kw |= dict(pixel_values=torch.as_tensor(c["image_px"]), image_grid_thw=torch.as_tensor(c["image_grid"]))
  if c["video_grid"] is not None:
    kw |= dict(pixel_values_videos=torch.as_tensor(c["video_px"]), video_grid_thw=torch.as_tensor(c["video_grid"]))
  return kw


def our_inputs(cfg: Qwen3VLConfig, c: dict, shape=None) -> tuple[np.ndarray, VisionInput | None]:
  """jaxcap's positions and vision input (images then videos in one pack) of a case."""
  positions, _ = qwen3vl_rope_index(cfg, c["ids"], c["mask"], c["image_grid"], c["video_grid"])
  grids = [g for g in (c["image_grid"], c["video_grid"]) if g is not None]
  if not grids:
    return positions, None
  px = np.concatenate([p for p in (c["image_px"], c["video_px"]) if p is not None])
  layout = qwen3_vision_layout(np.concatenate(grids), cfg.vision, shape)
  if shape is not None:
    px = np.pad(px, ((0, shape.patches - len(px)), (0, 0)))
  return positions, VisionInput(jnp.asarray(px), layout)


def greedy(model, c: dict, steps: int) -> tuple[np.ndarray, np.ndarray]:
  """Greedy tokens [B, steps] and their logits [B, steps, V] through the family's cache (`model.empty_cache`): one
  prefill (with DeepStack where the family has it), then one token per step at text positions continuing the prompt's largest position."""
  positions, vision = our_inputs(model.cfg, c)
  ids, mask = jnp.asarray(c["ids"]), jnp.asarray(c["mask"], bool)
  b, t = ids.shape
  slots = jnp.concatenate([mask, jnp.zeros((b, steps), bool)], 1)
  x, deepstack = model.embed_vision(ids, vision)
  cache = model.empty_cache(b, t + steps)
  hidden, cache = model.decode(x, jnp.asarray(positions), slots, cache, 0, deepstack=deepstack)
  logits = [model.logits(hidden[:, -1])]
  next_pos = jnp.asarray(positions.max(axis=(0, 2)) + 1)
  step = jax.jit(lambda tok, pos, slots, cache, i: model.decode(model.embed(tok[:, None]), pos, slots, cache, i))
  for i in range(steps - 1):
    slots = slots.at[:, t + i].set(True)
    pos = jnp.broadcast_to((next_pos + i)[None, :, None], (3, b, 1))
    hidden, cache = step(jnp.argmax(logits[-1], -1), pos, slots, cache, t + i)
    logits.append(model.logits(hidden[:, -1]))
  logits = np.asarray(jnp.stack(logits, 1))
  return logits.argmax(-1), logits
