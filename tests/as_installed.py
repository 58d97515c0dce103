"""Runs a module (`python as_installed.py -m jaxcap.launch ARGS`) or a script (`python as_installed.py SCRIPT ARGS`)
as it runs in a user's install of jaxcap, where torch is absent: torch is the tests' reference implementation,
never a runtime dependency. In the test environment, tensorboardX and transformers would import it in every
training process (about 2 s of CPU each, dozens of processes per suite); here `import torch` fails as if it were
not installed, so a runtime import of torch would also fail the tests."""

import os
import runpy
import sys

if __name__ == "__main__":
  sys.modules["torch"] = None  # `import torch` raises ImportError; importlib.util.find_spec("torch") is None
  if sys.argv[1] == "-m":
    module, sys.argv = sys.argv[2], [sys.argv[2], *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
  else:
    script, sys.argv = sys.argv[1], sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as `python SCRIPT` puts its folder first
    runpy.run_path(script, run_name="__main__")
