"""Dynamic sampling (verl's filter_groups, DAPO; EasyR1's online_filtering) on the CapRL main job: groups whose G
QA accuracies are all equal (zero advantages) are dropped after judging and refilled from the loader, with a budget
of one extra batch per step, vs the plain step. The spread arm generates up to twice the rollouts per step."""

from jaxcap.experiments.spec import arm, claim, experiment


def get_config():
  # one extra batch: a multiple of rl.batch_size in the full suite (8) and in smoke mode (4)
  spread = arm("caprl", {"rl": {"filter_groups": "spread", "filter_groups_max_extra": 8}})
  return experiment(
    title="Dynamic sampling: zero-spread groups dropped and refilled vs kept",
    question=(
      "In CapRL a group's QA accuracies are often all equal, so its advantages are 0 and it costs a rollout and "
      "an update for no gradient. Does replacing those groups before the update (rl.filter_groups=spread, one "
      "extra batch per step) change held-out QA at the same number of updates, and what share of groups is "
      "dropped per step?"
    ),
    arms={"off": arm("caprl"), "spread": spread},
    metrics=["qa", "length/words"],
    claims=[
      claim("qa", "spread", "off", "none", "DAPO reports dynamic sampling helps reasoning RL; nothing on captions"),
    ],
    # the share of the loader's groups dropped (filter/first_dropped_frac), of all generated groups kept, the
    # rounds per step and the slots left masked; the update batch's zero-spread share in both arms
    step_metrics=[
      "filter/first_dropped_frac",
      "filter/kept_frac",
      "filter/rounds",
      "filter/unfilled",
      "adv/frac_degenerate_groups",
    ],
  )
