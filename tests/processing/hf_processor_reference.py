"""transformers' `Qwen2_5_VLProcessor` / `Qwen3VLProcessor` as the reference, run in a subprocess.

transformers' video processor needs torchvision, which cannot be installed beside the CPU torch wheel of the test
environment. The subprocess gets a stand-in `torchvision` package holding the few functions transformers calls on
this path, each doing what torchvision 0.28 does on the CPU (`resize` of a uint8 tensor with bicubic: torch's
native uint8 antialiased `interpolate`; `normalize`: subtract, divide; `grayscale_to_rgb`), so everything else —
sampling metadata, the per-frame pixel budget, rescale / normalise, patchify, token expansion and
`second_per_grid_ts` — is transformers' own code. Images use transformers' PIL image processor (no torchvision).

Run as a script: `python hf_processor_reference.py SPEC.json OUT_DIR` (see `main`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

STUB = {
  "torchvision/__init__.py": '__version__ = "0.28.0"\n',
  "torchvision/io.py": "",
  "torchvision/transforms/__init__.py": """
import enum


class InterpolationMode(enum.Enum):
  NEAREST = "nearest"
  NEAREST_EXACT = "nearest-exact"
  BILINEAR = "bilinear"
  BICUBIC = "bicubic"
  BOX = "box"
  HAMMING = "hamming"
  LANCZOS = "lanczos"
""",
  "torchvision/transforms/functional.py": """
import numpy as np
import torch


def pil_to_tensor(pic):
  return torch.as_tensor(np.array(pic)).permute(2, 0, 1).contiguous()
""",
  "torchvision/transforms/v2/__init__.py": "",
  "torchvision/transforms/v2/functional.py": """
import torch

from torchvision.transforms import InterpolationMode  # noqa: F401


def resize(image, size, interpolation=InterpolationMode.BILINEAR, max_size=None, antialias=True):
  # torchvision's resize_image: same size -> unchanged; uint8 bicubic on the CPU -> native uint8 interpolate
  if interpolation != InterpolationMode.BICUBIC or image.dtype not in (torch.uint8, torch.float32):
    raise NotImplementedError((interpolation, image.dtype))
  shape = image.shape
  c, h, w = shape[-3:]
  if tuple(size) == (h, w):
    return image
  out = torch.nn.functional.interpolate(
    image.reshape(-1, c, h, w), size=list(size), mode="bicubic", align_corners=False, antialias=antialias
  )
  return out.reshape(shape[:-3] + (c, *size))


def normalize(tensor, mean, std, inplace=False):
  tensor = tensor if inplace else tensor.clone()
  mean = torch.as_tensor(mean, dtype=tensor.dtype).view(-1, 1, 1)
  std = torch.as_tensor(std, dtype=tensor.dtype).view(-1, 1, 1)
  return tensor.sub_(mean).div_(std)


def grayscale_to_rgb(image):
  return image if image.shape[-3] >= 3 else image.expand(image.shape[:-3] + (3,) + image.shape[-2:])
""",
  "torchvision-0.28.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: torchvision\nVersion: 0.28.0\n",
}


def run_reference(spec: dict, workdir: Path, timeout: float = 300) -> dict[str, dict]:
  """Runs the cases of `spec` through transformers in a subprocess; returns name -> {field: numpy array}."""
  import numpy as np

  stub = workdir / "tv_stub"
  for name, text in STUB.items():
    (stub / name).parent.mkdir(parents=True, exist_ok=True)
    (stub / name).write_text(text)
  (workdir / "spec.json").write_text(json.dumps(spec))
  out = workdir / "hf_out"
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(stub), os.environ.get("PYTHONPATH", "")]))
  proc = subprocess.run(
    [sys.executable, __file__, str(workdir / "spec.json"), str(out)],
    env=env,
    capture_output=True,
    text=True,
    timeout=timeout,
  )
  if proc.returncode:
    raise RuntimeError(f"reference subprocess failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
  return {c["name"]: dict(np.load(out / f"{c['name']}.npz")) for c in spec["cases"]}


def main(spec_path: str, out_dir: str) -> None:
  """SPEC.json: {"checkpoint": dir (or per case), "processor": "qwen2_5_vl" (default) | "qwen3_vl", "cases": [{"name", "text",
  "images": [{"path", "as": "path" | "pil" | "array"}], "videos": [{"frames": .npy [T, H, W, 3],
  "total_num_frames", "fps", "indices" (or null), "sample": false}]}]}.
  Images "as": "path" go in as the file name (transformers' `load_image`: EXIF transpose, RGB); "pil" as the
  opened file after `ImageOps.exif_transpose` (so the image processor composites alpha on white); "array" as a
  uint8 array from a .npy file. Videos with "sample" are every frame of a file, which transformers' own
  `sample_frames` samples; the others are the frames as given (`indices`: which frames of the file they are).
  The image processor is transformers' PIL one (the torchvision one needs torchvision), from the checkpoint's
  preprocessor_config.json; the video processor reads video_preprocessor_config.json."""
  import numpy as np
  from PIL import Image, ImageOps
  from transformers import AutoTokenizer, Qwen2_5_VLProcessor, Qwen2VLVideoProcessor
  from transformers import Qwen3VLProcessor, Qwen3VLVideoProcessor
  from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
  from transformers.video_utils import VideoMetadata

  spec = json.loads(Path(spec_path).read_text())
  qwen3 = spec.get("processor", "qwen2_5_vl") == "qwen3_vl"
  processor_cls, video_cls = (
    (Qwen3VLProcessor, Qwen3VLVideoProcessor) if qwen3 else (Qwen2_5_VLProcessor, Qwen2VLVideoProcessor)
  )
  processors = {}

  def processor_of(ckpt):
    if ckpt not in processors:
      processors[ckpt] = processor_cls(
        image_processor=Qwen2VLImageProcessorPil.from_pretrained(ckpt),
        tokenizer=AutoTokenizer.from_pretrained(ckpt),
        video_processor=video_cls.from_pretrained(ckpt),
      )
    return processors[ckpt]

  load = {
    "path": lambda p: p,
    "pil": lambda p: ImageOps.exif_transpose(Image.open(p)),
    "array": lambda p: np.load(p),
  }
  Path(out_dir).mkdir(parents=True, exist_ok=True)
  for case in spec["cases"]:
    processor = processor_of(case.get("checkpoint", spec.get("checkpoint")))
    kw = {}
    if case.get("images"):
      kw["images"] = [load[im["as"]](im["path"]) for im in case["images"]]
    if case.get("videos"):
      kw["videos"] = [np.load(v["frames"]) for v in case["videos"]]
      kw["video_metadata"] = [
        VideoMetadata(total_num_frames=v["total_num_frames"], fps=v["fps"], frames_indices=v["indices"])
        for v in case["videos"]
      ]
      kw["do_sample_frames"] = any(v.get("sample", False) for v in case["videos"])
    out = processor(text=[case["text"]], return_tensors="pt", **kw)
    arrays = {k: v.numpy() for k, v in out.items() if hasattr(v, "numpy")}
    arrays["text"] = np.array(processor.tokenizer.decode(out["input_ids"][0]))  # the expanded prompt, for messages
    np.savez(Path(out_dir) / f"{case['name']}.npz", **arrays)


if __name__ == "__main__":
  main(*sys.argv[1:])
