"""One OpenAI-compatible server of a judge role (its circuit breaker: `jaxcap.judges.breaker`)."""

from __future__ import annotations

import dataclasses
import os

from jaxcap.judges.breaker import CircuitBreaker  # noqa: F401  (re-exported: its old home)


@dataclasses.dataclass(frozen=True)
class Endpoint:
  """An OpenAI-compatible base URL (e.g. "http://127.0.0.1:8000/v1").

  The API key is never stored here: `api_key_env` names the environment variable that holds it, read at
  request time, so keys stay out of configs, reprs and logs.
  """

  url: str
  api_key_env: str | None = None

  def __post_init__(self):
    if not self.url.startswith(("http://", "https://")):
      raise ValueError(
        f"Endpoint url {self.url!r} must start with http:// or https:// (e.g. http://127.0.0.1:8000/v1)."
      )

  @property
  def chat_url(self) -> str:
    base = self.url.rstrip("/")
    return base if base.endswith("/chat/completions") else base + "/chat/completions"

  @property
  def completions_url(self) -> str:
    """The raw-prompt endpoint beside the chat one (/v1/completions)."""
    return self.chat_url.removesuffix("/chat/completions") + "/completions"

  @property
  def models_url(self) -> str:
    base = self.url.rstrip("/")
    return base.removesuffix("/chat/completions") + "/models"

  def headers(self) -> dict[str, str]:
    if not self.api_key_env:
      return {}
    key = os.environ.get(self.api_key_env)
    if not key:
      raise KeyError(
        f"Environment variable {self.api_key_env} (API key of endpoint {self.url}) is not set; "
        f"export {self.api_key_env}=<the key the server was started with> or set judge.api_key_env='' "
        "(--api-key-env '') for servers without auth."
      )
    return {"Authorization": f"Bearer {key}"}
