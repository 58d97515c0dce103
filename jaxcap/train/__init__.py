"""Training: the run shell around the RL and SFT learners.

shell      the run: `Trainer` (trainer), what it is built from (setup), its phases, working directory, resume
           checks, checkpoint integrity, step guards, memory check, held-out evaluation
rollouts   the rollout source: the data loader, records -> device batches, judged rounds, group refill,
           off-policy look-ahead
learner    the learners: a judged round -> one RL update; SFT's update on target captions
steps      the pure jitted steps (rl_step, sft_step, log-prob passes), the train state and optimizer, and
           `programs`, the one place a run's programs are built
packing    packed micro-batches: rows of a token budget, their inputs, steps and the packed-or-padded choice
logs       what a run records: metrics.jsonl, trackers, curves, rollout records
"""
