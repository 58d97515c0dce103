"""`python -m jaxcap.plan --config=configs/caprl.py:paper --model=qwen2.5-vl-3b --topology=cpu:8`: will a run fit?

Lowers and compiles, ahead of time and with abstract weights (no checkpoint is read, nothing is allocated), the
programs a run executes — the RL update step, the log-prob pass, the sampler's prefill and decode loop — for the
config's model, batch and mesh on a target topology, and prints per device: memory (resident train state +
each program's arguments / temporaries / outputs) against the chip's memory, compile time and FLOPs per call,
then a verdict: fits, or does not fit and what to change.

Topologies: `cpu:N` (N virtual XLA:CPU devices; XLA:CPU keeps bf16 temporaries in f32, so its figures are an
upper bound) or `tpu:<chip>:<shape>` (e.g. `tpu:v5e:4x4`, `tpu:v5p:2x2x2`; the real TPU compiler through
`libtpu`, `pip install -e ".[plan-tpu]"`, no TPU attached).

Modules: `topology` (targets, the model to plan), `inputs` (the programs' abstract arguments), `compile` (`plan`),
`engine` (the paged engine's programs), `report` (advice and the printed table), `__main__` (the command line).
"""

from jaxcap.plan.compile import ProgramPlan, plan, program_fingerprint
from jaxcap.plan.inputs import per_device_bytes, rl_step_inputs
from jaxcap.plan.report import GIB, advice, format_plan
from jaxcap.plan.topology import TPU_HBM_GIB, image_grid, model_config, topology_devices

__all__ = [
  "GIB",
  "TPU_HBM_GIB",
  "ProgramPlan",
  "advice",
  "format_plan",
  "image_grid",
  "model_config",
  "per_device_bytes",
  "plan",
  "program_fingerprint",
  "rl_step_inputs",
  "topology_devices",
]
