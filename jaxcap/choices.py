"""Fixed choice lists of the run config, defined once: the schema validates against them and the code that acts on a
choice imports the same tuple. (Open-ended choices are `jaxcap.registry.Registry`s next to their implementations.)

No jaxcap imports here: every layer can import these (the foundation of tests/test_layering.py).
"""

DTYPES = ("float32", "bfloat16")  # model.dtype (compute), model.param_dtype (master weights)
# model.param_dtype: "auto" holds a LoRA run's frozen checkpoint base in its stored dtype, else float32
PARAM_DTYPES = ("auto", *DTYPES)
REMAT_POLICIES = ("none", "full", "dots")  # model.remat: activation checkpointing per decoder / vision block
SCHEDULES = ("cosine", "linear", "constant")  # *.optim.schedule, after the linear warm-up
RUBRIC_SOURCES = ("policy", "manifest")  # rubrics.source
NO_LETTER_POLICIES = ("retry", "wrong")  # judge.answerer.no_letter: an answer naming no option
RESUME_CHANGES = ("refuse", "allow")  # resume_changes
MASTER_UPDATES = ("exact", "stochastic_rounding")  # *.optim.master_update: how updates land on bf16 masters
NONFINITE_ACTIONS = ("stop", "skip")  # train.on_nonfinite: what a non-finite or diverged step does to the run
ROLLOUT_ENGINES = ("static", "paged")  # rollout.engine: the static-batch sampler or the paged engine
# rollout.attention: the paged engine's decode attention, per backend / the jnp reference / JAX's Pallas kernel
ROLLOUT_ATTENTION = ("auto", "reference", "pallas")
# model.lora.targets: the decoder's attention and MLP projections (sharding rules' names); with model.lora.vision the
# vision tower's / merger's too
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Qwen3.5's linear-attention (Gated DeltaNet) projections: adapted when named (not by default, so a run's targets
# mean the same modules for every family); in_proj_b / in_proj_a (one output per head) are left out
LINEAR_ATTENTION_TARGETS = ("in_proj_qkv", "in_proj_z", "out_proj")
VISION_TARGETS = ("qkv", "proj", "fc1", "fc2", "linear_fc1", "linear_fc2")
WEIGHT_QTYPES = ("", "int8", "int4", "nf4")  # model.lora.weight_qtype: QLoRA's frozen base ('' = not quantized)
