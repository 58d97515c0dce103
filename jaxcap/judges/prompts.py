"""Loads the judge prompt templates (`prompts/*.jinja`) and renders them into chat messages.

A template has a `### system` and a `### user` section; rendering gives
[{"role": "system", "content": str}, {"role": "user", "content": str}]. Users edit the files in place or pass
their own directory (same file names) to `PromptLibrary`.
"""

from __future__ import annotations

import os
import pathlib
import re

import jinja2

DEFAULT_PROMPT_DIR = pathlib.Path(__file__).parent / "prompts"
LETTERS = "ABCDEFGHI"
_SECTION_RE = re.compile(r"^### (system|user)[ \t]*$", re.M)


class PromptLibrary:
  """Templates by name (file stem), rendered with StrictUndefined so a missing variable is an error."""

  def __init__(self, directory: str | os.PathLike | None = None):
    self.directory = pathlib.Path(directory) if directory else DEFAULT_PROMPT_DIR
    if not self.directory.is_dir():
      raise FileNotFoundError(
        f"Prompt directory {self.directory} does not exist; pass a folder holding "
        f"the *.jinja files of {DEFAULT_PROMPT_DIR}."
      )
    self._env = jinja2.Environment(
      loader=jinja2.FileSystemLoader(str(self.directory)),
      undefined=jinja2.StrictUndefined,
      keep_trailing_newline=True,
      autoescape=False,
    )

  def names(self) -> list[str]:
    return sorted(p.stem for p in self.directory.glob("*.jinja"))

  def render(self, name: str, **variables) -> list[dict[str, str]]:
    """Chat messages for template `name` ("caprl_answer", ...)."""
    try:
      template = self._env.get_template(f"{name}.jinja")
    except jinja2.TemplateNotFound:
      raise FileNotFoundError(
        f"No prompt template {name}.jinja in {self.directory}; available: {self.names()}."
      ) from None
    text = template.render(letters=LETTERS, **variables)
    parts = _SECTION_RE.split(text)
    # parts = [preamble, "system", body, "user", body]
    sections = {parts[i]: parts[i + 1].strip() for i in range(1, len(parts) - 1, 2)}
    if "user" not in sections:
      raise ValueError(f"Prompt template {name}.jinja has no '### user' line; add one before the user text.")
    messages = [{"role": "system", "content": sections["system"]}] if sections.get("system") else []
    return messages + [{"role": "user", "content": sections["user"]}]
