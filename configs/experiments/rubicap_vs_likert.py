"""RubiCap's baselines: rubric reward vs a judge's direct 1-10 score vs a score against the reference, and plain
SFT continued for as many sequences."""

from jaxcap.experiments.spec import arm, claim, experiment


def get_config():
  return experiment(
    title="RubiCap vs Direct-Likert vs Reference-Likert vs SFT",
    question=(
      "Do per-image rubrics give a better captioner than a judge's holistic score, and which reward can the "
      "trained policy's captions be beaten on by red-team attacks ('own reward hacked %': share of images where "
      "some attack scores above the policy's caption under the reward it trained on)?"
    ),
    arms={
      "rubicap": arm("rubicap"),
      "likert_direct": arm("rubicap", {"reward": {"likert_direct": {"weight": 1.0}}}),
      "likert_reference": arm("rubicap", {"reward": {"likert_reference": {"weight": 1.0}}}),
      "sft": arm("caprl", phase="sft"),
    },
    metrics=["caparena/win_rate", "captionqa/w100", "qa", "dcscore/f1", "length/words", "hack/own/any"],
    claims=[
      claim("caparena/win_rate", "rubicap", "likert_direct", "+", "win rate vs base 70.8 vs 66.2 (PixMoCap)"),
      claim("caparena/win_rate", "rubicap", "likert_reference", "+", "70.8 vs 67.2"),
      claim("caparena/win_rate", "rubicap", "sft", "+", "70.8 vs 50.0"),
      claim("captionqa/w100", "rubicap", "start", "+", "CaptionQA @100 words +9.5 points (3B) over the base"),
      claim("hack/own/any", "likert_reference", "rubicap", "+", "Reference-Likert is 'hacked badly'"),
    ],
    smoke_arms=["rubicap", "sft"],
  )
