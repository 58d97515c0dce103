"""What a user sees at the command line (issue 56): every `python -m jaxcap.*` program answers `--help` with exit 0;
bad input (a mistyped config file, with or without overrides; a missing manifest, captions file or checkpoint; an
output folder that cannot be written) is one `error:` line with exit 2; the run-config presets are found by name
from any directory, from a checkout and from an installed wheel."""

import ast
import json
import shutil
import subprocess
import sys

import pytest

from jaxcap.config import presets
from jaxcap.models.families import preset_names as model_presets
from processes import AS_INSTALLED, ROOT, cli, cpu_env

PACKAGE = ROOT / "jaxcap"


def entry_points() -> list[str]:
  """Every `python -m jaxcap.<name>` program: a package with a __main__.py, or a module run as a script."""
  found = {p.parent.relative_to(ROOT).as_posix().replace("/", ".") for p in PACKAGE.rglob("__main__.py")}
  for path in PACKAGE.rglob("*.py"):
    if path.name != "__main__.py" and 'if __name__ == "__main__":' in path.read_text():
      found.add(path.relative_to(ROOT).with_suffix("").as_posix().replace("/", "."))
  return sorted(name.removeprefix("jaxcap.") for name in found)


def test_the_programs_are_the_documented_ones():
  documented = {"launch", "caption", "eval", "plan", "experiments", "inspect", "judge", "curate_qa"}
  assert documented | {"synthesize_rubrics"} == set(entry_points())


def _one_error_line(out: subprocess.CompletedProcess, status: int = 2) -> str:
  """The single `error:` line of a program that exited `status` without a traceback."""
  errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
  assert out.returncode == status and len(errors) == 1, (out.returncode, out.stderr[-3000:])
  assert "Traceback" not in out.stderr, out.stderr[-3000:]
  return errors[0]


@pytest.mark.slow  # a subprocess per program
@pytest.mark.parametrize("program", entry_points())
def test_help_exits_0(program):
  out = cli(program, "--help", check=False, timeout=300)
  assert out.returncode == 0, (out.returncode, out.stderr[-3000:])
  text = out.stdout + out.stderr
  assert "usage" in text.lower() or "flags:" in text, text[-2000:]
  if program == "plan":  # every registered family's presets, not Qwen2.5-VL's alone
    flat = " ".join(text.split())
    assert all(name in flat for name in model_presets()), flat


def _run(cmd, cwd, timeout=300):
  return subprocess.run(cmd, cwd=cwd, env=cpu_env(1), capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.parametrize("program", ["launch", "plan"])
@pytest.mark.parametrize("overrides", [(), ("--config.rl.steps=3", "--config.seed=1")])
def test_a_mistyped_config_file_is_one_line_and_exit_2(program, overrides):
  out = cli(program, "--config=configs/capr.py", *overrides, check=False, timeout=300)
  line = _one_error_line(out)
  assert "--config=configs/capr.py: no such config file (did you mean caprl?)" in line, line
  assert "caprl, caprl_video" in line


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["configs/caprl.py", "caprl", "caprl.py:paper"])
def test_the_launcher_finds_a_preset_from_another_directory(tmp_path, spec):
  """From a directory with no configs/ in it: the preset loads, its overrides apply and it is validated (a bad
  value, so nothing trains)."""
  out = _run([*AS_INSTALLED, "-m", "jaxcap.launch", f"--config={spec}", "--config.rl.optim.lr=inf"], tmp_path)
  assert "rl.optim.lr=inf: must be a finite number" in out.stderr and out.returncode == 2, out.stderr[-3000:]
  assert not (tmp_path / "runs").exists()


def test_presets_resolve_by_name_path_or_configs_path(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  caprl = ROOT / "configs" / "caprl.py"
  assert presets.resolve("caprl") == presets.resolve("caprl.py") == presets.resolve("configs/caprl.py") == str(caprl)
  assert presets.resolve("configs/caprl.py:paper") == f"{caprl}:paper"
  assert presets.resolve("configs/experiments/losses.py") == str(ROOT / "configs" / "experiments" / "losses.py")
  (tmp_path / "configs").mkdir()
  (tmp_path / "configs" / "caprl.py").write_text("# mine")
  assert presets.resolve("configs/caprl.py") == "configs/caprl.py"  # a file that exists is the user's
  with pytest.raises(FileNotFoundError) as e:
    presets.resolve("configs/rubicapp.py")
  assert "\n" not in str(e.value) and "did you mean rubicap?" in str(e.value)
  assert set(presets.preset_names()) == {p.stem for p in (ROOT / "configs").glob("*.py")}


def test_an_installed_copy_of_the_presets_is_preferred(tmp_path, monkeypatch):
  (tmp_path / "config_presets").mkdir()
  (tmp_path / "config_presets" / "caprl.py").write_text("# installed")
  monkeypatch.setattr(presets, "PACKAGE", tmp_path)
  monkeypatch.chdir(tmp_path)
  assert presets.resolve("configs/caprl.py") == str(tmp_path / "config_presets" / "caprl.py")


def test_setup_installs_configs_as_the_presets_package():
  """setup.py maps jaxcap.config_presets (and its experiments) to configs/, the folder presets.preset_dir reads."""
  tree = ast.parse((ROOT / "setup.py").read_text())
  [mapping] = [
    ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "PRESETS"
  ]
  assert mapping == {"jaxcap.config_presets": "configs", "jaxcap.config_presets.experiments": "configs/experiments"}
  for folder in mapping.values():
    assert list((ROOT / folder).glob("*.py")), folder


@pytest.mark.slow  # builds and installs a wheel (setuptools, no network)
def test_an_installed_wheel_runs_the_presets_from_any_directory(tmp_path):
  pytest.importorskip("setuptools")
  src = tmp_path / "src"
  files = subprocess.run(
    ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
    cwd=ROOT,
    capture_output=True,
    text=True,
    check=True,
  ).stdout.split()
  for name in files:
    if (ROOT / name).is_file():
      (src / name).parent.mkdir(parents=True, exist_ok=True)
      shutil.copy2(ROOT / name, src / name)
  pip = [sys.executable, "-m", "pip"]
  build = _run([*pip, "wheel", str(src), "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "w")], src)
  assert build.returncode == 0, build.stderr[-3000:]
  [wheel] = (tmp_path / "w").glob("*.whl")
  site = tmp_path / "site"
  install = _run([*pip, "install", "--no-deps", "-q", "--target", str(site), str(wheel)], tmp_path)
  assert install.returncode == 0, install.stderr[-3000:]
  env = {**cpu_env(1), "PYTHONPATH": str(site)}  # the installed copy, not the checkout
  cmd = [sys.executable, "-m", "jaxcap.launch", "--config=configs/caprl.py:paper", "--config.rl.stepz=1"]
  out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
  line = _one_error_line(out)
  assert f"{site}/jaxcap/config_presets/caprl.py has no field 'rl.stepz'" in line, line


@pytest.fixture
def manifest(tmp_path):
  """A two-scene synthetic world's manifest, a captions file for it and a file where a folder is expected."""
  from jaxcap.world.dataset import generate_dataset

  path = generate_dataset(tmp_path / "world", 2, seed=0)
  rows = [json.loads(line) for line in path.read_text().splitlines()]
  captions = [{"id": r["id"], "caption": "a red square"} for r in rows]
  (tmp_path / "captions.jsonl").write_text("".join(json.dumps(c) + "\n" for c in captions))
  (tmp_path / "a_file").write_text("x")
  return path


@pytest.mark.slow
@pytest.mark.parametrize(
  "change, names",
  [
    ({"--captioner": "rl=jsonl:missing.jsonl"}, "no caption file at 'missing.jsonl'"),
    ({"--config.manifest": "nowhere/manifest.jsonl"}, "--config.manifest=nowhere/manifest.jsonl: no such file"),
    ({"--config.out_dir": "a_file/report"}, "a_file"),
  ],
)
def test_eval_bad_input_is_one_line_and_exit_2(manifest, change, names):
  assert names in _one_error_line(_eval(manifest, change))


@pytest.mark.slow
def test_eval_runs_on_the_same_input_when_it_is_good(manifest):
  out = _eval(manifest, {})
  assert out.returncode == 0 and (manifest.parents[1] / "report" / "report.md").exists(), out.stderr[-3000:]


def _eval(manifest, change):
  """`python -m jaxcap.eval` on `manifest`'s world and its captions file (prism only, no baselines), `change`d."""
  flags = {"--config.manifest": manifest, "--captioner": "rl=jsonl:captions.jsonl", "--config.out_dir": "report"}
  flags = {**flags, **change, "--config.suites": "prism", "--config.honest": "", "--config.baselines": "{}"}
  return _run([*AS_INSTALLED, "-m", "jaxcap.eval", *(f"{k}={v}" for k, v in flags.items())], manifest.parents[1])
