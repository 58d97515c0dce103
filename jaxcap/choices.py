"""Fixed choice lists of the run config, defined once: the schema validates against them and the code that acts on a
choice imports the same tuple. (Open-ended choices are `jaxcap.registry.Registry`s next to their implementations.)

No jaxcap imports here: every layer can import these (the foundation of tests/test_layering.py).
"""

DTYPES = ("float32", "bfloat16")  # model.dtype (compute), model.param_dtype (master weights)
REMAT_POLICIES = ("none", "full", "dots")  # model.remat: activation checkpointing per decoder / vision block
SCHEDULES = ("cosine", "linear", "constant")  # *.optim.schedule, after the linear warm-up
RUBRIC_SOURCES = ("policy", "manifest")  # rubrics.source
RESUME_CHANGES = ("refuse", "allow")  # resume_changes
MASTER_UPDATES = ("exact", "stochastic_rounding")  # *.optim.master_update: how updates land on bf16 masters
NONFINITE_ACTIONS = ("stop", "skip")  # train.on_nonfinite: what a non-finite or diverged step does to the run
ROLLOUT_ENGINES = ("static", "paged")  # rollout.engine: the static-batch sampler or the paged engine
