"""The papers' ablations rerun on the embedded world: `python -m jaxcap.experiments --suite papers`.

spec.py (what an experiment is), runs.py (the cached start and each arm's training), measure.py (per-image
metrics of a policy's held-out captions), suite.py (paired bootstrap per claim), report.py (Markdown, JSON, PNG).
"""
