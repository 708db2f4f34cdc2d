"""A step's rollouts: the tree rollout engine, its scheduler, the batch it builds and the chat formatting.

``engine`` (TRACE's two stages through ``trace_theory.run_step``) -> ``scheduler`` (generation and
environment calls, concurrently, into a ``batch.BatchBuilder``; returns a ``GrowReport``) -> ``batch``
(trees with the exact tokens of every turn, and the one implementation of a node's path, context and
history); ``chat`` turns messages into token ids without re-tokenising what the model sampled.
"""
