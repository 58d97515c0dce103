"""A real tiny run of the main job with rollout records every RL step and every installed tracker (W&B offline,
MLflow's local SQLite store), then `python -m jaxcap.eval` on its held-out captions: its rollout records, the
inspector rendered in headless Chromium (asserting on the DOM: captions, reward bars, evidence tables with each
option's text, the eval estimates, hash navigation; with a screenshot), and the trackers' scalars read back from
their files, equal to metrics.jsonl, with rollout tables that carry the image, prompt and evidence."""

import glob
import importlib.util
import json
import math
import os
import re
import shutil
import struct
from pathlib import Path

import pytest

from processes import AS_INSTALLED, cpu_env, launch, run_command, tiny_run

pytestmark = pytest.mark.slow

# mlflow-skinny alone has no SQLite store (the tracking extra installs mlflow): the test logs to MLflow where it can
TRACKERS = ["tensorboard"] + [
  t
  for t, needs in (("wandb", ()), ("mlflow", ("sqlalchemy",)))
  if all(importlib.util.find_spec(m) for m in (t, *needs))
]
EVAL_IMAGES = 4


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("inspect") / "run"
  trackers = "(" + ",".join(repr(t) for t in TRACKERS) + ",)"
  flags = tiny_run({"logging.rollouts_every": 1, "logging.trackers": trackers, "eval.num_images": EVAL_IMAGES})
  env = cpu_env(1, WANDB_MODE="offline", WANDB_SILENT="true", MLFLOW_TRACKING_URI=None)
  out = launch("caprl", *flags, workdir=workdir, env=env)
  assert "warning: tracker" not in out.stderr, out.stderr[-2000:]
  captions = lambda name: f"{name}=jsonl:{workdir / 'captions' / f'{name}_end.jsonl'}"
  run_command(
    [*AS_INSTALLED, "-m", "jaxcap.eval", "--config=configs/eval.py", f"--config.num_images={EVAL_IMAGES}",
     f"--config.manifest={workdir / 'world' / 'heldout' / 'manifest.jsonl'}", "--captioner", captions("sft"),
     "--captioner", captions("rl"), "--config.compare_to=sft", "--config.empty_captions=score",
     f"--config.out_dir={workdir / 'eval_report'}"],
    env=env,
  )  # fmt: skip
  return workdir


def _lines(path):
  return [json.loads(line) for line in path.read_text().splitlines()]


def _expected(workdir):
  """(phase, step, key) -> value of every finite number in metrics.jsonl."""
  out = {}
  for row in _lines(workdir / "metrics.jsonl"):
    for k, v in row.items():
      if k not in ("phase", "step") and isinstance(v, (int, float)) and math.isfinite(v):
        out[(row["phase"], row["step"], k)] = float(v)
  return out


def _table_rows_carry_image_prompt_and_evidence(columns, data, image_ok):
  rows = [dict(zip(columns, r)) for r in data]
  assert len(rows) == 4  # rl.batch_size 2 x rl.num_samples 2
  for r in rows:
    assert image_ok(r["image"]) and r["prompt"] and r["reference"]
    assert (
      r["evidence"].startswith("[caprl/accuracy]\n") and " answered " in r["evidence"] and ", gold " in r["evidence"]
    )


def test_rollout_records_of_a_real_run(run):
  assert sorted(p.name for p in (run / "rollouts").iterdir()) == ["step_000001.jsonl", "step_000002.jsonl"]
  for step in (1, 2):
    groups = _lines(run / "rollouts" / f"step_{step:06d}.jsonl")
    assert [g["rank"] for g in groups] == ["best", "worst"]  # rl.batch_size 2: both groups
    for g in groups:
      assert g["step"] == step and os.path.exists(g["media"]) and len(g["samples"]) == 2  # rl.num_samples
      for s in g["samples"]:
        assert s["stop"] in ("stop", "length") and 1 <= s["tokens"] <= 8  # sampling.max_new_tokens
        questions = s["evidence"]["caprl/accuracy"]["questions"]
        if s["rewards"]["caprl/accuracy"] is not None:
          right = sum(q.get("correct", False) for q in questions) / len(questions)
          assert s["rewards"]["caprl/accuracy"] == pytest.approx(right)


def test_inspector_in_headless_chromium(run, tmp_path):
  from browser import chrome
  from selenium.webdriver.common.by import By
  from selenium.webdriver.support.ui import Select, WebDriverWait

  from jaxcap.inspect.cli import build_site

  driver = chrome()  # skips, naming the missing package, when there is no browser
  try:
    index = build_site(run, tmp_path / "site")
    driver.get(index.as_uri())
    text = lambda e: e.get_attribute("textContent")
    for step in (2, 1):  # the latest step first, then the browser's step picker
      if step == 1:
        Select(driver.find_element(By.ID, "step-select")).select_by_visible_text("step 1")
      groups = _lines(run / "rollouts" / f"step_{step:06d}.jsonl")
      shown = driver.find_elements(By.CSS_SELECTOR, "#groups .group")
      assert len(shown) == len(groups)
      captions = sorted(s["caption"] for g in groups for s in g["samples"])
      assert sorted(text(e) for e in driver.find_elements(By.CSS_SELECTOR, "#groups .sample .caption")) == captions
      bars = driver.find_elements(By.CSS_SELECTOR, "#groups .bar")
      rewards = sorted(s["rewards"]["caprl/accuracy"] for g in groups for s in g["samples"])
      assert sorted(float(b.get_attribute("data-value")) for b in bars) == pytest.approx(rewards)
      for b in bars:
        width = b.find_element(By.TAG_NAME, "span").get_attribute("style")
        assert width == f"width: {float(b.get_attribute('data-value')) * 100:g}%;"
      # each caption's CapRL evidence: a row per question with the answered and the gold option's text
      for g, shown_group in zip(sorted(groups, key=lambda g: -g["group_reward"]), shown):
        if g["group_reward"] is None:
          continue
        for s, card in zip(
          sorted(g["samples"], key=lambda s: -(s["reward"] or 0)), shown_group.find_elements(By.CSS_SELECTOR, ".sample")
        ):
          questions = [q for q in s["evidence"]["caprl/accuracy"]["questions"] if "letter" in q]
          rows = card.find_elements(By.CSS_SELECTOR, "table.questions tr.right, table.questions tr.wrong")
          assert len(rows) == len(questions)
          for q, row in zip(questions, rows):
            cells = [text(c) for c in row.find_elements(By.TAG_NAME, "td")]
            option = lambda letter: (
              f"{letter}. {q['options'][q['labels'].index(letter)]}" if letter else "no option picked"
            )
            assert cells[1] == q["question"] and cells[3:] == [
              option(q["letter"]),
              option(q["gold"]),
              "✓" if q["correct"] else "✗",
            ]
            assert cells[2] == "".join(f"{label}. {o}" for label, o in zip(q["labels"], q["options"]))
    driver.find_element(By.CSS_SELECTOR, "button[data-view=heldout]").click()
    assert driver.current_url.endswith("#heldout")
    pairs = driver.find_elements(By.CSS_SELECTOR, "#view-heldout .pair")
    sft = {r["id"]: r["caption"] for r in _lines(run / "captions" / "sft_end.jsonl")}
    rl = {r["id"]: r["caption"] for r in _lines(run / "captions" / "rl_end.jsonl")}
    assert len(pairs) == EVAL_IMAGES == len(sft) == len(rl)
    for p in pairs:
      image = p.get_attribute("data-id")
      assert text(p.find_element(By.CSS_SELECTOR, ".left .caption")) == sft[image]
      assert text(p.find_element(By.CSS_SELECTOR, ".right .caption")) == rl[image]
    # the eval report's estimates, as the report holds them: mean [low, high]
    driver.find_element(By.CSS_SELECTOR, "button[data-view=evals]").click()
    report = json.loads((run / "eval_report" / "report.json").read_text())
    for model in report["models"]:
      estimate = model["estimates"]["captionqa/full"]
      cell = driver.find_element(
        By.CSS_SELECTOR, f"td.estimate[data-model={model['name']}][data-metric='captionqa/full']"
      )
      shown = [float(x) for x in re.findall(r"-?\d+\.\d+", text(cell).split("vs")[0])]  # one decimal: percentages
    assert shown == pytest.approx([estimate["mean"], estimate["low"], estimate["high"]], abs=0.051)
    # hash navigation: back returns to the held-out view, forward to the reports, a URL opens its view
    shown = lambda view: WebDriverWait(driver, 5).until(lambda d: d.find_element(By.ID, f"view-{view}").is_displayed())
    driver.back()  # hashchange is handled after back() returns: wait for it
    assert shown("heldout") and driver.current_url.endswith("#heldout")
    driver.forward()
    assert shown("evals") and driver.current_url.endswith("#evals")
    driver.find_element(By.CSS_SELECTOR, "button[data-view=rollouts]").click()
    shot = tmp_path / "inspector.png"
    assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    if os.environ.get("JAXCAP_SCREENSHOT_DIR"):
      shutil.copy(shot, os.environ["JAXCAP_SCREENSHOT_DIR"])
    assert not [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
  finally:
    driver.quit()


def _wandb_records(path):
  """The protobuf records of a W&B transaction log (.wandb): 7-byte header, then 32 KiB blocks of chunks, each
  crc32 u32, length u16, type u8 (1 full, 2 first, 3 middle, 4 last)."""
  from wandb.proto import wandb_internal_pb2

  data, i, block, buf = path.read_bytes(), 7, 32768, b""
  assert data[:4] == b":W&B"
  while i + 7 <= len(data):
    left = block - i % block
    if left < 7:
      i += left
      continue
    _, n, kind = struct.unpack("<IHB", data[i : i + 7])
    if n == 0 and kind == 0:  # block padding
      i += left
      continue
    buf += data[i + 7 : i + 7 + n]
    i += 7 + n
    if kind in (1, 4):
      record = wandb_internal_pb2.Record()
      record.ParseFromString(buf)
      yield record
      buf = b""


@pytest.mark.skipif("wandb" not in TRACKERS, reason="wandb is not installed (pip install -e '.[tracking]')")
def test_wandb_offline_scalars_equal_metrics_jsonl(run):
  from jaxcap.train.logs.trackers import tracker_key

  (log,) = glob.glob(str(run / "wandb" / "offline-run-*" / "run-*.wandb"))
  logged, tables, config = {}, 0, {}
  for record in _wandb_records(Path(log)):
    if record.WhichOneof("record_type") == "run":
      config.update({i.key: json.loads(i.value_json) for i in record.run.config.update})
    if record.WhichOneof("record_type") != "history":
      continue
    # a key is `key` or a one-element `nested_key`; a table is a nested key below its name
    name = lambda i: i.key or (i.nested_key[0] if len(i.nested_key) == 1 else "")
    items = {name(i): json.loads(i.value_json) for i in record.history.item if name(i)}
    tables += any(len(i.nested_key) > 1 and i.nested_key[0] == "rl/rollouts" for i in record.history.item)
    phases = {k[: -len("/step")] for k in items if k.endswith("/step")}
    for k, v in items.items():
      phase = k.partition("/")[0]
      if phase in phases and k != f"{phase}/step":
        logged[(phase, items[f"{phase}/step"], k)] = v
  assert logged == pytest.approx({(p, s, tracker_key(p, k)): v for (p, s, k), v in _expected(run).items()})
  assert any(p == "vision" for p, _, _ in logged) and not any(k.startswith("vision/vision/") for _, _, k in logged)
  assert tables == 2  # one rollout table per record file
  files = run / "wandb" / "offline-run-*" / "files" / "media" / "table" / "rl"
  (table, _) = sorted(glob.glob(str(files / "rollouts_*.table.json")))
  doc = json.loads(Path(table).read_text())
  # the run's copy of a table names a wandb.Image cell by its type (the image goes with the table's artifact);
  # a path would be the path, a missing image null
  _table_rows_carry_image_prompt_and_evidence(doc["columns"], doc["data"], lambda v: v == "Image")
  assert config["rl"]["steps"] == 2 and config["logging"]["rollouts_every"] == 1  # the run config


@pytest.mark.skipif("mlflow" not in TRACKERS, reason="mlflow is not installed (pip install -e '.[tracking]')")
def test_mlflow_sqlite_store_scalars_equal_metrics_jsonl(run, monkeypatch):
  monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)  # the default store needs no permission to read
  from mlflow.tracking import MlflowClient

  from jaxcap.train.logs.trackers import default_mlflow_uri, mlflow_key, tracker_key

  assert (run / "mlflow.db").is_file() and not (run / "mlruns").exists()
  client = MlflowClient(tracking_uri=default_mlflow_uri(run))
  run_id = (run / "trackers" / "mlflow_run_id").read_text().strip()
  data = client.get_run(run_id).data
  expected = _expected(run)
  keys = {(phase, key) for phase, _, key in expected}
  assert set(data.metrics) == {mlflow_key(p, k) for p, k in keys} == {tracker_key(p, k) for p, k in keys}
  logged = {}
  for phase, key in keys:
    for m in client.get_metric_history(run_id, mlflow_key(phase, key)):
      logged[(phase, m.step, key)] = m.value
  assert logged == pytest.approx(expected)
  assert data.params["rl.steps"] == "2" and data.params["logging.rollouts_every"] == "1"
  artifacts = Path(client.get_run(run_id).info.artifact_uri.removeprefix("file://"))
  assert artifacts.is_relative_to(run / "mlartifacts")  # beside the database, not under the current directory
  table = json.loads((artifacts / "rollouts" / "step_000002.json").read_text())
  _table_rows_carry_image_prompt_and_evidence(table["columns"], table["data"], lambda v: (artifacts / v).is_file())
