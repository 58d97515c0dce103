"""`python -m jaxcap.judge serve`: an OpenAI-compatible judge server.

    python -m jaxcap.judge serve --rule-based --manifest data/manifest.jsonl --port 8100 [--latency 0.2]

serves the rule-based judge over the manifest's synthetic scenes at http://127.0.0.1:8100/v1, so a default
run exercises the HTTP judge path. It binds to loopback unless --host says otherwise, and requires the bearer
token in $JUDGE_API_KEY when that variable is set (the trainer's default judge.api_key_env), so server and
trainer agree on the key; --api-key-env '' serves without one. For real LLM judges use any OpenAI-compatible
server (vLLM, SGLang, llama.cpp, TGI); a Flax Qwen2.5 text-model backend is not implemented here.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
    prog="python -m jaxcap.judge", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  sub = parser.add_subparsers(dest="command", required=True)
  serve = sub.add_parser("serve", help="serve a judge over the OpenAI chat-completions API")
  serve.add_argument("--rule-based", action="store_true", help="the rule-based judge (needs --manifest)")
  serve.add_argument("--manifest", help="dataset manifest whose rows carry scene graphs")
  serve.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
  serve.add_argument("--port", type=int, default=8100)
  serve.add_argument("--latency", type=float, default=0.0, help="seconds added to every reply")
  serve.add_argument("--failure-rate", type=float, default=0.0, help="share of judgments that fail (tests)")
  serve.add_argument(
    "--api-key-env",
    default=None,
    help="environment variable holding the bearer token clients must send (default: JUDGE_API_KEY if it is set; "
    "'' = no authentication)",
  )
  serve.add_argument("--served-model-name", default="judge", help="model name clients ask for (= judge.model)")
  serve.add_argument("--max-body-mb", type=float, default=16.0, help="larger request bodies get HTTP 413")
  serve.add_argument("--workers", type=int, default=4, help="threads that parse and judge requests")
  serve.add_argument(
    "--header-timeout", type=float, default=10.0, help="seconds a connection has to send its request head"
  )
  serve.add_argument("--idle-timeout", type=int, default=5, help="seconds an idle kept-alive connection stays open")
  serve.add_argument(
    "--max-connections", type=int, default=1024, help="open connections / requests in flight (beyond: 503)"
  )
  serve.add_argument("--log-level", default="warning")
  args = parser.parse_args(argv)

  if not args.rule_based:
    parser.error(
      "only --rule-based is implemented; serve LLM judges with vLLM, SGLang, llama.cpp or TGI "
      "and point the fleet at their /v1 URL."
    )
  if not args.manifest:
    parser.error("--rule-based needs --manifest PATH (a manifest written by the synthetic world).")
  import os

  import uvicorn

  from jaxcap.judges.serving import server_config
  from jaxcap.world.judge_server import rule_based_app_for_manifest

  key_env = "JUDGE_API_KEY" if args.api_key_env is None else args.api_key_env
  api_key = os.environ.get(key_env) if key_env else None
  if args.api_key_env and not api_key:
    parser.error(f"--api-key-env {args.api_key_env}: the variable is not set; export it or pass --api-key-env ''.")
  app = rule_based_app_for_manifest(
    args.manifest,
    added_latency_s=args.latency,
    failure_rate=args.failure_rate,
    model=args.served_model_name,
    api_key=api_key,
    max_body_bytes=int(args.max_body_mb * 2**20),
    workers=args.workers,
  )
  auth = f"bearer token from ${key_env}" if api_key else "no authentication (clients: judge.api_key_env='')"
  print(f"rule-based judge on http://{args.host}:{args.port}/v1, {auth}", file=sys.stderr, flush=True)
  if not api_key and args.host not in ("127.0.0.1", "localhost", "::1"):
    print(f"warning: serving on {args.host} without an API key; export JUDGE_API_KEY first", file=sys.stderr)
  config = server_config(
    app,
    args.host,
    args.port,
    header_timeout_s=args.header_timeout,
    idle_timeout_s=args.idle_timeout,
    max_connections=args.max_connections,
    log_level=args.log_level,
  )
  uvicorn.Server(config).run()
  return 0


if __name__ == "__main__":
  sys.exit(main())
