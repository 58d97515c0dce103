"""Bad input to the main job fails early with a message that names the thing and the fix."""

import json

import pytest

from jaxcap.config_files import base_config, validate
from jaxcap.data.manifest import ManifestError, check_media, read_manifest
from jaxcap.train.rollouts.loader import record_loader


def _manifest(tmp_path, rows):
  path = tmp_path / "m.jsonl"
  path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
  return path


def test_corrupt_manifest_line_is_named(tmp_path):
  path = _manifest(tmp_path, [{"id": "a", "image": "a.png"}, "{not json", {"id": "c", "image": "c.png"}])
  with pytest.raises(ManifestError, match=r"m\.jsonl:2 is not valid JSON"):
    read_manifest(path)


def test_row_without_media_or_id_is_named(tmp_path):
  with pytest.raises(ManifestError, match=r"m\.jsonl:1 .*'b'.*has no media; every row needs 'image', 'video'"):
    read_manifest(_manifest(tmp_path, [{"id": "b"}]))
  with pytest.raises(ManifestError, match=r"m\.jsonl:1: .*without an 'id'"):
    read_manifest(_manifest(tmp_path, [{"image": "x.png"}]))


def test_a_repeated_id_is_refused_naming_both_rows(tmp_path):
  """Rewards key questions, rubrics and scenes by id: a second row with an id would be judged as the first."""
  rows = [{"id": "a", "image": "a.png"}, {"id": "b", "image": "b.png"}, {"id": "a", "image": "c.png"}]
  with pytest.raises(ManifestError, match=r"m\.jsonl:3: id 'a' is also the id of row 1; give every row its own id"):
    read_manifest(_manifest(tmp_path, rows))


@pytest.mark.parametrize(
  "media", [{"image": "https://example.com/a.jpg"}, {"frames": ["f0.png", "s3://bucket/f1.png"]}]
)
def test_a_url_is_refused_with_the_fix(tmp_path, media):
  with pytest.raises(
    ManifestError, match=r"m\.jsonl:1 \(id 'a'\): '.*://.*' is a URL; media are read from local files"
  ):
    read_manifest(_manifest(tmp_path, [{"id": "a", **media}]))


@pytest.mark.parametrize(
  "media, shown",
  [
    ({"image": "../../etc/passwd"}, "'../../etc/passwd'"),
    ({"image": "/etc/passwd"}, "'/etc/passwd'"),
    ({"frames": ["f0.png", "sub/../../f1.png"]}, "'sub/../../f1.png'"),
  ],
  ids=["relative", "absolute", "a-frame"],
)
def test_a_media_path_outside_the_data_root_is_refused_naming_the_row(tmp_path, media, shown):
  """Issue 57: a row `../../etc/passwd` was opened (and failed only as "cannot identify image"). The data root is
  the manifest's folder unless data.media_root names another; data.allow_outside_paths reads paths anywhere."""
  folder = tmp_path / "data"
  folder.mkdir()
  path = _manifest(folder, [{"id": "a", "image": "a.png"}, {"id": "b", **media}])
  with pytest.raises(ManifestError) as e:
    read_manifest(path)
  message = str(e.value)
  assert message.startswith(f"{path}:2 (id 'b'): media path {shown} resolves to ") and "\n" not in message
  assert f"outside the data root {folder};" in message
  assert "--config.data.media_root=DIR" in message and "--config.data.allow_outside_paths=true" in message
  assert [r.id for r in read_manifest(path, allow_outside_paths=True).records] == ["a", "b"]
  if not shown.startswith("'/"):  # a root that holds them: the relative paths resolve as before
    records = read_manifest(path, media_root=tmp_path.parent).records
    assert records[1].image or records[1].frames


def test_paths_inside_the_data_root_read_as_before(tmp_path):
  folder = tmp_path / "data"
  (folder / "images").mkdir(parents=True)
  rows = [{"id": "a", "image": "images/a.png"}, {"id": "b", "image": str(folder / "images" / "b.png")}]
  rows += [{"id": "c", "image": "images/../c.png"}]  # `..` that stays inside
  records = read_manifest(_manifest(folder, rows)).records
  assert [r.image for r in records] == [
    str(folder / "images/a.png"),
    str(folder / "images/b.png"),
    str(folder / "images/../c.png"),
  ]
  # a named root: the manifest's own folder need not hold the media
  outside = tmp_path / "elsewhere.png"
  path = _manifest(folder, [{"id": "a", "image": str(outside)}])
  assert read_manifest(path, media_root=tmp_path).records[0].image == str(outside)


def test_the_trainer_reads_its_manifests_under_data_media_root(tmp_path, monkeypatch):
  """The setup confines the user's manifests (data.media_root / data.allow_outside_paths), before any compute."""
  from jaxcap.train.shell import setup

  (tmp_path / "images").mkdir()
  (tmp_path / "manifests").mkdir()
  path = _manifest(tmp_path / "manifests", [{"id": "a", "image": "../images/a.png"}])
  config = base_config()
  config.data.train_manifest = str(path)
  config.data.check_media = False
  config.sft.targets = "reference"
  monkeypatch.setattr(setup, "_student", lambda *a: (None, None))
  monkeypatch.setattr(setup, "build_judge", lambda *a, **k: None)
  monkeypatch.setattr(setup, "preflight_judge", lambda judge, *a, **k: judge, raising=False)
  monkeypatch.setattr(setup, "check_record_media", lambda media, **k: media)
  with pytest.raises(
    ManifestError, match=r"m\.jsonl:1 \(id 'a'\): media path '\.\./images/a\.png' .* outside the data root"
  ):
    setup.build(config, tmp_path / "run")
  config.data.media_root = str(tmp_path)
  assert [r.id for r in setup.build(config, tmp_path / "run").train_records] == ["a"]
  config.data.media_root, config.data.allow_outside_paths = "", True
  assert [r.id for r in setup.build(config, tmp_path / "run").train_records] == ["a"]


def test_missing_image_is_named_before_any_compute(tmp_path):
  records = read_manifest(_manifest(tmp_path, [{"id": "a", "image": "missing.png"}])).records
  assert records[0].image == str(tmp_path / "missing.png")  # relative to the manifest's folder
  with pytest.raises(ManifestError, match=r"record 'a': image file .*missing\.png does not exist"):
    check_media(records)


def test_loader_is_resumable_and_sharded(tmp_path):
  from jaxcap.data.records import ImageRecord

  records = [ImageRecord(id=str(i), image="x") for i in range(10)]
  it = record_loader(records, 3, seed=0, process_index=0, process_count=1)
  [next(it) for _ in range(2)]
  state = it.get_state()
  want = [[r.id for r in next(it)] for _ in range(4)]  # crosses an epoch boundary
  it2 = record_loader(records, 3, seed=0, process_index=0, process_count=1)
  it2.set_state(state)
  assert [[r.id for r in next(it2)] for _ in range(4)] == want
  p0 = record_loader(records, 2, seed=0, process_index=0, process_count=2)
  p1 = record_loader(records, 2, seed=0, process_index=1, process_count=2)
  one = record_loader(records, 4, seed=0, process_index=0, process_count=1)
  for _ in range(4):  # two processes together see exactly the one-process global batch
    assert [r.id for r in next(p0)] + [r.id for r in next(p1)] == [r.id for r in next(one)]


def test_invalid_values_are_all_reported():
  c = base_config()
  c.rl.estimator = "ppo"
  c.rl.batch_size, c.rl.micro_batches = 6, 4
  c.reward = {"caprl": {"weight": 1.0, "questions": 3}}
  with pytest.raises(ValueError) as e:
    validate(c)
  msg = str(e.value)
  assert "rl.estimator='ppo'" in msg and "rl.batch_size=6" in msg and "reward.caprl.questions" in msg


# An unknown config key on the command line: test_resume_safety.py::test_unknown_field_names_the_closest_existing_ones
# (one trainer subprocess for the path, asserting the exit status, the key named and the closest fields).


def test_the_printed_eval_command_carries_the_runs_data_root(tmp_path):
  """The run's closing `jaxcap.eval` command reads the held-out manifest under the root the run read it under."""
  from jaxcap.train.shell.run_end import eval_command

  c = base_config()
  c.workdir = str(tmp_path / "run")
  c.data.train_manifest = c.data.eval_manifest = str(_manifest(tmp_path, [{"id": "a", "image": "a.png"}]))
  (tmp_path / "run" / "captions").mkdir(parents=True)
  (tmp_path / "run" / "captions" / "sft_end.jsonl").write_text("")
  command = eval_command(validate(c))
  assert "media_root" not in command and "allow_outside_paths" not in command
  c.data.media_root, c.data.allow_outside_paths = "/data", True
  assert "--config.media_root=/data --config.allow_outside_paths=true" in eval_command(validate(c))
