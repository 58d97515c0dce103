"""`read_manifest` beyond jaxcap's JSONL: the released CapRL / CapRL++ verl rows (JSONL, Parquet), a folder of
images and videos, and Hugging Face datasets (`save_to_disk` folders, `hf://` through `load_dataset`)."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from jaxcap.data.records import ImageRecord
from jaxcap.data.manifest import ManifestError, read_manifest
from jaxcap.data.records import MultipleChoiceQuestion

CANNOT = "Can not answer based on the caption"


def _png(path, seed=0):
  path.parent.mkdir(parents=True, exist_ok=True)
  Image.fromarray(np.random.default_rng(seed).integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(path)


def _jsonl(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return path


def _columns(rows):
  """The rows with every row's keys, null where a row has none: the columns Arrow (Parquet, `datasets`) stores
  (`from_pylist` / `from_list` would take the first row's keys only)."""
  keys = list(dict.fromkeys(k for r in rows for k in r))
  return [{k: r.get(k) for k in keys} for r in rows]


def _verl(images, truth, **extra):
  return {
    "prompt": [{"role": "user", "content": "<image>Please describe this image in detail."}],
    "images": images,
    "reward_model": {"ground_truth": truth, "style": "model"},
    **extra,
  }


VERL_ROWS = [
  _verl(  # dict ground truth, plain choices; the id from extra_info.index
    ["imgs/a.png"],
    [{"question": "What colour is the car?", "choices": ["Red", "Blue", "Green", "Black"], "answer": "C"}],
    extra_info={"index": 17, "split": "train"},
  ),
  _verl(  # pair ground truth with option lines and a trailing cannot-answer line; no id: the row number
    [{"image": "imgs/b.png"}],
    [
      [f"How many dogs are there?\n   - A) One\n   - B) Two\n   - C) Three\n   - D) Four\n   - E) {CANNOT}", "B"],
      [f"Where is the cat?\n   - A) On the sofa\n   - B) Under the table\n   - F) {CANNOT}", "a"],
    ],
  ),
  _verl(  # choices labelled "A) x" and "A. x" (the released video QA set's quirk); an id column
    [{"bytes": None, "path": "imgs/c.png"}],
    [
      {"question": "What is the weather?", "choices": ["A) Sunny", "B) Rainy", "C) Snowy"], "answer": "B"},
      {"question": "What time is it?", "choices": ["A. Dawn", "B. Noon", "C. Dusk", f"D. {CANNOT}"], "answer": "C"},
      [f"What is in the sky?\n   - A) A. A kite\n   - B) B. A plane\n   - C) {CANNOT}", "B"],
    ],
    id="clip-3",
  ),
]

EXPECTED_QUESTIONS = {
  "17": (MultipleChoiceQuestion("17/q0", "What colour is the car?", ("Red", "Blue", "Green", "Black"), "Green"),),
  "2": (
    MultipleChoiceQuestion("2/q0", "How many dogs are there?", ("One", "Two", "Three", "Four"), "Two"),
    MultipleChoiceQuestion("2/q1", "Where is the cat?", ("On the sofa", "Under the table"), "On the sofa"),
  ),
  "clip-3": (
    MultipleChoiceQuestion("clip-3/q0", "What is the weather?", ("Sunny", "Rainy", "Snowy"), "Rainy"),
    MultipleChoiceQuestion("clip-3/q1", "What time is it?", ("Dawn", "Noon", "Dusk"), "Dusk"),
    MultipleChoiceQuestion("clip-3/q2", "What is in the sky?", ("A kite", "A plane"), "A plane"),
  ),
}


def _check_verl_records(records, folder):
  assert [r.id for r in records] == ["17", "2", "clip-3"]
  assert [r.image for r in records] == [str(folder / "imgs" / f"{c}.png") for c in "abc"]  # relative to the file
  assert {r.id: r.questions for r in records} == EXPECTED_QUESTIONS


def test_verl_rows_from_jsonl_and_parquet(tmp_path):
  _check_verl_records(read_manifest(_jsonl(tmp_path / "caprl.jsonl", VERL_ROWS)).records, tmp_path)
  # Parquet holds one type per column: the dict and pair ground truths go in separate files, and a file's rows
  # each carry every column (null where a row has none), as the released Parquet files do
  pq.write_table(pa.Table.from_pylist(VERL_ROWS[:1]), tmp_path / "dicts.parquet")
  pq.write_table(pa.Table.from_pylist(VERL_ROWS[1:2]), tmp_path / "pairs.parquet")
  records = read_manifest(tmp_path / "dicts.parquet").records + read_manifest(tmp_path / "pairs.parquet").records
  assert [r.id for r in records] == ["17", "1"]  # the row number of its own file
  assert records[0].questions == EXPECTED_QUESTIONS["17"]
  assert [q.options for q in records[1].questions] == [q.options for q in EXPECTED_QUESTIONS["2"]]
  assert [q.answer for q in records[1].questions] == ["Two", "On the sofa"]
  # the row's own prompt: the user turn's text, its <image> placeholder gone (the media lead the prompt)
  assert {r.prompt for r in records} == {"Please describe this image in detail."}


def test_a_rows_own_prompt_is_what_the_batcher_asks(monkeypatch):
  """Batcher.inputs captions each record with its own prompt, else data.prompt (media and processor stubbed)."""
  import threading
  from types import SimpleNamespace

  import jaxcap.train.rollouts.batching as batching

  asked = []
  monkeypatch.setattr(batching.data_lib, "conversation", lambda record, prompt, *a, **k: asked.append(prompt))
  batcher = batching.Batcher.__new__(batching.Batcher)
  batcher.config = SimpleNamespace(data=SimpleNamespace(prompt="Describe this image in detail.", image_size=0,
                                                        pad_to_multiple=1))  # fmt: skip
  processor = lambda convs, **kw: convs
  processor.vision_cfg, processor.video_cfg = SimpleNamespace(max_image_pixels=0), None
  batcher.processor, batcher.media_threads, batcher._processing = processor, 1, threading.Lock()
  own = ImageRecord(id="a", image="a.mp4", prompt="Describe the video in time order.")
  batcher.inputs([own, ImageRecord(id="b", image="b.png")])
  assert asked == ["Describe the video in time order.", "Describe this image in detail."]
  assert ImageRecord.from_json({"id": "x", "prompt": "<video>Describe it."}).prompt == "Describe it."
  assert ImageRecord.from_json(own.to_json()) == own and "prompt" not in ImageRecord(id="b").to_json()


def test_verl_videos_and_rows_without_questions(tmp_path):
  rows = [
    {"prompt": [], "videos": ["clips/a.mp4"], "reward_model": {"ground_truth": []}, "extra_info": {"index": 0}},
    {"prompt": [], "videos": [{"video": ["f/0.png", "f/1.png"]}], "reward_model": {"ground_truth": []}},
    {"prompt": [], "reward_model": {"ground_truth": []}, "extra_info": {"video_path": "/data/clips/c.webm"}},
  ]
  path = _jsonl(tmp_path / "v.jsonl", rows)
  with pytest.raises(
    ManifestError, match=r"v\.jsonl:3 \(id '3'\): media path '/data/clips/c\.webm' .* outside the data"
  ):
    read_manifest(path)  # an absolute path outside the manifest's folder: read only when allowed
  a, b, c = read_manifest(path, allow_outside_paths=True).records
  assert (a.id, a.image, a.frames, a.is_video) == ("0", str(tmp_path / "clips/a.mp4"), (), True)
  assert (b.id, b.image, b.frames) == ("2", "", (str(tmp_path / "f/0.png"), str(tmp_path / "f/1.png")))
  assert (c.id, c.image, c.is_video) == ("3", "/data/clips/c.webm", True)  # CapRL++'s extra_info.video_path


@pytest.mark.parametrize(
  "truth, says",
  [
    ([{"question": "Colour?", "choices": ["Red", "Blue"], "answer": "C"}], "answer 'C' is not the letter"),
    ([["Colour?\n   - A) Red\n   - B) Blue", "D"]], "answer 'D' is not the letter"),
    ([["Colour?\n   - A) Red\n   - B) Blue\n   - C) " + CANNOT, "C"]], "its answer is the 'cannot answer' option"),
    ([["Colour? Red or blue", "A"]], "has no option lines"),
    ([{"question": "Colour?", "choices": ["Red", "Blue"], "answer": "Red"}], "answer 'Red' is not the letter"),
  ],
)
def test_a_bad_verl_row_names_the_file_and_row(tmp_path, truth, says):
  good = _verl(["a.png"], [{"question": "Q?", "choices": ["x", "y"], "answer": "A"}])
  path = _jsonl(tmp_path / "caprl.jsonl", [good, _verl(["b.png"], truth)])
  with pytest.raises(ManifestError) as e:
    read_manifest(path)
  assert str(e.value).startswith(f"{path}:2: ground_truth[0]") and says in str(e.value), str(e.value)


def test_images_stored_as_bytes_are_refused_with_the_fix(tmp_path):
  row = _verl([{"bytes": b"\x89PNG...", "path": "a.png"}], [])
  pq.write_table(pa.Table.from_pylist([row]), tmp_path / "bytes.parquet")
  with pytest.raises(ManifestError) as e:
    read_manifest(tmp_path / "bytes.parquet")
  assert str(e.value).startswith(f"{tmp_path / 'bytes.parquet'}:1: its image is stored as bytes"), str(e.value)
  assert ".save(" in str(e.value) and "give the rows their paths" in str(e.value)


def test_a_folder_of_images_and_videos(tmp_path):
  root = tmp_path / "photos"
  for i, rel in enumerate(["b.png", "a/z.jpg", "a/deeper/y.webp", "same.png", "same.jpg"]):
    _png(root / rel, i)
  (root / "clips").mkdir()
  (root / "clips" / "walk.mp4").write_bytes(b"")  # listed by its suffix, not decoded here
  (root / "notes.txt").write_text("not media")
  _png(root / ".thumbs" / "b.png")  # hidden: passed over
  records = read_manifest(root).records
  assert [r.id for r in records] == ["a/deeper/y", "a/z", "b", "clips/walk", "same.jpg", "same.png"]
  expected = ["a/deeper/y.webp", "a/z.jpg", "b.png", "clips/walk.mp4", "same.jpg", "same.png"]
  assert [r.image for r in records] == [str(root / p) for p in expected]
  assert [r.is_video for r in records] == [False, False, False, True, False, False]
  assert all(not r.questions for r in records)
  (tmp_path / "empty").mkdir()
  (tmp_path / "empty" / "notes.txt").write_text("not media")
  with pytest.raises(ManifestError, match="folder .*empty holds no image or video files"):
    read_manifest(tmp_path / "empty")


JAXCAP_ROWS = [
  {
    "id": "a",
    "image": "imgs/a.png",
    "questions": [{"id": "a/q0", "question": "Colour?", "options": ["Red", "Blue"], "answer": "Blue"}],
    "reference_caption": "A blue square.",
  },
  {"id": "b", "image": "imgs/b.png", "rubric": {"image_id": "b", "criteria": [{"text": "Names the dog"}]}},
]


# Arrow holds one type per column: verl rows whose ground truths are all dicts and whose images are all paths
VERL_ARROW_ROWS = [
  VERL_ROWS[0],
  _verl(["imgs/c.png"], VERL_ROWS[2]["reward_model"]["ground_truth"][:2], id="clip-3"),
  _verl(["imgs/d.png"], [{"question": "Why?", "choices": ["A) Because", "B) No"], "answer": "A"}]),
]


@pytest.mark.parametrize("rows", [JAXCAP_ROWS, VERL_ARROW_ROWS], ids=["jaxcap", "verl"])
def test_a_saved_dataset_reads_as_the_jsonl_of_its_rows(tmp_path, rows):
  import datasets

  jsonl = read_manifest(_jsonl(tmp_path / "rows.jsonl", rows))
  datasets.Dataset.from_list(_columns(rows)).save_to_disk(tmp_path / "saved")
  saved = read_manifest(tmp_path / "saved")
  assert saved == jsonl and saved.records  # media relative to the folder holding the dataset, as to a file's
  via_hub = read_manifest(f"hf://{tmp_path / 'saved'}")
  assert via_hub == jsonl
  if rows is JAXCAP_ROWS:
    assert saved.records[0].questions[0].answer == "Blue" and saved.records[1].rubric.criteria[0].text
  else:  # ids from extra_info.index, the id column, the row number; the questions as the JSONL's
    assert [r.id for r in saved.records] == ["17", "clip-3", "3"]
    assert saved.records[1].questions == EXPECTED_QUESTIONS["clip-3"][:2]


def test_an_image_column_reads_as_its_paths_and_refuses_bytes(tmp_path):
  """An Image column holding paths reads as them; `save_to_disk` embeds the files' bytes (and keeps their base names
  only), which are refused naming the row and the fix."""
  import datasets

  _png(tmp_path / "imgs" / "a.png")
  features = datasets.Features({"id": datasets.Value("string"), "image": datasets.Image()})
  dataset = datasets.Dataset.from_dict({"id": ["a"], "image": [str(tmp_path / "imgs/a.png")]}, features=features)
  pq.write_table(dataset.with_format("arrow")[:], tmp_path / "paths.parquet")  # {"bytes": None, "path": ...}
  (record,) = read_manifest(tmp_path / "paths.parquet").records
  assert (record.id, record.image) == ("a", str(tmp_path / "imgs/a.png"))
  dataset.save_to_disk(tmp_path / "saved")
  with pytest.raises(ManifestError, match=r"saved:1: its image is stored as bytes .* plain string column"):
    read_manifest(tmp_path / "saved")


def test_a_dataset_dict_names_its_splits(tmp_path):
  import datasets

  datasets.DatasetDict({"train": datasets.Dataset.from_list(_columns(JAXCAP_ROWS))}).save_to_disk(tmp_path / "dd")
  with pytest.raises(ManifestError, match=r"DatasetDict \(splits \['train'\]\).*dd/train"):
    read_manifest(tmp_path / "dd")
  assert [r.id for r in read_manifest(tmp_path / "dd" / "train").records] == ["a", "b"]


def test_hf_load_dataset_of_a_local_parquet_folder(tmp_path, monkeypatch):
  import datasets

  monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")  # not the user's cache
  folder = tmp_path / "hub_like"
  folder.mkdir()
  train = pa.Table.from_pylist(_columns(JAXCAP_ROWS))
  pq.write_table(train, folder / "train.parquet")
  pq.write_table(train.slice(1), folder / "test.parquet")
  expected = read_manifest(_jsonl(folder / "rows.jsonl", JAXCAP_ROWS)).records
  (folder / "rows.jsonl").unlink()
  assert read_manifest(f"hf://{folder}").records == expected  # split "train" by default, paths relative to it
  assert [r.id for r in read_manifest(f"hf://{folder}:test").records] == ["b"]
  with pytest.raises(ManifestError, match=r"hf://.*:nope: datasets.load_dataset.*save_to_disk"):
    read_manifest(f"hf://{folder}:nope")
