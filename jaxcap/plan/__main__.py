"""`python -m jaxcap.plan`: the command line (see the package's docstring)."""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

import jax
from absl import app, flags
from ml_collections import config_flags

from jaxcap.plan.compile import plan
from jaxcap.plan.report import format_plan
from jaxcap.models.families import preset_names
from jaxcap.plan.topology import model_config, split_slices, topology_devices


def _define_flags() -> dict:
  """The CLI's flags, defined only when run as a program (so importing jaxcap.plan next to jaxcap.launch works)."""
  return dict(
    config=config_flags.DEFINE_config_file("config", None, "Run config, e.g. configs/caprl.py:paper", lock_config=True),
    model=flags.DEFINE_string(
      "model",
      None,
      # every registered family's presets (tiny / mid: of the config's model.family)
      f"{' | '.join(preset_names())}, or a checkpoint directory (default: model.checkpoint)",
    ),
    topology=flags.DEFINE_string("topology", "cpu:8", "cpu:N or tpu:<chip>:<shape> (e.g. tpu:v5e:4x4)"),
    hbm=flags.DEFINE_float("hbm_gib", None, "memory per device, GiB (default: the TPU chip's; 80 for cpu:N)"),
    programs=flags.DEFINE_list("programs", "rl_step,logprobs,prefill,decode", "which programs to compile"),
    prompt_text=flags.DEFINE_integer("prompt_text_tokens", 48, "text tokens of a prompt besides its image tokens"),
    json=flags.DEFINE_string("json", None, "also write the plan as JSON to this path"),
  )


def main(argv, f: dict):
  del argv
  config = f["config"].value
  from jaxcap.config.cli import CONFIG_ERROR_STATUS, fail, loaded

  if config is None:
    fail("--config is required, e.g. --config=configs/caprl.py:paper (or --config=caprl:paper from any directory)")
  from jaxcap.config.schema import parse

  try:
    config = parse(loaded(config))  # typed from here on; a plan checks shapes, not a run's data or ranges
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(CONFIG_ERROR_STATUS)

  topology = f["topology"].value
  # the host runs on CPU whatever the target: a TPU target is only compiled for, never attached
  jax.config.update("jax_platforms", "cpu")
  if topology.startswith("cpu:"):
    n = int(topology.split(":")[1])
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={n}".strip()
  devices, chip_hbm = topology_devices(topology)
  # rollouts on their own chips: on a TPU, two slices (the compiler takes a whole slice); on CPU, as the run splits
  slices = (
    split_slices(topology, config.rollout.devices) if topology.startswith("tpu:") and config.rollout.devices else None
  )
  hbm = f["hbm"].value or chip_hbm or 80.0
  result = plan(
    config,
    model_config(config, f["model"].value),
    devices,
    hbm,
    tuple(f["programs"].value),
    f["prompt_text"].value,
    slices=slices,
  )
  result["topology"] = topology
  print(format_plan(result))
  if f["json"].value:
    Path(f["json"].value).write_text(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
  from jaxcap.config.cli import parse_flags

  app.run(functools.partial(main, f=_define_flags()), flags_parser=parse_flags)  # a bad --config.x value: exit 2
