"""`python tests/train/spread_reward_launch.py <jaxcap.launch flags>`: the trainer with CapRL's accuracy replaced by a
deterministic function of (record, caption) that is 1 for about one caption in five, so that an untrained
student's groups sometimes spread and sometimes do not (the tiny students' real accuracy is 0 everywhere): dynamic
sampling then drops and refills groups. Masks and failures are CapRL's own."""

import dataclasses
import zlib

import numpy as np
from absl import app

from jaxcap import launch
from jaxcap.rewards import caprl
from jaxcap.data.records import align_records

_call = caprl.CapRLReward.__call__


def _spread_call(self, captions, records, *, step=0, first=0):
  batch = _call(self, captions, records, step=step, first=first)
  hits = [zlib.crc32(f"{r.id}|{c}".encode()) % 5 == 0 for c, r in zip(captions, align_records(captions, records))]
  values = np.asarray(hits, np.float32)[:, None] * self.config.reward_scale
  return dataclasses.replace(batch, values=np.where(batch.valid, values, 0.0).astype(np.float32))


caprl.CapRLReward.__call__ = _spread_call

if __name__ == "__main__":
  launch.run() if hasattr(launch, "run") else app.run(launch.main)
