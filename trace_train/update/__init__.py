"""The policy update: rollout trees into training sequences, their log-probabilities, and the loss.

``sequences`` (one row per root-to-leaf path) or ``packing`` (one row per tree, tree attention mask) ->
``logprobs`` (chunked over the vocabulary) -> ``loss`` (clipped policy gradient with tree advantages).
"""
