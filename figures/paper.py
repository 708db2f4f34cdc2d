"""The paper's numbers that our simulations can be set against (``/work/shared/PAPER.md``, "Results").

Effective ratio: share of prompts whose leaves mix a success and a failure. The math numbers are for
Qwen3-8B; the ablation and budget shapes for Qwen3-8B on multi-hop QA, the ablation at (M, N) = (1024, 2).
"""

GRPO_RATIO = 0.268
"""GRPO (8 rollouts per prompt), math, Qwen3-8B."""
TRACE_RATIO = 0.606
"""TRACE, same setting."""

ABLATION_RATIO = {"uniform_tree": 0.428, "trace": 0.523}
"""Uniform root + uniform prefix, and active root + active prefix (multi-hop QA)."""

SHAPE_RATIO = {(512, 2): 0.424, (512, 6): 0.478, (1024, 2): 0.523}
"""TRACE's effective ratio by budget shape (M root rollouts, N continuations per root rollout)."""

MATH_ACCURACY = {"grpo": 70.0, "trace": 71.1}
"""Average math accuracy (%), Qwen3-8B: the only learning outcome the paper reports for this comparison."""
