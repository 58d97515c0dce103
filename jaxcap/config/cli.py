"""Command-line parsing of config overrides (`--config.x.y=value`) for the programs that take a run config: a value
that does not parse as its field's type, or a config file that does not load, is a config error (exit status 2,
one line naming the flag), as validate()'s errors are, whichever layer finds it."""

from __future__ import annotations

import sys
from typing import Sequence

CONFIG_ERROR_STATUS = 2


class ConfigError(ValueError):
  """A run config that cannot run (raised before or during the start); the programs exit 2 on it."""


def parse_flags(argv: Sequence[str]) -> list[str]:
  """absl's flag parsing (for `app.run(main, flags_parser=parse_flags)`), with a flag whose value does not parse
  reported as `error: --flag=value: why` and exit status 2 instead of absl's usage error (status 1)."""
  from absl import flags

  try:
    return flags.FLAGS(list(argv))
  except flags.Error as e:
    message = str(e)
    message = message[len("flag ") :] if message.startswith("flag ") else message
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(CONFIG_ERROR_STATUS)


def loaded(config_flag_value, flag: str = "--config"):
  """The value of a config-file flag, or exit 2 naming the file when it did not load (ml_collections defers that
  error to the first use of the config, as an OSError with a traceback)."""
  try:
    config_flag_value.to_dict()
  except OSError as e:
    print(f"error: {flag}: {str(e).strip()}", file=sys.stderr, flush=True)
    sys.exit(CONFIG_ERROR_STATUS)
  return config_flag_value
