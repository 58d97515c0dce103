"""`python -m jaxcap.judge serve`: an OpenAI-compatible judge server.

    python -m jaxcap.judge serve --rule-based --manifest data/manifest.jsonl --port 8100 [--latency 0.2]

serves the rule-based judge over the manifest's synthetic scenes at http://127.0.0.1:8100/v1, so a default
run exercises the HTTP judge path. For real LLM judges use any OpenAI-compatible server (vLLM, SGLang,
llama.cpp, TGI); a Flax Qwen2.5 text-model backend is not implemented here.
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
  serve.add_argument("--log-level", default="warning")
  args = parser.parse_args(argv)

  if not args.rule_based:
    parser.error(
      "only --rule-based is implemented; serve LLM judges with vLLM, SGLang, llama.cpp or TGI "
      "and point the fleet at their /v1 URL."
    )
  if not args.manifest:
    parser.error("--rule-based needs --manifest PATH (a manifest written by the synthetic world).")
  import uvicorn

  from jaxcap.judges.server import rule_based_app_for_manifest

  app = rule_based_app_for_manifest(args.manifest, added_latency_s=args.latency, failure_rate=args.failure_rate)
  print(f"rule-based judge on http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
  uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
  return 0


if __name__ == "__main__":
  sys.exit(main())
