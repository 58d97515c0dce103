"""jaxcap: dense image captioners trained with RL from verifiable rewards, in JAX/Flax."""
