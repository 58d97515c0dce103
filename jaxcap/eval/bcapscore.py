"""b-CapScore (BalCapRL): the harmonic mean of the three axes, correctness/coverage (DCScore), utility
(CaptionQA) and preference (CapArena), so a captioner cannot hide a collapse on one axis behind the others.

The CapArena score lives in [-100, 100]; it enters on the 0-100 scale of the other two as (score + 100) / 2.
(BalCapRL's published b-CapScores are not reproduced by any fixed linear map of its CapArena column, so the
paper's exact arena normalisation is unknown; this is the plain monotone one.) 0 on any axis gives 0.
"""

from __future__ import annotations

import numpy as np

from jaxcap.eval.metrics import Composite, harmonic_mean


def caparena_to_percent(score):
  """[-100, 100] -> [0, 100]."""
  return (np.asarray(score, float) + 100.0) / 2.0


def b_capscore(dcscore, captionqa, caparena_score):
  """Harmonic mean of DCScore (%), CaptionQA (%) and the CapArena score mapped to %; elementwise."""
  return harmonic_mean(np.asarray(dcscore, float), np.asarray(captionqa, float), caparena_to_percent(caparena_score))


def bcapscore_composite(
  dcscore_metric: str = "dcscore/f1", captionqa_metric: str = "captionqa/full", caparena_metric: str = "caparena/score"
) -> Composite:
  """The composite metric "bcapscore" over the named axes."""

  def composite(values):
    for name in (dcscore_metric, captionqa_metric, caparena_metric):
      if name not in values:
        raise KeyError(
          f"b-CapScore needs metric {name!r}, which no suite produced; enable the dcscore, "
          "captionqa and caparena suites or point bcapscore at existing metrics."
        )
    return b_capscore(values[dcscore_metric], values[captionqa_metric], values[caparena_metric])

  return composite
