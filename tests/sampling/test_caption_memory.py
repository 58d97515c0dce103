"""The annotator's memory check (issue 56): it counts what the annotator allocates (the vision tower over a batch
of images at their processed sizes, the KV cache, the batch) and refuses, before anything is loaded, with one line
whose every suggested flag fits; a policy exported by a run carries the processor settings it was trained with."""

import dataclasses
import io
import json
import re
from contextlib import redirect_stderr

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from PIL import Image

import jaxcap.models as M
from jaxcap import caption
from jaxcap.caption_memory import TEMPLATE_TOKENS, Plan, check_annotation_memory, padded_pack, vision_bytes
from jaxcap.data.annotation_files import list_images
from jaxcap.host_memory import BUDGET
from jaxcap.models.families import layout_for, layout_shape_for
from jaxcap.processing import Processor
from jaxcap.processing.annotation_media import sort_by_size
from jaxcap.processing.processor_files import save_processor_configs
from jaxcap.sampling.footprint import GIB
from hf_reference import save_tiny_checkpoint

# photo sizes (width, height) of a mixed folder, up to 4,000 px a side
PHOTOS = [(1536, 1024), (4000, 3000), (640, 480), (3000, 4000), (300, 200), (1024, 1024)]


def photo_folder(root, sizes=PHOTOS):
  """JPEGs of `sizes` (flat colours: only their headers are read before captioning)."""
  root.mkdir()
  for i, (w, h) in enumerate(sizes):
    Image.new("RGB", (w, h), (40 * i % 255, 90, 160)).save(root / f"photo{i}.jpg")
  return root


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
  root = tmp_path_factory.mktemp("caption_memory")
  save_tiny_checkpoint(M.tiny(), 0, root / "ckpt")
  return root / "ckpt"


@pytest.mark.parametrize("grids", [[(1, 40, 40)] * 4, [(1, 20, 30), (1, 8, 12)], [(1, 16, 16)] * 3])
def test_vision_estimate_bounds_what_xla_allocates_for_the_tower(grids):
  """The estimate is at least the compiled tower's temporary memory (XLA:CPU's own figure) and not far above it."""
  cfg = M.tiny()
  pack = padded_pack(list(grids), videos=False)
  shape = layout_shape_for(np.asarray(pack), cfg.vision).bucketed(cfg.vision)
  model = nnx.eval_shape(lambda: M.Qwen25VL(cfg, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(model)
  v = cfg.vision
  pixels = jax.ShapeDtypeStruct((shape.patches, v.in_channels * v.temporal_patch_size * v.patch_size**2), jnp.float32)
  tower = jax.jit(lambda s, p, layout: nnx.merge(graphdef, s).visual(p, layout))
  temp = tower.lower(state, pixels, layout_for(np.asarray(pack), v, shape)).compile().memory_analysis()
  temp = temp.temp_size_in_bytes
  assert temp <= vision_bytes(cfg, pack) <= 1.6 * temp + 2**20, (temp, vision_bytes(cfg, pack))


def test_short_batches_are_padded_with_the_last_image_as_the_sampler_pads_them():
  assert padded_pack([(1, 2, 2)] * 3, videos=False) == [(1, 2, 2)] * 4
  assert padded_pack([(1, 2, 2), (1, 4, 4), (1, 6, 6)], videos=False)[-1] == (1, 6, 6)
  assert padded_pack([(2, 2, 2)] * 3, videos=True) == [(2, 2, 2)] * 3  # text-only rows pad a batch with videos


def _check(ckpt, images, out, *flags):
  err = io.StringIO()
  args = ["--checkpoint", str(ckpt), "--images", str(images), "--out", str(out), "--no_progress", *flags]
  with redirect_stderr(err):
    status = caption.main(args)
  return status, [line for line in err.getvalue().splitlines() if line.startswith(("error", "Traceback"))]


def test_photos_at_the_default_budget_are_refused_in_one_line_whose_fixes_each_fit(ckpt, tmp_path, monkeypatch):
  """A folder of large photos at transformers' default pixel budget does not fit a few GiB: one line, exit 2,
  nothing loaded or written; each flag it offers, given, passes the same check."""
  images = photo_folder(tmp_path / "photos")
  monkeypatch.setenv(BUDGET, "3GiB")
  loaded = []
  monkeypatch.setattr("jaxcap.checkpoint.load_hf_checkpoint", lambda *a, **k: loaded.append(1) or 1 / 0)
  out = tmp_path / "captions.jsonl"
  status, lines = _check(ckpt, images, out, "--batch_size", "4")
  assert status == 2 and len(lines) == 1, lines
  line = lines[0]
  assert "jaxcap.caption needs about" in line and "largest batch of 4" in line and "(JAXCAP_MEMORY_BUDGET)" in line
  assert "px after resizing" in line and not loaded and not out.exists()
  fixes = re.findall(r"(--batch_size|--max_pixels) (\d+) \((\d+\.\d+) GiB\)", line)
  assert {flag for flag, _, _ in fixes} == {"--batch_size", "--max_pixels"}, line
  processor = Processor.from_pretrained(ckpt)
  ordered, errors = sort_by_size(list_images(images), processor)
  assert not errors
  for flag, value, gib in fixes:
    assert float(gib) <= 3.0
    batch = int(value) if flag == "--batch_size" else 4
    if flag == "--max_pixels":
      processor.vision_cfg = dataclasses.replace(processor.vision_cfg, max_pixels=int(value))
    text = len(caption.DEFAULT_PROMPT.encode()) + TEMPLATE_TOKENS  # as check_flags counts it
    plan = Plan(rows=min(batch, len(ordered)), batch_size=batch, max_new_tokens=512, text_tokens=text)
    fp = check_annotation_memory(M.tiny(), plan, sort_by_size(ordered, processor)[0], processor, available=None)
    assert fp.total / GIB <= 3.0 + 0.01, (flag, value, fp.describe("float32"))
  monkeypatch.setenv(BUDGET, "off")  # the check can be turned off: the run reaches the load
  with pytest.raises(ZeroDivisionError):
    caption.main(["--checkpoint", str(ckpt), "--images", str(images), "--out", str(out), "--no_progress"])


def test_the_estimate_grows_with_the_largest_images_not_the_smallest(ckpt, tmp_path):
  processor = Processor.from_pretrained(ckpt)
  small = sort_by_size(list_images(photo_folder(tmp_path / "small", [(300, 200)] * 4)), processor)[0]
  large = sort_by_size(list_images(photo_folder(tmp_path / "large", [(300, 200)] * 3 + [(4000, 3000)])), processor)[0]
  plan = Plan(rows=4, batch_size=4, max_new_tokens=16, text_tokens=40)
  a, b = (check_annotation_memory(M.tiny(), plan, items, processor, available=None) for items in (small, large))
  assert b.activations > 20 * a.activations  # one 4,000 px photo pads the whole pack's attention frames


def test_an_export_carries_the_processor_settings_both_readers_read(ckpt, tmp_path):
  """save_processor_configs writes the run's image / video settings (the 84 px square as its pixel budget) where
  jaxcap and transformers read them, over what the base checkpoint had (a nested processor_config.json too)."""
  from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

  export = tmp_path / "export"
  export.mkdir()
  for f in ckpt.iterdir():
    (export / f.name).write_bytes(f.read_bytes())
  (export / "processor_config.json").write_text(json.dumps({"image_processor": {"max_pixels": 12845056}}))
  processor = Processor.from_pretrained(ckpt)
  processor.video_cfg = processor.video_cfg.with_sampling(fps=1.0, max_frames=8)
  save_processor_configs(processor, export, square_side=84)
  back = Processor.from_pretrained(export)
  assert (back.vision_cfg.min_pixels, back.vision_cfg.max_pixels) == (56 * 56, 84 * 84)
  assert back.vision_cfg.image_mean == processor.vision_cfg.image_mean
  assert (back.video_cfg.fps, back.video_cfg.max_frames, back.video_cfg.max_pixels) == (1.0, 8, 84 * 84)
  hf = Qwen2VLImageProcessorPil.from_pretrained(export)
  assert (hf.size["shortest_edge"], hf.size["longest_edge"]) == (56 * 56, 84 * 84)
  nested = json.loads((export / "processor_config.json").read_text())
  assert nested["image_processor"]["max_pixels"] == 84 * 84
  save_processor_configs(processor, export)  # native sizes: the processor's own budget
  assert Processor.from_pretrained(export).vision_cfg.max_pixels == processor.vision_cfg.max_pixels


@pytest.mark.parametrize("factor, side, area", [(28, 84, 84 * 84), (32, 84, 96 * 96), (28, 100, 112 * 112)])
def test_the_square_budget_is_the_training_squares_area_after_the_processors_resize(factor, side, area):
  """A run resized its images to `side` px squares, which the processor then resized to its factor: the export's
  budget gives such a square exactly the tokens it had in training."""
  from jaxcap.processing.processor_files import square_budget
  from jaxcap.processing.vision import VisionPreprocessConfig, smart_resize

  cfg = VisionPreprocessConfig(patch_size=factor // 2)
  budget = square_budget(cfg, side)
  assert budget.max_pixels == area
  assert smart_resize(side, side, factor, budget.min_pixels, budget.max_pixels) == smart_resize(side, side, factor)
