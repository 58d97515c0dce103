"""Dynamic sampling's test of a group (jaxcap.rl.group_filter): hand-computed groups kept and dropped."""

import numpy as np
import pytest

from jaxcap.rl.group_filter import kept_groups

M = None  # a masked judgment: its placeholder value must never be read


def _rewards(groups):
  """groups: [B][G][R] of floats or M -> (values [B*G, R] with masked entries holding 0, valid [B*G, R])."""
  flat = [row for group in groups for row in group]
  valid = np.array([[v is not M for v in row] for row in flat])
  values = np.array([[0.0 if v is M else v for v in row] for row in flat], np.float32)
  return values, valid


# G = 3 captions per group, dimensions (qa: weight 1, aux: weight 0)
GROUPS = [
  [[1.0, 0.0], [1.0, 1.0], [1.0, 2.0]],  # qa all equal -> dropped (aux spreads but carries no weight)
  [[0.0, 0.0], [1.0, 0.0], [0.0, 0.0]],  # qa spreads -> kept
  [[M, 0.0], [1.0, 0.0], [1.0, 0.0]],  # the masked 0 is not a value: qa {1, 1} -> dropped
  [[M, M], [M, M], [M, M]],  # every judgment failed -> dropped
  [[0.5, 0.0], [M, 0.0], [0.25, 0.0]],  # two valid, different -> kept
  [[1.0, 0.0], [M, 0.0], [M, 0.0]],  # one valid value: no spread to speak of -> dropped
]
NAMES, WEIGHTS = ("qa", "aux"), (1.0, 0.0)


def test_spread_drops_equal_masked_and_failed_groups():
  values, valid = _rewards(GROUPS)
  kept = kept_groups(values, valid, WEIGHTS, NAMES, 3, "spread")
  np.testing.assert_array_equal(kept, [False, True, False, False, True, False])


def test_a_named_dimension_is_tested_alone_weighted_or_not():
  values, valid = _rewards(GROUPS)
  np.testing.assert_array_equal(
    kept_groups(values, valid, WEIGHTS, NAMES, 3, "aux"), [True, False, False, False, False, False]
  )
  np.testing.assert_array_equal(
    kept_groups(values, valid, WEIGHTS, NAMES, 3, "qa"), [False, True, False, False, True, False]
  )


def test_spread_reads_only_the_samples_the_estimators_use():
  """Two weighted dimensions: a sample with a masked `b` is no sample of the group (sample_validity), so its `a`
  is not read either; a group kept by either dimension's spread is kept."""
  groups = [
    [[1.0, 0.0], [0.0, M], [1.0, 0.0]],  # rows 0, 2 only: a {1, 1}, b {0, 0} -> dropped
    [[1.0, 0.0], [1.0, 1.0], [1.0, 0.0]],  # a equal, b spreads -> kept
    [[1.0, 0.0], [0.0, 0.0], [1.0, 0.0]],  # a spreads -> kept
  ]
  values, valid = _rewards(groups)
  kept = kept_groups(values, valid, (0.5, 0.5), ("a", "b"), 3, "spread")
  np.testing.assert_array_equal(kept, [False, True, True])


def test_off_keeps_everything_and_unknown_names_are_refused():
  values, valid = _rewards(GROUPS)
  assert kept_groups(values, valid, WEIGHTS, NAMES, 3, "off").all()
  with pytest.raises(ValueError, match="filter_groups='nope'"):
    kept_groups(values, valid, WEIGHTS, NAMES, 3, "nope")
  with pytest.raises(ValueError, match="groups of 4"):
    kept_groups(values, valid, WEIGHTS, NAMES, 4, "spread")
