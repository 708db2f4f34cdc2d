"""The math preset's reward as a verl custom reward function (``reward.custom_reward_function``).

``compute_score(data_source, solution_str, ground_truth, extra_info=None)`` = 1 when the response's final
answer (``<answer>...</answer>`` or ``\\boxed{...}``, the last one) equals ``ground_truth`` by math-verify, as
``trace_train.verifiers.math.check_math_answer`` decides for the ``math_python`` environment; else 0.
"""

from __future__ import annotations

from trace_train.verifiers.math import check_math_answer

__all__ = ["compute_score"]


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **_) -> float:
    return check_math_answer(str(solution_str), str(ground_truth)).reward
