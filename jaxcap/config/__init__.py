"""The run config's schema, declared once as typed frozen dataclasses (one per section), each field with its type,
default, one-line doc, validation and resume policy.

  fields     the machinery: `field()`, `Block`, the resume policies ALLOWED / ALTERS / SHAPE
  training   optim, vision_warmup, sft, rl (loss, length_mask, overlong, rollout_correction), train
  sampling   sampling, rollout
  model      model (student), world, data
  judging    judge, rubrics
  run        eval, checkpoint, export, mesh, distributed, and `Run`, the whole tree (with the reward block)
  schema     validate(), the defaults, the registries configs choose from, the resume policy of a key
  changes    differences between two saved configs, leaf by leaf (jaxcap.train.shell.resume)

ml-collections stays the file format and the `--config.x.y=` override layer (jaxcap.config_files builds the
ConfigDict from these defaults). Fixed choice lists live in `jaxcap.choices`, which every layer may import.
"""
