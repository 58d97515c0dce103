"""`export.peft` on its own: the adapters alone in PEFT's layout, no merged checkpoint (it once wrote nothing when
`export.hf` was off); and `export.peft` without adapters is a config error."""

import pytest
from flax import nnx

import jaxcap.models as M
from jaxcap.config.schema import parse, validate
from jaxcap.models import lora
from jaxcap.models.qwen25vl import Qwen25VL
from jaxcap.train.shell.rundir import RunDirectory
from processes import load_config


def test_peft_alone_writes_the_adapters_and_no_merged_checkpoint(tmp_path):
  workdir = tmp_path / "run"
  changes = {"model.lora.rank": 4, "export.hf": False, "export.peft": True}
  config = parse(load_config("caprl", workdir=str(workdir), **changes))
  graphdef, params = nnx.split(lora.apply_lora(Qwen25VL(M.tiny(), rngs=nnx.Rngs(0)), rank=4, alpha=8.0, seed=1))
  run = RunDirectory(config)
  try:
    run.export(params, graphdef, processor=None)
  finally:
    run.finish([])
  assert (workdir / "export_adapters" / "adapter_model.safetensors").exists()
  assert (workdir / "export_adapters" / "adapter_config.json").exists() and not (workdir / "export").exists()


def test_peft_without_adapters_is_refused():
  with pytest.raises(ValueError, match=r"export.peft=True exports LoRA adapters, but model.lora.rank=0"):
    validate(load_config("caprl", **{"export.peft": True}))
