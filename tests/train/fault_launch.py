"""`python tests/train/fault_launch.py <jaxcap.launch flags>`: the trainer with a fault injected.

JAXCAP_FAULT_AFTER_SAVE=<global step>: raises right after the checkpoint save of that step has been started
(asynchronously, so the save is still in flight when the error propagates), as a bad record or a crashed judge
would mid-run. It first starts a non-daemon thread that never ends (a judge request that never returns), which
would keep the interpreter from exiting; the launcher's exit deadline is cut to 2 s for it.
"""

import os
import threading

from absl import app

from jaxcap import launch
from jaxcap.train.shell import checkpointing

AFTER_SAVE = int(os.environ.get("JAXCAP_FAULT_AFTER_SAVE", "-1"))
_save = checkpointing.RunCheckpointer.save


def _faulty_save(self, step, state, meta):
  _save(self, step, state, meta)
  if step == AFTER_SAVE:
    threading.Thread(target=threading.Event().wait, name="stuck request", daemon=False).start()
    raise RuntimeError(f"injected fault after starting the save of step {step}")


checkpointing.RunCheckpointer.save = _faulty_save
launch.EXIT_GRACE_S = 2.0

if __name__ == "__main__":
  # the launcher's own entry point (its flag parser), or plain absl on a checkout from before it had one
  launch.run() if hasattr(launch, "run") else app.run(launch.main)
