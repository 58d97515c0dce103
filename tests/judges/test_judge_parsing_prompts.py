"""Reply parsing, prompt templates, cache keys and the circuit breaker (no server)."""

import jinja2
import pytest

from jaxcap.judges import parsing
from jaxcap.judges.endpoint import CircuitBreaker, Endpoint
from jaxcap.judges.parsing import ReplyParseError
from jaxcap.judges.prompts import PromptLibrary
from jaxcap.judges.reply_cache import ReplyCache, cache_key

OPTIONS = ("red", "blue", "green", "Can not answer based on the caption")


@pytest.mark.parametrize(
  "reply,letter",
  [
    ("B", "B"),
    (" b) ".upper(), "B"),
    ("The answer is C.", "C"),
    ("Answer: D", "D"),
    ("(A) red", "A"),
    ("blue", "B"),
    ("Option C", "C"),
    ("I think A, not B", "A"),
  ],
)
def test_parse_letter_reads_letters_and_option_text(reply, letter):
  assert parsing.parse_letter(reply, OPTIONS) == letter


@pytest.mark.parametrize("reply", ["", "I cannot tell.", "E", "purple", "Because the caption is long"])
def test_parse_letter_rejects_replies_without_a_valid_option(reply):
  with pytest.raises(ReplyParseError):
    parsing.parse_letter(reply, OPTIONS)


def test_extract_json_from_fences_prose_and_nested_braces():
  assert parsing.extract_json('{"passed": true}') == {"passed": True}
  assert parsing.extract_json('Sure!\n```json\n{"score": 7}\n```') == {"score": 7}
  assert parsing.extract_json('Verdict: {"claims": ["a {b}", "c"]} done') == {"claims": ["a {b}", "c"]}
  with pytest.raises(ReplyParseError):
    parsing.extract_json('{"claims": ["unterminated"')


def test_schema_checks_types_ranges_enums_and_counts():
  schema = parsing.SCHEMAS["balcaprl_rate_language"]
  assert parsing.parse_json_reply('{"clarity": 7, "fluency": "8", "coherence": 9}', schema) == {
    "clarity": 7.0,
    "fluency": 8.0,
    "coherence": 9.0,
  }
  for bad in (
    '{"clarity": 7, "fluency": 8}',
    '{"clarity": 0, "fluency": 8, "coherence": 9}',
    '{"clarity": "high", "fluency": 8, "coherence": 9}',
  ):
    with pytest.raises(ReplyParseError):
      parsing.parse_json_reply(bad, schema)
  assert parsing.parse_json_reply('{"winner": "A"}', parsing.SCHEMAS["pairwise"]) == {"winner": "a"}
  with pytest.raises(ReplyParseError):
    parsing.parse_json_reply('{"winner": "both"}', parsing.SCHEMAS["pairwise"])
  cov = parsing.SCHEMAS["balcaprl_coverage"]
  assert parsing.parse_flags('{"covered": [true, "no"]}', cov, "covered", 2) == [True, False]
  with pytest.raises(ReplyParseError, match="one per item"):
    parsing.parse_flags('{"covered": [true]}', cov, "covered", 2)


def test_every_template_renders_system_and_user_messages():
  lib = PromptLibrary()
  variables = dict(
    caption="A red circle.",
    question="What colour?",
    options=list(OPTIONS),
    labels=list("ABCD"[: len(OPTIONS)]),
    criterion="c",
    student_caption="s",
    missing=["m"],
    incorrect=[],
    unpointable=[],
    claims=["x", "y"],
    units=["u"],
    reference="r",
    caption_a="a",
    caption_b="b",
    with_image=True,
  )
  names = lib.names()
  assert {
    "caprl_answer",
    "rubicap_check_criterion",
    "rubicap_write_criteria",
    "balcaprl_split_claims",
    "balcaprl_verify_claims",
    "balcaprl_coverage",
    "balcaprl_rate_language",
    "likert_direct",
    "likert_reference",
    "pairwise",
    "curation_answer",
  } <= set(names)
  assert {"caprl_released", "caprl_released_video"} <= set(names)
  for name in names:
    if lib.is_completion(name):
      assert lib.render_completion(name, **variables).endswith("<|im_start|>assistant\nThe answer is"[-13:]), name
      continue
    messages = lib.render(name, **variables)
    assert [m["role"] for m in messages] == ["system", "user"], name
    assert all(m["content"] and "###" not in m["content"] for m in messages), name
  user = lib.render("caprl_answer", **variables)[1]["content"]
  assert "A. red" in user and "D. Can not answer based on the caption" in user and "A red circle." in user
  pointability = lib.render("balcaprl_verify_claims", claims=["x"])[0]["content"]
  assert "point" in pointability and "Meta-commentary" in pointability


def test_templates_are_user_editable_and_strict(tmp_path):
  (tmp_path / "caprl_answer.jinja").write_text("### system\nS {{ caption }}\n### user\nQ {{ question }}\n")
  lib = PromptLibrary(tmp_path)
  assert lib.render("caprl_answer", caption="c", question="q", options=[]) == [
    {"role": "system", "content": "S c"},
    {"role": "user", "content": "Q q"},
  ]
  with pytest.raises(jinja2.UndefinedError):
    lib.render("caprl_answer", caption="c")
  # a name the folder lacks is the shipped template: a folder holds only what it changes
  assert (
    lib.render("likert_direct", caption="c")[1]["content"]
    == PromptLibrary().render("likert_direct", caption="c")[1]["content"]
  )
  with pytest.raises(FileNotFoundError, match="no_such_template.jinja"):
    lib.render("no_such_template")


def test_cache_key_covers_prompt_and_every_sampling_param():
  msgs = [{"role": "user", "content": "q"}]
  base = cache_key(msgs, {"model": "m", "temperature": 0.0, "max_tokens": 8})
  assert base == cache_key(msgs, {"max_tokens": 8, "temperature": 0.0, "model": "m"})  # order-free
  assert base != cache_key(msgs, {"model": "m", "temperature": 0.6, "max_tokens": 8})
  assert base != cache_key(msgs, {"model": "other", "temperature": 0.0, "max_tokens": 8})
  assert base != cache_key([{"role": "user", "content": "q2"}], {"model": "m", "temperature": 0.0, "max_tokens": 8})
  cache = ReplyCache(max_entries=2)
  for k in "abc":
    cache.put(k, k.upper())
  assert cache.get("a") is None and cache.get("c") == "C" and len(cache) == 2


def test_circuit_breaker_opens_probes_and_closes():
  now = [0.0]
  breaker = CircuitBreaker(failure_threshold=2, cooldown_s=10, clock=lambda: now[0])
  breaker.on_failure()
  assert breaker.state == "closed" and breaker.allows()
  breaker.on_failure()
  assert breaker.state == "open" and not breaker.allows()
  now[0] = 10.5
  assert breaker.state == "half_open" and breaker.allows()
  breaker.on_send()
  assert not breaker.allows()  # one probe at a time
  breaker.on_failure()
  assert breaker.state == "open"
  now[0] = 21
  breaker.on_send()
  breaker.on_success()
  assert breaker.state == "closed" and breaker.times_opened == 1


def test_endpoint_reads_api_key_from_env_and_never_shows_it(monkeypatch):
  monkeypatch.setenv("JAXCAP_TEST_KEY", "sk-secret-123")
  endpoint = Endpoint("http://127.0.0.1:1/v1", api_key_env="JAXCAP_TEST_KEY")
  assert endpoint.headers() == {"Authorization": "Bearer sk-secret-123"}
  assert "sk-secret" not in repr(endpoint)
  assert endpoint.chat_url == "http://127.0.0.1:1/v1/chat/completions"
  monkeypatch.delenv("JAXCAP_TEST_KEY")
  with pytest.raises(KeyError, match="JAXCAP_TEST_KEY"):
    endpoint.headers()
  with pytest.raises(ValueError, match="http://"):
    Endpoint("127.0.0.1:8000")
