"""Dynamic sampling's refill loop (jaxcap.train.rollouts.refill): which slot takes which group, the rounds drawn within the
budget, the filter/* counts, the assembled rewards (unfilled slots masked) and the rows gathered on device."""

import dataclasses
from types import SimpleNamespace

import jax

import jax.numpy as jnp
import numpy as np
import pytest

from jaxcap.config.cli import ConfigError
from jaxcap.config_files import base_config, validate
from jaxcap.train.rollouts.fully_async import FullyAsync
from jaxcap.train.rollouts.source import OnPolicy
from jaxcap.train.shell.phases import schedule_for
from jaxcap.train.rollouts.refill import (
  GroupFilter,
  NothingKeptError,
  RefillGroups,
  SlotFill,
  assembled_rewards,
  gather_index,
  gather_rows,
)
from jaxcap.train.rollouts.round import Round

G = 2


@dataclasses.dataclass
class _Rewards:
  values: np.ndarray
  valid: np.ndarray
  names: tuple = ("qa",)
  weights: np.ndarray = dataclasses.field(default_factory=lambda: np.ones(1, np.float32))


def _round(group_values, tag=0.0):
  """A judged round whose group i has the G qa values `group_values[i]` (+ tag, to tell rounds apart)."""
  values = np.asarray(group_values, np.float32).reshape(-1, 1) + tag
  return Round(None, None, None, None, None, None, _Rewards(values, np.ones_like(values, bool)))


FLAT, SPREADS = [1.0, 1.0], [0.0, 1.0]


def test_slots_take_later_kept_groups_in_order():
  fill = SlotFill(4)
  assert fill.add(np.array([True, False, True, False])) == 2 and fill.open == 2
  assert fill.same_rows  # round 0's own groups, kept or not
  assert fill.add(np.array([False, True, True, True])) == 2 and fill.open == 0
  assert fill.source == [(0, 0), (1, 1), (0, 2), (1, 2)] and not fill.same_rows
  fill = SlotFill(3)
  fill.add(np.zeros(3, bool))
  assert fill.add(np.array([False, True, False])) == 1
  assert fill.source == [(1, 1), (0, 1), (0, 2)] and fill.filled.tolist() == [True, False, False]


def test_refill_rounds_counts_and_budget():
  rounds = [_round([FLAT, SPREADS]), _round([FLAT, FLAT], 10), _round([SPREADS, FLAT], 20)]
  drawn = []

  def more(r):
    drawn.append(r)
    return rounds[r]

  fill, used, metrics = GroupFilter("spread", G, max_rounds=3).fill(rounds[0], more)
  assert drawn == [1, 2] and len(used) == 3
  assert fill.source == [(2, 0), (0, 1)] and fill.filled.all() and fill.moved_anywhere
  assert metrics == {
    "filter/dropped": 4.0,  # 1 + 2 + 1
    "filter/generated": 6.0,
    "filter/kept_frac": 2 / 6,
    "filter/first_dropped_frac": 0.5,
    "filter/rounds": 3.0,
    "filter/unfilled": 0.0,
  }
  values, valid = assembled_rewards(fill, used, G)
  np.testing.assert_array_equal(values[:, 0], [20.0, 21.0, 0.0, 1.0])
  assert valid.all()

  # a budget of one extra batch: one draw, and slot 0 keeps round 0's dropped group with its rewards masked
  drawn.clear()
  fill, used, metrics = GroupFilter("spread", G, max_rounds=2).fill(rounds[0], more)
  assert drawn == [1] and metrics["filter/unfilled"] == 1.0 and metrics["filter/dropped"] == 3.0
  assert metrics["filter/generated"] == 4.0 and metrics["filter/kept_frac"] == 1 / 4
  values, valid = assembled_rewards(fill, used, G)
  assert fill.same_rows and not fill.moved_anywhere and valid[:, 0].tolist() == [False, False, True, True]

  # nothing dropped: no draw, one round
  drawn.clear()
  fill, used, metrics = GroupFilter("spread", G, max_rounds=3).fill(_round([SPREADS, SPREADS]), more)
  assert drawn == [] and metrics["filter/rounds"] == 1.0 and metrics["filter/dropped"] == 0.0 and fill.same_rows


def test_gather_moves_each_slot_from_its_round_in_the_update_layout():
  """One process, M = 2 micro-batches of b = 2 slots, G = 2: a row's value encodes (round, slot, sample)."""
  m, b, n = 2, 4, 3
  mb = b // m

  def arrays(r):
    x = np.zeros((m, mb * G, n), np.float32)
    for i in range(b):
      for j in range(G):
        x[i // mb, (i % mb) * G + j] = 100 * r + 10 * i + j
    return jnp.asarray(x)

  fill = SlotFill(b)
  fill.add(np.array([True, False, False, True]))
  fill.add(np.array([False, False, True, True]))
  assert fill.source == [(0, 0), (1, 2), (1, 3), (0, 3)]
  index = jnp.asarray(gather_index(fill, b, G, m).reshape(m, -1))
  out = np.asarray(gather_rows([arrays(0), arrays(1)], index))
  want = np.zeros_like(out)
  for slot, (r, i) in enumerate(fill.source):
    for j in range(G):
      want[slot // mb, (slot % mb) * G + j] = 100 * r + 10 * i + j
  np.testing.assert_array_equal(out, want)
  assert gather_rows([None, None], index) is None


class _FlatSource:
  """Rolls out and judges rounds whose groups have `values` (flat: no spread), for RefillGroups.round."""

  num_samples, micro_batches = G, 1

  def __init__(self, values):
    self.values = values

  def rollout(self, state, batch, key, step):
    rnd = _round(self.values)
    return dataclasses.replace(rnd, rollouts=SimpleNamespace(host_lengths=np.ones(len(self.values) * G, int)))

  def judge(self, rnd, step):
    return rnd.rewards


def test_a_filter_that_keeps_nothing_warns_then_stops_the_run_naming_itself(capfd):
  refill = RefillGroups(GroupFilter("spread", G, max_rounds=1), patience=3)
  for step in (1, 2):
    refill.round(_FlatSource([FLAT, FLAT]), None, None, step, jax.random.key(0))
  assert "warning: RL step 2: rl.filter_groups='spread' kept no group" in capfd.readouterr().out
  refill.round(_FlatSource([FLAT, SPREADS]), None, None, 3, jax.random.key(0))  # a kept group: the count restarts
  refill.round(_FlatSource([FLAT, FLAT]), None, None, 4, jax.random.key(0))
  refill.round(_FlatSource([FLAT, FLAT]), None, None, 5, jax.random.key(0))
  with pytest.raises(NothingKeptError, match=r"kept no group .* for 3 step\(s\) in a row.*stopping at RL step 6"):
    refill.round(_FlatSource([FLAT, FLAT]), None, None, 6, jax.random.key(0))


def test_the_phase_chooses_the_sources_schedule_from_the_config_and_names_unknown_dimensions():
  c = base_config()
  names = ("caprl/accuracy",)
  assert isinstance(schedule_for(validate(c), names, 10, 5), OnPolicy)  # filter off, on-policy
  c.rl.filter_groups, c.rl.filter_groups_max_extra = "caprl/accuracy", 16  # rl.batch_size 8: two extra batches
  want = RefillGroups(GroupFilter("caprl/accuracy", 8, max_rounds=3), patience=c.train.collapse_steps)
  assert schedule_for(validate(c), names, 10, 5) == want
  c.rl.filter_groups = "rubicap/score"
  with pytest.raises(ConfigError, match=r"rl.filter_groups='rubicap/score'.*\['caprl/accuracy'\]"):
    schedule_for(validate(c), names, 10, 5)
  c.rl.filter_groups, c.rl.filter_groups_max_extra, c.rl.max_staleness = "off", 0, 2
  schedule = schedule_for(validate(c), names, 10, 5)
  assert isinstance(schedule, FullyAsync) and (schedule.steps, schedule.checkpoint_every, schedule.max_staleness) == (
    10,
    5,
    2,
  )
  assert schedule.sync is None  # colocated: the loop rolls out
