"""Checkpoint I/O: Hugging Face directories (`hf_load`, `hf_save`, their key layout `hf_layout`; LoRA adapters
alone in PEFT's layout, `peft`) and, for training state, Orbax."""

from jaxcap.checkpoint.hf_load import CheckpointError, load_hf_checkpoint, read_config
from jaxcap.checkpoint.hf_save import save_hf_checkpoint
from jaxcap.checkpoint.precision import checkpoint_dtype
