"""CapRL's QA ablations: curated questions vs leaky ones kept; questions per caption N = 1 / 4 / 8."""

from jaxcap.experiments.spec import arm, claim, experiment


def get_config():
  n = lambda k: arm("caprl", {"reward": {"caprl": {"weight": 1.0, "preset": "paper", "questions_per_caption": k}}})  # noqa: E731
  return experiment(
    title="CapRL: QA curation, questions per caption",
    question=(
      "Does curating the training questions (keep a question only if the description answers it and a blank "
      "caption does not) raise held-out QA, and how many questions per caption should a reward sample?"
    ),
    arms={
      "curated_n4": arm("caprl"),  # the CapRL paper preset: N = 4
      "leaky_n4": arm("caprl", curated=False),
      "n1": n(1),
      "n8": n(8),
    },
    metrics=["qa", "length/words", "captionqa/full", "precision"],
    claims=[
      claim("qa", "curated_n4", "leaky_n4", "+", "leaky QA costs ~1.1 points (48.5 vs 47.4)"),
      claim("qa", "curated_n4", "n1", "+", "N=4 48.4 vs N=1 47.3"),
      claim("qa", "n8", "curated_n4", "=", "N=8 48.3 vs N=4 48.4"),
    ],
  )
