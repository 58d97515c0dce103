"""Size-grouped batches: every epoch still visits every record once, in an order fixed by (seed, epoch); batches
hold similar sizes, so the padding to each batch's largest item drops; the loader resumes at the same place."""

import numpy as np

from jaxcap.data.records import ImageRecord
from jaxcap.processing import VisionPreprocessConfig
from jaxcap.train.rollouts.loader import record_loader
from jaxcap.train.rollouts.size_groups import record_patches, size_grouped_order


def _padding(sizes, order, batch):
  batches = [sizes[order[i : i + batch]] for i in range(0, len(order) - batch + 1, batch)]
  return sum(len(b) * b.max() for b in batches) / sum(b.sum() for b in batches)


def test_grouped_order_is_a_per_epoch_permutation_with_less_padding():
  rng = np.random.default_rng(0)
  sizes = rng.integers(100, 2000, 203)  # 25 batches of 8 and a short one
  a = size_grouped_order(sizes, 8, 8, seed=1, epoch=0)
  assert sorted(a.tolist()) == list(range(203))
  np.testing.assert_array_equal(a, size_grouped_order(sizes, 8, 8, seed=1, epoch=0))
  assert not np.array_equal(a, size_grouped_order(sizes, 8, 8, seed=1, epoch=1))
  assert set(a[200:].tolist()) == set(a[-3:].tolist())  # the short batch stays last
  plain = rng.permutation(203)
  assert _padding(sizes, a, 8) < 1.15 and _padding(sizes, plain, 8) > 1.4
  for start in range(0, 200, 64):  # within a window every batch is a run of the window's sorted sizes
    window = a[start : start + 64]
    spans = sorted((sizes[window[i : i + 8]].min(), sizes[window[i : i + 8]].max()) for i in range(0, len(window), 8))
    assert all(hi <= lo2 for (_, hi), (lo2, _) in zip(spans, spans[1:]))


def test_loader_with_groups_covers_each_epoch_and_resumes(tmp_path):
  from PIL import Image

  records = []
  for i in range(24):
    path = tmp_path / f"{i}.png"
    Image.new("RGB", (28 * (1 + i % 6), 28 * (1 + i % 4))).save(path)
    records.append(ImageRecord(id=str(i), image=str(path)))

  sizes = record_patches(records, VisionPreprocessConfig(min_pixels=28 * 28, max_pixels=28 * 28 * 64))
  np.testing.assert_array_equal(sizes, [4 * (1 + i % 6) * (1 + i % 4) for i in range(24)])
  load = lambda: record_loader(records, 2, seed=3, process_index=1, process_count=2, sizes=sizes, group=3)
  loader = load()
  other = record_loader(records, 2, seed=3, process_index=0, process_count=2, sizes=sizes, group=3)
  epoch = [r.id for _ in range(6) for r in next(loader) + next(other)]
  assert sorted(epoch, key=int) == [str(i) for i in range(24)]
  resumed = load()
  resumed.set_state(loader.get_state())
  assert [r.id for r in next(resumed)] == [r.id for r in next(loader)]
