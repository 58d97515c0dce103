"""Streaming judging from the paged engine: each prompt's G samples are handed over (`on_group`) as soon as they are
done, with the tokens the rollout ends with, and the judge starts on the first group while the others still
decode (decode progress counted in segments when the fake judge is called)."""

import functools
import threading

import jax
import numpy as np
import pytest

from jaxcap.data.records import ImageRecord, align_records
from jaxcap.rewards.batch import make_batch
from jaxcap.rewards.overlap import OverlappedReward
from jaxcap.sampling import SamplingConfig
from jaxcap.sampling import paged_decode
from jaxcap.sampling.engine import EngineConfig, PagedSampler
from jaxcap.train.rollouts.source import _hand_to_judge
from sampling_fixtures import PADDED_BATCH, tiny_checkpoint

NEW, G = 10, 2
ENGINE = EngineConfig(slots=3, page_size=4, segment_steps=3)  # 6 samples through 3 slots, 3 steps a segment


class _FakeJudge:
  """A reward that notes, per call, which group it judges and how many decode segments had run by then."""

  names = ("fake",)

  def __init__(self, segments):
    self.segments, self.calls, self.called = segments, [], threading.Event()

  def __call__(self, captions, records, *, step=0, first=0):
    self.calls.append((first // G, self.segments["n"], list(captions)))
    self.called.set()
    records = align_records(captions, records)
    return make_batch(self.names, np.zeros((len(captions), 1)), np.ones((len(captions), 1), bool), [1.0], captions,
                      records, {})  # fmt: skip


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  return tiny_checkpoint(tmp_path_factory.mktemp("paged_streaming"), 0)


def test_groups_are_judged_while_the_others_decode(models, monkeypatch):
  _, model, proc = models
  segments = {"n": 0}
  segment = paged_decode.segment_jit

  def counted(*a, **kw):
    segments["n"] += 1
    return segment(*a, **kw)

  monkeypatch.setattr(paged_decode, "segment_jit", counted)
  judge = _FakeJudge(segments)
  records = [ImageRecord(id=f"p{b}", image="") for b in range(len(PADDED_BATCH))]
  # prompt 0's samples stop after 2 tokens, prompt 1's after 6, prompt 2's after 10 (rows past the 3 real prompts
  # are the bucket's padding)
  caps = np.repeat([2, 6, NEW, NEW], G)
  handed = {}
  sampling = SamplingConfig(temperature=1.0, max_new_tokens=NEW, stop_ids=())
  sampler = PagedSampler(model, processor=proc, sampling=sampling, engine=ENGINE)
  with OverlappedReward(judge) as reward:
    stream = reward.stream(records, group_size=G, step=7)
    hand = functools.partial(_hand_to_judge, stream, sampler.tokenizer)

    def on_group(prompt, tokens, lengths):
      handed[prompt] = (tokens, lengths, segments["n"])
      hand(prompt, tokens, lengths)
      if len(handed) == 1:  # the judge has the first group before decoding goes on
        assert judge.called.wait(60)

    rollouts = sampler(PADDED_BATCH, jax.random.key(1), num_samples=G, max_lengths=caps, on_group=on_group)
    total = segments["n"]
    batch = stream.result()

  assert sorted(handed) == [0, 1, 2]  # each real prompt once, none of the padding
  tokens, lengths = np.asarray(rollouts.tokens), np.asarray(rollouts.lengths)
  for p, (t, n, _) in handed.items():  # the host copies are the rows the rollout ends with
    np.testing.assert_array_equal(t, tokens[p * G : (p + 1) * G])
    np.testing.assert_array_equal(n, lengths[p * G : (p + 1) * G])
  assert [handed[p][2] for p in (0, 1, 2)] == sorted(handed[p][2] for p in (0, 1, 2))  # in order of their lengths
  first_group, at_segment, _ = judge.calls[0]
  assert first_group == 0 and at_segment < total  # judged before the last segment decoded
  assert sum(n < total for _, n, _ in judge.calls) >= 1 and len(judge.calls) == 3
  # the stream's captions are the rollout's, in prompt order
  assert [c for _, _, cs in sorted(judge.calls) for c in cs] == rollouts.text
  assert batch.values.shape == (3 * G, 1)
