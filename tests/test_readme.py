"""The README's two set-up commands are there, its evaluator command is the one the main job prints at its end, and
the Python example of docs/real-run.md runs as written (on a tiny local checkpoint instead of the 3B one)."""

import re
from pathlib import Path

import numpy as np
from PIL import Image

import jaxcap.models as M
from hf_reference import save_tiny_checkpoint

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
REAL_RUN = ROOT / "docs" / "real-run.md"


def test_readme_has_the_two_set_up_commands():
  lines = README.read_text().splitlines()
  assert 'pip install -e ".[test]" && python -m pytest' in lines
  assert "pip install -e . && python -m jaxcap.launch --config=configs/caprl.py" in lines


def test_readme_eval_command_is_what_the_main_job_prints(tmp_path, monkeypatch):
  """Flag for flag, the README's `jaxcap.eval` command is `run_end.eval_command` of configs/caprl.py's run (in its
  workdir: the held-out manifest and the captions it writes), so it covers what the run captions
  (`--config.num_images` = the run's eval.num_images)."""
  from jaxcap.config_files import validate
  from jaxcap.train.shell.run_end import eval_command
  from processes import load_config

  readme = README.read_text()
  [command] = [c for c in re.findall(r"```bash\n(.*?)```", readme, re.S) if "jaxcap.eval" in c]
  command = " ".join(command.replace("\\\n", " ").split())
  config = validate(load_config("caprl"))
  monkeypatch.chdir(tmp_path)
  for path in ("world/heldout/manifest.jsonl", "captions/sft_end.jsonl", "captions/rl_end.jsonl"):
    (Path(config.workdir) / path).parent.mkdir(parents=True, exist_ok=True)
    (Path(config.workdir) / path).write_text("")
  assert command == eval_command(config)
  assert f"--config.num_images={config.eval.num_images}" in command


def test_readme_python_example_runs(tmp_path, monkeypatch):
  code = re.findall(r"```python\n(.*?)```", REAL_RUN.read_text(), re.S)[0]
  ckpt = tmp_path / "ckpt"
  save_tiny_checkpoint(M.tiny(), 0, ckpt)
  Image.fromarray((np.random.RandomState(0).rand(120, 90, 3) * 255).astype(np.uint8)).save(tmp_path / "photo.jpg")
  monkeypatch.chdir(tmp_path)
  code = code.replace('"/models/Qwen2.5-VL-3B-Instruct"', repr(str(ckpt))).replace(
    '"/tmp/exported"', repr(str(tmp_path / "exp"))
  )
  namespace = {}
  exec(compile(code, "docs/real-run.md", "exec"), namespace)
  assert 0 <= namespace["next_token"] < M.tiny().text.vocab_size
  assert (tmp_path / "exp" / "model.safetensors").exists() and (tmp_path / "exp" / "tokenizer.json").exists()
