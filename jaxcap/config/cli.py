"""Command-line parsing of config overrides (`--config.x.y=value`) for the programs that take a run config: a value
that does not parse as its field's type, or a config file that does not load, is a config error (exit status 2,
one line naming the flag), as validate()'s errors are, whichever layer finds it. A `--config` value is resolved
first (`jaxcap.config.presets`): a path, or a preset's name from any directory."""

from __future__ import annotations

import sys
from typing import NoReturn, Sequence

CONFIG_ERROR_STATUS = 2


class ConfigError(ValueError):
  """A run config that cannot run (raised before or during the start); the programs exit 2 on it."""


# absl's help flags, which print the help and exit 1; asked for, the help is the answer: exit 0
HELP_FLAGS = ("--help", "-help", "--helpshort", "-helpshort", "--helpfull", "-helpfull", "--helpxml", "-helpxml", "-?")


def parse_flags(argv: Sequence[str]) -> list[str]:
  """absl's flag parsing (for `app.run(main, flags_parser=parse_flags)`), with a flag whose value does not parse
  reported as `error: --flag=value: why` and exit status 2 instead of absl's usage error (status 1); the config
  file named by `--config` resolved first (`resolve_config_args`: a preset by name from any directory, a missing
  file one line and exit 2, with or without overrides); `--help` exits 0."""
  from absl import flags

  try:
    argv = resolve_config_args(argv)
    return flags.FLAGS(list(argv))
  except flags.Error as e:
    message = str(e)
    message = message[len("flag ") :] if message.startswith("flag ") else message
    fail(message)
  except OSError as e:  # no such config file, or one that does not load (met by its overrides' parsing)
    fail(" ".join(line.strip() for line in str(e).splitlines() if line.strip()))
  except SystemExit as e:
    if e.code == 1 and any(arg in HELP_FLAGS for arg in argv):
      sys.exit(0)
    raise


def fail(message: str) -> NoReturn:
  """`error: <message>` on stderr and exit status 2 (a config error)."""
  print(f"error: {message}", file=sys.stderr, flush=True)
  sys.exit(CONFIG_ERROR_STATUS)


def resolve_config_args(argv: Sequence[str], flag: str = "config") -> list[str]:
  """`argv` with the value of `--<flag>=SPEC` / `--<flag> SPEC` replaced by the file it names
  (`jaxcap.config.presets.resolve`: the path as given when it exists, else the preset of that name);
  FileNotFoundError when it names neither. Unchanged when the program defines no such flag."""
  from absl import flags

  from jaxcap.config.presets import resolve

  if flag not in flags.FLAGS:
    return list(argv)
  out, names = list(argv), (f"--{flag}", f"-{flag}")
  for i, arg in enumerate(out):
    name, eq, value = arg.partition("=")
    if name in names and eq:
      out[i] = f"{name}={resolve(value, f'--{flag}')}"
    elif arg in names and i + 1 < len(out):
      out[i + 1] = resolve(out[i + 1], f"--{flag}")
  return out


def loaded(config_flag_value, flag: str = "--config"):
  """The value of a config-file flag, or exit 2 naming the file when it did not load (ml_collections defers that
  error to the first use of the config, as an OSError with a traceback)."""
  try:
    config_flag_value.to_dict()
  except OSError as e:
    fail(f"{flag}: " + " ".join(line.strip() for line in str(e).splitlines() if line.strip()))
  return config_flag_value
