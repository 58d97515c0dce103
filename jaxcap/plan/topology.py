"""Target devices and the model to plan: `cpu:N` / `tpu:<chip>:<shape>` topologies, a preset or checkpoint's config,
the largest image grid a run feeds."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
from jax.experimental import topologies

from jaxcap.checkpoint import read_config
from jaxcap.models.families import preset_config, preset_names
from jaxcap.train.steps.abstract import image_grid

__all__ = ["TPU_HBM_GIB", "image_grid", "model_config", "split_slices", "topology_devices"]

# HBM per chip, GiB, of the TPU generations libtpu compiles for
TPU_HBM_GIB = {"v4": 32, "v5e": 16, "v5litepod": 16, "v5p": 95, "v6e": 32}


def topology_devices(topology: str):
  """The devices of `topology` ('cpu:N' needs XLA_FLAGS set before jax starts; see `main`)."""

  kind, _, rest = topology.partition(":")
  if kind == "cpu":
    n = int(rest or 1)
    devices = jax.devices("cpu")
    if len(devices) < n:
      raise ValueError(f"--topology={topology}: jax has {len(devices)} CPU devices; run jaxcap.plan in a fresh process")
    return devices[:n], None
  if kind == "tpu":
    chip, _, shape = rest.partition(":")
    dims = [int(d) for d in shape.split("x") if d.isdigit()]
    # libtpu's default host is 2x2 chips; a smaller slice (v5e:1x1, one chip) is a host of its own size
    kw = {"chips_per_host_bounds": (dims + [1, 1, 1])[:3]} if dims and int(np.prod(dims)) < 4 else {}
    try:
      desc = topologies.get_topology_desc(topology_name=f"{chip}:{shape}", platform="tpu", **kw)
    except Exception as e:  # no libtpu, or a shape it does not know
      raise SystemExit(
        f"--topology={topology}: cannot build the TPU topology ({type(e).__name__}: {e}). Install the TPU "
        'compiler with `pip install -e ".[plan-tpu]"` and name a real slice, e.g. tpu:v5e:4x4 or tpu:v5p:2x2x2.'
      ) from None
    return list(desc.devices), TPU_HBM_GIB.get(chip)
  raise SystemExit(f"--topology={topology!r}: use cpu:N or tpu:<chip>:<shape>")


def split_slices(topology: str, rollout_devices: int) -> tuple[list, list]:
  """(learner devices, rollout devices) of a TPU `topology` split for `rollout.devices` = n per host (4 chips a
  host): two slices of its chip, the rollouts' of n x hosts chips, each shaped by halving the longest side of the
  topology's. The TPU compiler takes a program over a whole slice, not over chips picked from one, and a
  disaggregated pod gives the rollouts whole hosts."""
  chip, _, shape = topology.partition(":")[2].partition(":")
  dims = [int(d) for d in shape.split("x")]
  total = int(np.prod(dims))
  hosts = max(1, total // 4)
  rollout = rollout_devices * hosts
  if not 0 < rollout < total:
    raise SystemExit(f"rollout.devices={rollout_devices} x {hosts} hosts leaves no chip of {topology} to the learner")

  def sub(count: int) -> str:
    d = list(dims)
    while int(np.prod(d)) > count:
      d[int(np.argmax(d))] //= 2
    if int(np.prod(d)) != count:
      raise SystemExit(f"{topology}: {count} chips are no slice of it; choose rollout.devices for a power-of-two split")
    return "x".join(map(str, d))

  learner, _ = topology_devices(f"tpu:{chip}:{sub(total - rollout)}")
  rollouts, _ = topology_devices(f"tpu:{chip}:{sub(rollout)}")
  return learner, rollouts


def model_config(config, name: str | None):

  m = config.model
  name = name or m.checkpoint
  if not name:
    raise SystemExit(
      f"the config trains the embedded student; pass --model={' | '.join(preset_names())} or a "
      "checkpoint directory (or set model.checkpoint)"
    )
  kw = m.compute(name)  # model.param_dtype 'auto': a LoRA base in the checkpoint's (the preset's) dtype, as the run
  if name in preset_names():
    return preset_config(name, m.family, **kw)
  if Path(name).is_dir():
    return read_config(name, **kw)
  raise SystemExit(f"--model={name!r}: not a preset ({', '.join(preset_names())}) nor a checkpoint directory")
