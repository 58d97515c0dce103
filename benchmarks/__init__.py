"""Benchmarks of jaxcap, run from the repository root as `python -m benchmarks.<name> ...` (see README.md).

`harness` times and reports (interleaved pairs, machine and load); `ceilings` measures the machine's GEMM and
bandwidth limits on top of it; `fixtures` builds the shared inputs: reference `transformers` models paired with
jaxcap's, image prompts, and the run configs whose programs (`jaxcap.train.steps.programs`) the benchmarks time."""
