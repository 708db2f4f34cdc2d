"""Math problems with reference answers, for training (DeepScaleR-style) and evaluation (AIME, AMC, MATH-500).

Columns are found by name unless given: the problem in the first of :data:`PROBLEM_FIELDS`, the answer
in the first of :data:`ANSWER_FIELDS`. Examples of the layouts this covers: DeepScaleR
(``problem``/``answer``/``solution``), MATH-500 and AIME sets (``problem``/``answer`` or
``Problem``/``Answer``), AMC sets (``question``/``answer``). When only a worked ``solution`` exists, the
answer is its last ``\\boxed{}``. Numeric answers become strings.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from trace_train.data.loading import load_rows, pick_field
from trace_train.verifiers.answers import extract_boxed

PROBLEM_FIELDS = ("problem", "Problem", "question", "Question", "prompt")
ANSWER_FIELDS = ("answer", "Answer", "final_answer", "expected_answer", "solution")
ID_FIELDS = ("id", "unique_id", "ID", "idx")


@dataclass(frozen=True)
class MathProblem:
    """One problem: its id (the row's id, else its position), statement and reference answer."""

    id: str
    problem: str
    answer: str


def load_math_problems(
    source: str | os.PathLike,
    *,
    split: str = "train",
    subset: str | None = None,
    problem_field: str | None = None,
    answer_field: str | None = None,
    limit: int | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> list[MathProblem]:
    """Load math problems from a Hub id or a local JSONL/JSON/Parquet file (see ``loading.load_rows``)."""
    rows = load_rows(source, split=split, subset=subset, limit=limit, cache_dir=cache_dir)
    if not rows:
        return []
    problem_key = pick_field(rows[0], PROBLEM_FIELDS, problem_field, "problem")
    answer_key = pick_field(rows[0], ANSWER_FIELDS, answer_field, "answer")
    id_key = next((name for name in ID_FIELDS if name in rows[0]), None)
    return [_problem(row, index, problem_key, answer_key, id_key) for index, row in enumerate(rows)]


def _problem(row, index, problem_key, answer_key, id_key) -> MathProblem:
    problem, answer = row[problem_key], row[answer_key]
    if answer_key == "solution":
        answer = extract_boxed(answer or "")
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        answer = str(answer)
    if not isinstance(problem, str) or not problem.strip():
        raise ValueError(f"row {index}: the problem ({problem_key!r}) is empty or not text: {problem!r}")
    if not isinstance(answer, str) or not answer.strip():
        raise ValueError(
            f"row {index}: the answer ({answer_key!r}) is empty or not text: {row[answer_key]!r}"
        )
    return MathProblem(id=str(row[id_key]) if id_key else str(index), problem=problem, answer=answer.strip())
