"""jaxcap: dense image captioners trained with RL from verifiable rewards, in JAX/Flax."""

import logging as _logging

# jaxcap uses transformers for tokenizers and configs only, never its PyTorch models: its import-time advice that
# PyTorch is missing (printed in every install without torch) says nothing a jaxcap user needs.
_logging.getLogger("transformers").addFilter(lambda record: "PyTorch was not found" not in record.getMessage())
