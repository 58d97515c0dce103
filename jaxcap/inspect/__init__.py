"""`python -m jaxcap.inspect <workdir>`: a run's curves, rollout records, held-out captions (SFT end vs RL end) and
jaxcap.eval reports as one self-contained static site (HTML with inline JS / CSS, and the images it shows),
opened from disk; `--serve` serves it on 127.0.0.1. Reads only files, so it works on a run in progress.

    data.py    what a workdir holds -> one JSON-able document (curves, rollout groups, held-out pairs)
    evals.py   jaxcap.eval report.json files -> the eval reports' part of it
    truth.py   each image's reference caption and curated questions, from the run's manifests
    jsonl.py   JSONL files that may be being written
    flags.py   captions that hit the red team's padding / injection / meta-commentary patterns
    media.py   the images the site shows, at most 512 px a side
    render.py  the page: the document and the static/ app inlined into one index.html
    cli.py     the command line

static/: app.css and one script per view (core.js shared helpers, diff.js word diffs, charts.js curves,
evidence.js the judge's evidence tables, rollouts.js, heldout.js, evals.js, app.js the tabs and hash navigation).
"""
