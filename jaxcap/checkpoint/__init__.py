"""Checkpoint I/O: Hugging Face directories (this module) and, for training state, Orbax."""

from jaxcap.checkpoint.hf import CheckpointError, load_hf_checkpoint, read_config, save_hf_checkpoint
from jaxcap.checkpoint.precision import checkpoint_dtype
