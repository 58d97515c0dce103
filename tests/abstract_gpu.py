"""Lowering for GPU on a host without one: programs traced under an abstract mesh whose device is an abstract GPU.

jax 0.11's Pallas Triton lowering reads the GPU's compute capability from the default device, or, when that is no
GPU, from the abstract mesh's device (`jax.sharding.AbstractDevice`; "No supported GPU devices found, please
specify an abstract GPU device" otherwise); jax 0.10 fell back to compute capability 9.0 by itself and ignores the
abstract device. One context serves both: jaxcap's kernels choose their platform from the ambient mesh too
(`jaxcap.models.fused_segments.target_platform`), so under it they take their GPU path on a CPU host."""

import contextlib

import jax

DEVICE_KIND = "NVIDIA H100 80GB HBM3"  # a Hopper: compute capability 9.0, jax 0.10's fallback


@contextlib.contextmanager
def abstract_gpu(device_kind: str = DEVICE_KIND):
  """Traces and lowerings inside target one abstract GPU of `device_kind`."""
  device = jax.sharding.AbstractDevice(device_kind=device_kind, num_cores=None, platform="gpu")
  mesh = jax.sharding.AbstractMesh((1,), ("gpu",), (jax.sharding.AxisType.Auto,), abstract_device=device)
  with jax.sharding.use_abstract_mesh(mesh):
    yield mesh
