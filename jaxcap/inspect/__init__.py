"""`python -m jaxcap.inspect <workdir>`: a run's curves, rollout records, held-out captions (SFT end vs RL end) and
jaxcap.eval reports as one self-contained static site (HTML with inline JS / CSS, and the thumbnails it shows),
opened from disk; `--serve` serves it on 127.0.0.1. Reads only files, so it works on a run in progress.

    data.py    what a workdir holds -> one JSON-able document
    flags.py   captions that hit the red team's padding / injection / meta-commentary patterns
    media.py   thumbnails of the images the site shows
    render.py  the page: the document and the static/ app inlined into one index.html
    cli.py     the command line
"""
