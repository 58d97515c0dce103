"""The embedded default: everything the main job needs when no checkpoint or data is given, built locally.

The synthetic world (images with known scene graphs, curated questions, references, teacher captions), a BPE
tokenizer trained on the world's text with Qwen2.5-VL's special tokens, a tiny Qwen2.5-VL-shaped student, and
deliberately incomplete SFT captions (the warm start mentions only some of the objects, so RL has room to teach
the student to say more, which is what the QA reward pays for), registered as the `incomplete` and `complete`
SFT target sources. The vision warm-up that stands in for a pretrained ViT is `jaxcap.world.vision_warmup`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from jaxcap.world import vocabulary as V
from jaxcap.world.curation import CurationConfig
from jaxcap.world.dataset import MANIFEST_NAME, generate_dataset
from jaxcap.world.scene import Scene, WorldConfig, as_scenes
from jaxcap.world.tokenizer import train_world_tokenizer
from jaxcap.models.config import Qwen25VLConfig, TextConfig, VisionConfig
from jaxcap.multihost import first_process_then_others
from jaxcap.data.sft_targets import SFT_TARGETS, SFTTarget


def world_config(w) -> WorldConfig:
  """The embedded world's generator settings from the run config's `world` block (no text labels)."""
  return WorldConfig(
    image_size=w.image_size,
    min_objects=w.min_objects,
    max_objects=w.max_objects,
    label_probability=0.0,
    clip_fraction=w.clip_fraction,
  )


def build_world(
  workdir: Path, *, world: WorldConfig, train_scenes: int, eval_scenes: int, seed: int, curate_train: bool = True
) -> tuple[Path, Path]:
  """Writes (or reuses) train and held-out manifests under `workdir/world`; returns their paths.

  `curate_train=False` keeps every candidate question of the train split, leaky ones included (CapRL's
  no-curation ablation); the held-out split is always curated, so evaluation measures the same thing."""
  out = []
  for split, n, split_seed in (("train", train_scenes, seed), ("heldout", eval_scenes, seed + 10_000)):
    curate = curate_train or split == "heldout"
    d = workdir / "world" / (split if curate else f"{split}_uncurated")
    stamp = d / "world.json"
    want = {"scenes": n, "seed": split_seed, **dataclasses.asdict(world)} | ({} if curate else {"curated": False})
    if not (stamp.exists() and json.loads(stamp.read_text()) == want):
      generate_dataset(
        d, n, seed=split_seed, config=world, id_prefix=f"{split}_", curation=CurationConfig() if curate else None
      )
      stamp.write_text(json.dumps(want))
    out.append(d / MANIFEST_NAME)
  return out[0], out[1]


def build_world_manifests(config, workdir: Path) -> tuple[Path, Path]:
  """The run's synthetic world (`config.world`, seeded by `config.seed`): train and held-out manifest paths."""
  w = config.world
  return first_process_then_others(
    lambda: build_world(
      workdir,
      world=world_config(w),
      train_scenes=w.train_scenes,
      eval_scenes=w.eval_scenes,
      seed=int(config.seed),
      curate_train=bool(w.curate_questions),
    ),
    "jaxcap-world",
  )


def build_student(config, workdir: Path, mesh=None):
  """(model, Processor): the tiny student (`config.model.student`, of family `config.model.family`) with fresh
  weights from `config.seed`, created directly sharded on `mesh` when given, and its processor over the world's
  tokenizer."""
  from flax import nnx

  from jaxcap.models.families import family
  from jaxcap.processing import Processor
  from jaxcap.sharding import init_sharded

  seed = int(config.seed)
  tok = first_process_then_others(lambda: build_tokenizer(workdir, config.world.vocab_size, seed), "jaxcap-tokenizer")
  s = config.model.student
  cfg = student_config(
    tok,
    vision_width=s.vision_width,
    vision_depth=s.vision_depth,
    text_width=s.text_width,
    text_layers=s.text_layers,
    text_heads=s.text_heads,
    rope_theta=s.rope_theta,
  )
  m = config.model
  student_family = family(m.family)
  cfg = student_family.like_qwen25(cfg).replace(**m.compute())
  make = lambda: student_family.model_cls(cfg, rngs=nnx.Rngs(seed))
  model = make() if mesh is None else init_sharded(make, mesh)
  return model, Processor(tok, cfg, system=None)  # the tiny student needs no system turn


def build_tokenizer(workdir: Path, vocab_size: int, seed: int):
  """The world's BPE tokenizer as a `PreTrainedTokenizerFast`, saved under `workdir/tokenizer`."""
  from transformers import PreTrainedTokenizerFast

  d = workdir / "tokenizer"
  if not (d / "tokenizer_config.json").exists():
    path = train_world_tokenizer(d, vocab_size=vocab_size, seed=seed)
    tok = PreTrainedTokenizerFast(
      tokenizer_file=str(path), pad_token="<|endoftext|>", eos_token="<|im_end|>", unk_token=None
    )
    tok.save_pretrained(d)
  return PreTrainedTokenizerFast.from_pretrained(d)


def student_config(
  tokenizer,
  *,
  vision_width: int,
  vision_depth: int,
  text_width: int,
  text_layers: int,
  text_heads: int,
  window_size: int = 112,
  rope_theta: float = 10000.0,
) -> Qwen25VLConfig:
  """A tiny Qwen2.5-VL whose special token ids are the world tokenizer's.

  `rope_theta` is lower than Qwen's 1e6: with head_dim 32 and a 3x3 grid of vision tokens, 1e6 leaves the
  height / width bands of mRoPE rotating by hundredths of a radian between neighbouring cells, so the decoder
  could hardly tell where a visual token is."""
  ids = lambda t: tokenizer.convert_tokens_to_ids(t)
  head_dim = text_width // text_heads
  half = head_dim // 2
  t = half // 4
  mrope = (half - 2 * (3 * t // 2), 3 * t // 2, 3 * t // 2)
  return Qwen25VLConfig(
    vision=VisionConfig(
      depth=vision_depth,
      hidden_size=vision_width,
      intermediate_size=2 * vision_width,
      num_heads=max(1, vision_width // 32),
      out_hidden_size=text_width,
      fullatt_block_indexes=(vision_depth - 1,),
      window_size=window_size,
    ),
    text=TextConfig(
      vocab_size=len(tokenizer),
      hidden_size=text_width,
      intermediate_size=3 * text_width,
      num_hidden_layers=text_layers,
      num_attention_heads=text_heads,
      num_key_value_heads=max(1, text_heads // 2),
      mrope_section=mrope,
      rope_theta=rope_theta,
      max_position_embeddings=4096,
      tie_word_embeddings=True,
    ),
    image_token_id=ids("<|image_pad|>"),
    video_token_id=ids("<|video_pad|>"),
    vision_start_token_id=ids("<|vision_start|>"),
    vision_end_token_id=ids("<|vision_end|>"),
    bos_token_id=ids("<|endoftext|>"),
    eos_token_id=ids("<|im_end|>"),
  )


def object_sentence(obj) -> str:
  return f"A {obj.size} {obj.name} is {V.position_phrase(obj.position)}."


def reading_order(scene: Scene) -> list:
  """Objects sorted by grid cell, top-left to bottom-right: a canonical order, so each target is a function
  of the image (a random order would make the SFT target noisy)."""
  return sorted(scene.objects, key=lambda o: V.POSITIONS.index(o.position))


def _head(scene: Scene) -> str:
  n = len(scene.objects)
  return f"The image shows {V.number_word(n)} object{'s' if n != 1 else ''} on a {scene.background} background."


def incomplete_caption(scene: Scene, rng: np.random.Generator, max_fraction: float = 0.5) -> str:
  """The SFT target: the object count and the first k objects in reading order, 1 <= k <= max_fraction * n."""
  objects = reading_order(scene)
  k = int(rng.integers(1, max(1, int(np.floor(max_fraction * len(objects)))) + 1))
  return " ".join([_head(scene)] + [object_sentence(o) for o in objects[:k]])


def complete_caption(scene: Scene) -> str:
  """Every object in reading order, same phrasing: what an ideal student says (the SFT-on-full baseline)."""
  return " ".join([_head(scene)] + [object_sentence(o) for o in reading_order(scene)])


def _needs_scenes(name: str, scenes) -> None:
  if not scenes:
    raise ValueError(f"sft.targets={name!r} needs synthetic-world scenes; use sft.targets='reference'.")


@SFT_TARGETS.register("incomplete")
def incomplete_targets(config, scenes) -> SFTTarget:
  """`incomplete_caption` of each record's scene, naming k of n objects, 1 <= k <= sft.max_fraction * n."""
  _needs_scenes("incomplete", scenes)
  scenes = as_scenes(scenes)
  return lambda rec, rng: incomplete_caption(scenes[rec.id], rng, config.sft.max_fraction)


@SFT_TARGETS.register("complete")
def complete_targets(config, scenes) -> SFTTarget:
  _needs_scenes("complete", scenes)
  scenes = as_scenes(scenes)
  return lambda rec, rng: complete_caption(scenes[rec.id])
