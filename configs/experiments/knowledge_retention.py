"""The papers' forgetting table, small: the start also learns to answer the world's questions with the image (VQA
in the SFT mix); then caption-RL vs more caption-only SFT of equal compute, and what each leaves of that skill."""

from jaxcap.experiments.spec import arm, claim, experiment


def get_config():
  return experiment(
    title="Knowledge retention: caption-RL vs caption-SFT",
    question=(
      "Does caption RL keep a skill the captioner had before (VQA with the image) better than caption-only SFT "
      "of the same number of sequences? 'VQA accuracy' is the policy's own answer to the held-out images' "
      "questions: the option whose whole answer ('B. red') it finds most likely (chance is about 30%)."
    ),
    arms={
      "caption_rl": arm("caprl", start="caption_vqa"),
      "caption_sft": arm("caprl", phase="sft", start="caption_vqa"),
    },
    metrics=["vqa", "qa", "length/words"],
    claims=[
      claim("vqa", "caption_rl", "caption_sft", "+", "10-benchmark average: SFT 69.83, RubiCap 70.73, BalCapRL 72.73"),
      claim("vqa", "start", "caption_sft", "+", "SFT forgets: base 72.55 -> 69.83"),
    ],
  )
