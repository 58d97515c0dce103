"""Step time with judging overlapped vs serialised, against a judge server with a fixed added latency.

A "training step" = device work (a jitted matmul chain sized to take about --device-ms) + judging the step's
captions (CapRL reward through HttpJudge -> the rule-based OpenAI-compatible server, which sleeps
--judge-latency-ms per request). Serial: device, then judge. Overlapped (OverlappedReward.submit): the judge
works on step t's captions while the device runs step t+1's work; the loop blocks on step t's rewards only
after dispatching the next device step. Prints both step times and their ratio (ideal: max/sum).

    python -m benchmarks.judge_overlap --steps 8 --device-ms 300 --judge-latency-ms 300
"""

from __future__ import annotations

import argparse
import pathlib
import socket
import sys
import tempfile
import threading
import time

import jax
import jax.numpy as jnp
import uvicorn

from jaxcap.world.dataset import generate_dataset, judge_for_manifest
from jaxcap.judges.endpoint import Endpoint
from jaxcap.judges.fleet import JudgeFleet, RoleConfig
from jaxcap.judges.http_judge import HttpJudge
from jaxcap.rewards.overlap import OverlappedReward
from jaxcap.judges.reply_cache import ReplyCache
from jaxcap.world.judge_server import rule_based_app_for_manifest
from jaxcap.rewards.mix import build_reward


def start_server(app):
  sock = socket.socket()
  sock.bind(("127.0.0.1", 0))
  server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan="off"))
  threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
  while not server.started:
    time.sleep(0.01)
  return server, f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


def make_device_step(target_ms: float):
  """A jitted matmul chain calibrated to about target_ms on this machine."""
  x = jnp.ones((512, 512), jnp.float32) / 512

  def body(n):
    @jax.jit
    def f(x):
      return jax.lax.fori_loop(0, n, lambda _, y: jnp.tanh(y @ x), x)

    return f

  probe = body(20)
  probe(x).block_until_ready()
  start = time.perf_counter()
  probe(x).block_until_ready()
  per_iter = (time.perf_counter() - start) / 20
  step = body(max(1, int(target_ms / 1e3 / per_iter)))
  step(x).block_until_ready()
  return lambda: step(x)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--steps", type=int, default=8)
  p.add_argument("--device-ms", type=float, default=300)
  p.add_argument("--judge-latency-ms", type=float, default=300)
  p.add_argument("--images", type=int, default=4)
  p.add_argument("--rollouts", type=int, default=4)
  args = p.parse_args(argv)

  manifest = str(generate_dataset(pathlib.Path(tempfile.mkdtemp()), args.images, seed=0))
  records, _ = judge_for_manifest(manifest)
  server, url = start_server(rule_based_app_for_manifest(manifest, added_latency_s=args.judge_latency_ms / 1e3))
  device_step = make_device_step(args.device_ms)
  # No cache: every step's questions cost a real round trip, as fresh rollouts would.
  fleet = JudgeFleet({"answerer": RoleConfig((Endpoint(url),), max_concurrency=64)}, cache=ReplyCache(0))
  reward = build_reward({"caprl": {"questions_per_caption": 2}}, HttpJudge(fleet))
  captions = [c for r in records for c in list(r.teacher_captions.values())[: args.rollouts]]

  def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) / args.steps

  def serial():
    for t in range(args.steps):
      device_step().block_until_ready()
      reward(captions, records, step=t)

  def overlapped():
    with OverlappedReward(reward) as over:
      pending = None
      for t in range(args.steps):
        out = device_step()  # dispatched asynchronously
        if pending is not None:
          pending.result()  # rewards of step t-1, judged while the device ran
        pending = over.submit(captions, records, step=t)
        out.block_until_ready()
      pending.result()

  judge_alone = timed(lambda: [reward(captions, records, step=t) for t in range(args.steps)])
  device_alone = timed(lambda: [device_step().block_until_ready() for _ in range(args.steps)])
  serial_s, overlap_s = timed(serial), timed(overlapped)
  print(
    f"captions/step {len(captions)}, judge requests/step {2 * len(captions)}, "
    f"judge latency {args.judge_latency_ms:g} ms/request"
  )
  print(f"device alone {device_alone * 1e3:.0f} ms/step, judge alone {judge_alone * 1e3:.0f} ms/step")
  print(
    f"serial {serial_s * 1e3:.0f} ms/step, overlapped {overlap_s * 1e3:.0f} ms/step, "
    f"ratio overlapped/serial {overlap_s / serial_s:.2f} "
    f"(ideal max/sum {max(device_alone, judge_alone) / (device_alone + judge_alone):.2f})"
  )
  fleet.close()
  server.should_exit = True
  return 0


if __name__ == "__main__":
  sys.exit(main())
