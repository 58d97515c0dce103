"""Loads the judge prompt templates (`prompts/*.jinja`) and renders them into chat messages.

A template has a `### system` and a `### user` section; rendering gives
[{"role": "system", "content": str}, {"role": "user", "content": str}]. A completion template has one `### completion`
section instead: the raw prompt text for an OpenAI-compatible /completions endpoint, chat markers and any
pre-filled start of the answer written out (`render_completion`), as the released CapRL answerer is asked. Users
edit the files in place or pass their own directory (same file names) to `PromptLibrary`.

Variables are data (captions, references, questions, options, criteria): the sections are split from the
template's source before rendering, so a caption holding a "### user" line cannot add a turn, and strings that
spell a chat control token ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "[/INST]", ...) get an invisible break
after their first character (`plain_text`), so the judge server's tokenizer reads characters, not the end of
the turn.
"""

from __future__ import annotations

import os
import pathlib
import re

import jinja2

DEFAULT_PROMPT_DIR = pathlib.Path(__file__).parent / "prompts"
LETTERS = "ABCDEFGHI"
_SECTION_RE = re.compile(r"^### (system|user|completion)[ \t]*$", re.M)
# Chat control tokens of the common judge families: ChatML / Llama 3 / Phi "<|...|>", Gemma's turn markers,
# Llama 2 / Mistral's "[INST]" and "</s>".
_CONTROL_RE = re.compile(r"<\|[^\s|<>]{1,64}\|>|</?(?:s|start_of_turn|end_of_turn|bos|eos|pad)>|\[/?INST\]")
_BREAK = "\u200b"  # zero-width space: the text reads the same, no tokenizer matches the control token


def plain_text(value):
  """`value` (a string, or lists / tuples of them, nested) with every control-token spelling broken by a
  zero-width space after its first character; other values unchanged."""
  if isinstance(value, str):
    return _CONTROL_RE.sub(lambda m: m.group(0)[0] + _BREAK + m.group(0)[1:], value)
  if isinstance(value, (list, tuple)):
    return type(value)(plain_text(v) for v in value)
  return value


class PromptLibrary:
  """Templates by name (file stem), rendered with StrictUndefined so a missing variable is an error."""

  def __init__(self, directory: str | os.PathLike | None = None):
    """`directory`: templates read before the shipped ones (a file of a shipped name replaces it)."""
    self.directory = pathlib.Path(directory) if directory else DEFAULT_PROMPT_DIR
    if not self.directory.is_dir():
      raise FileNotFoundError(
        f"Prompt directory {self.directory} does not exist; pass a folder of *.jinja templates (its files are read "
        f"before the shipped ones in {DEFAULT_PROMPT_DIR})."
      )
    folders = [str(self.directory)] + ([str(DEFAULT_PROMPT_DIR)] if self.directory != DEFAULT_PROMPT_DIR else [])
    self._env = jinja2.Environment(
      loader=jinja2.FileSystemLoader(folders),
      undefined=jinja2.StrictUndefined,
      keep_trailing_newline=True,
      autoescape=False,
    )
    self._compiled: dict[tuple[str, str], dict[str, jinja2.Template]] = {}

  def names(self) -> list[str]:
    return sorted({p.stem for folder in (self.directory, DEFAULT_PROMPT_DIR) for p in folder.glob("*.jinja")})

  def _sections(self, name: str) -> dict[str, jinja2.Template]:
    """The template's sections, split from its source before any data is in and compiled (cached per source)."""
    source, _, _ = self._env.loader.get_source(self._env, f"{name}.jinja")
    if (name, source) not in self._compiled:
      parts = _SECTION_RE.split(source)  # [preamble, "system", body, "user", body] or [preamble, "completion", body]
      bodies = {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}
      if ("user" in bodies) == ("completion" in bodies):
        raise ValueError(
          f"Prompt template {name}.jinja needs a '### user' line before the user text (a chat template) or one "
          "'### completion' line before the raw prompt (a completion template), not both"
        )
      self._compiled[(name, source)] = {k: self._env.from_string(b) for k, b in bodies.items()}
    return self._compiled[(name, source)]

  def is_completion(self, name: str) -> bool:
    """Whether template `name` is a raw completion prompt (a `### completion` section), not chat messages."""
    self._check(name)
    return "completion" in self._sections(name)

  def render(self, name: str, **variables) -> list[dict[str, str]]:
    """Chat messages for template `name` ("caprl_answer", ...)."""
    text = self._render(name, variables)
    if "completion" in text:
      raise ValueError(f"Prompt template {name}.jinja is a completion template: render it with render_completion")
    messages = [{"role": "system", "content": text["system"]}] if text.get("system") else []
    return messages + [{"role": "user", "content": text["user"]}]

  def render_completion(self, name: str, **variables) -> str:
    """The raw prompt of completion template `name`; only a trailing newline of the file is dropped, so a
    pre-filled answer start ("The answer is") ends the prompt exactly."""
    text = self._render(name, variables, strip=False)
    if "completion" not in text:
      raise ValueError(f"Prompt template {name}.jinja is a chat template: render it with render")
    return text["completion"].lstrip("\n").removesuffix("\n")

  def _check(self, name: str) -> None:
    try:
      self._env.get_template(f"{name}.jinja")  # checks the whole file's syntax
    except jinja2.TemplateNotFound:
      raise FileNotFoundError(
        f"No prompt template {name}.jinja in {self.directory}; available: {self.names()}."
      ) from None

  def _render(self, name: str, variables, strip: bool = True) -> dict[str, str]:
    self._check(name)
    data = {k: plain_text(v) for k, v in variables.items()}
    text = {k: t.render(letters=LETTERS, **data) for k, t in self._sections(name).items()}
    return {k: v.strip() for k, v in text.items()} if strip else text
