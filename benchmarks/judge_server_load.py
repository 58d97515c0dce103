"""The rule-based judge server under load on loopback: N requests, C in flight, idle connections and one large
request; no 5xx allowed.

Starts `python -m jaxcap.judge serve --rule-based` in its own process (bearer token on, as the launch scripts run
judges; request-head deadline --header-timeout), opens --idle connections that never send a request, sends one
--large-mb request (a real judgment of a caption that size, under the server's 16 MiB body limit) and, at the same
time, --requests chat requests, --concurrency at a time, each a real judge request of the kinds a CapRL /
RubiCap / BalCapRL run sends (the structured copy in the body, a request id in the header); --bad-share of them
are malformed on purpose (bad JSON, wrong types, over the body limit) and must get a 4xx. Prints throughput,
latency percentiles (seconds, good small requests), the large request's latency, how many idle connections the
server closed and when, and status counts; exits 1 if any reply was a 5xx or a transport error, a good request
failed, or an idle connection was still open after the head deadline + 5 s. Client and server share this
machine's cores.

    python -m benchmarks.judge_server_load --requests 1000 --concurrency 200 --idle 300 --large-mb 15
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import platform
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np


if not __package__:  # run as a file (python benchmarks/judge_server_load.py): the repository root, for `benchmarks.*`
  sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks.judge_load_requests import BAD, MAX_BODY_MB, good_requests, large_request  # noqa: E402
from jaxcap.world.dataset import generate_dataset, judge_for_manifest  # noqa: E402


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


async def hold_idle(port: int, count: int) -> list[float | None]:
  """Opens `count` connections that send nothing; the seconds after which the server closed each (None: open
  when the deadline passed)."""

  async def one():
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    start = time.perf_counter()
    try:
      closed = await asyncio.wait_for(reader.read(), timeout=IDLE_DEADLINE_S)
      return time.perf_counter() - start if closed == b"" else None
    except (asyncio.TimeoutError, ConnectionError):
      return None
    finally:
      writer.close()

  return await asyncio.gather(*(one() for _ in range(count)))


IDLE_DEADLINE_S = 60.0  # set from --header-timeout in main


async def load_with_idle_and_large(port, url, key, bodies, concurrency, idle, large):
  idle_task = asyncio.ensure_future(hold_idle(port, idle))
  await asyncio.sleep(0.5)  # the idle connections are open before the load starts
  headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
  async with httpx.AsyncClient(timeout=300) as big_client:
    big_start = time.perf_counter()
    big_task = asyncio.ensure_future(big_client.post(url, content=large, headers=headers)) if large else None
    results, wall = await load(url, key, bodies, concurrency)
    big = None
    if big_task is not None:
      response = await big_task
      big = (response.status_code, time.perf_counter() - big_start)
  return results, wall, big, await idle_task


async def load(url: str, key: str, bodies: list[tuple[bool, bytes]], concurrency: int):
  # idle pooled connections dropped before the server's 5 s idle timeout closes them under a request
  limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency, keepalive_expiry=2.0)
  headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
  gate = asyncio.Semaphore(concurrency)
  results = []

  async with httpx.AsyncClient(limits=limits, timeout=120) as client:

    async def one(i: int, good: bool, body: bytes):
      async with gate:
        start = time.perf_counter()
        try:
          r = await client.post(url, content=body, headers={**headers, "X-Request-Id": f"load-{i}"})
          status = r.status_code
        except httpx.HTTPError as e:
          status = f"transport error {type(e).__name__}"
        results.append((good, status, time.perf_counter() - start))

    start = time.perf_counter()
    await asyncio.gather(*(one(i, good, body) for i, (good, body) in enumerate(bodies)))
    return results, time.perf_counter() - start


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--requests", type=int, default=1000)
  p.add_argument("--concurrency", type=int, default=200)
  p.add_argument("--bad-share", type=float, default=0.05, help="share of malformed requests (must get 4xx)")
  p.add_argument("--scenes", type=int, default=16)
  p.add_argument("--idle", type=int, default=300, help="connections that never send a request")
  p.add_argument("--large-mb", type=float, default=15.0, help="one request with a caption this large (0: none)")
  p.add_argument("--header-timeout", type=float, default=5.0, help="the server's request-head deadline (s)")
  args = p.parse_args(argv)
  global IDLE_DEADLINE_S
  IDLE_DEADLINE_S = args.header_timeout + 5.0

  work = tempfile.mkdtemp(prefix="judge-load-")
  manifest = generate_dataset(os.path.join(work, "world"), args.scenes, seed=0)
  records, _ = judge_for_manifest(str(manifest))
  key, port = secrets.token_hex(16), free_port()
  env = {**os.environ, "JUDGE_BENCH_KEY": key}
  cmd = [
    sys.executable,
    "-m",
    "jaxcap.judge",
    "serve",
    "--rule-based",
    "--manifest",
    str(manifest),
    "--port",
    str(port),
    "--api-key-env",
    "JUDGE_BENCH_KEY",
    "--max-body-mb",
    str(MAX_BODY_MB),
    "--header-timeout",
    str(args.header_timeout),
  ]
  server = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  base = f"http://127.0.0.1:{port}"
  try:
    deadline = time.monotonic() + 60
    while True:
      try:
        if httpx.get(f"{base}/health", timeout=1).status_code == 200:
          break
      except httpx.HTTPError:
        pass
      if time.monotonic() > deadline or server.poll() is not None:
        raise SystemExit(f"judge server did not start: {server.stderr.read() if server.poll() is not None else ''}")
      time.sleep(0.1)
    n_bad = int(round(args.requests * args.bad_share))
    rng = np.random.default_rng(0)
    bodies = [(True, b) for b in good_requests(records, args.requests - n_bad)]
    bodies += [(False, BAD[i % len(BAD)]) for i in range(n_bad)]
    bodies = [bodies[i] for i in rng.permutation(len(bodies))]
    large = large_request(records[0], args.large_mb) if args.large_mb > 0 else b""
    results, wall, big, idle_closed = asyncio.run(
      load_with_idle_and_large(port, f"{base}/v1/chat/completions", key, bodies, args.concurrency, args.idle, large)
    )
    stats = httpx.get(f"{base}/stats", headers={"Authorization": f"Bearer {key}"}).json()
  finally:
    server.terminate()
    server.wait(timeout=10)

  counts = collections.Counter(str(s) for _, s, _ in results)
  lat = np.array([t for good, s, t in results if good and s == 200])
  good_failed = sum(1 for good, s, _ in results if good and s != 200)
  fatal = sum(1 for _, s, _ in results if not isinstance(s, int) or s >= 500)
  cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
  report = {
    "requests": len(results),
    "concurrency": args.concurrency,
    "wall_s": round(wall, 3),
    "requests_per_s": round(len(results) / wall, 1),
    "latency_s (good requests)": {
      "p50": round(float(np.percentile(lat, 50)), 4),
      "p90": round(float(np.percentile(lat, 90)), 4),
      "p99": round(float(np.percentile(lat, 99)), 4),
      "max": round(float(lat.max()), 4),
    },
    "status_counts": dict(sorted(counts.items())),
    "large_request": None
    if big is None
    else {"mb": round(len(large) / 2**20, 1), "status": big[0], "latency_s": round(big[1], 3)},
    "idle_connections": {
      "opened": args.idle,
      "closed_by_server": sum(t is not None for t in idle_closed),
      "closed_after_s (max)": round(max((t for t in idle_closed if t is not None), default=float("nan")), 2),
      "header_timeout_s": args.header_timeout,
    },
    "server_peak_in_flight": stats["peak_in_flight"],
    "server_refused_by_status": stats["refused"],
    "good_requests_failed": good_failed,
    "5xx_or_transport_errors": fatal,
    "cpu": f"{cpu} x {os.cpu_count()} logical, load average {os.getloadavg()[0]:.1f}",
    "python": platform.python_version(),
  }
  print(json.dumps(report, indent=1))
  still_open = sum(t is None for t in idle_closed)
  big_failed = big is not None and big[0] != 200
  return 1 if fatal or good_failed or still_open or big_failed else 0


if __name__ == "__main__":
  sys.exit(main())
