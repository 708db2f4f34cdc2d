"""Question-answering examples: HotpotQA, 2WikiMultiHopQA, Search-R1/FlashRAG-style rows, the demo set.

Columns are found by name unless given. Gold answers come from the first of :data:`ANSWER_FIELDS`
present: ``golden_answers`` (a list; Search-R1, FlashRAG), ``answer`` (a string or list; HotpotQA,
2WikiMultiHopQA) or ``answers`` (a list, or SQuAD's ``{"text": [...]}``). Supporting titles come from
``supporting_facts`` in either HotpotQA layout: the Hub's ``{"title": [...], "sent_id": [...]}`` or the
original JSON's ``[[title, sentence_index], ...]`` (2WikiMultiHopQA uses the latter); they are empty when
the column is absent.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from trace_train.data.loading import load_rows, pick_field

QUESTION_FIELDS = ("question", "query", "Question")
ANSWER_FIELDS = ("golden_answers", "answer", "answers")
ID_FIELDS = ("id", "_id", "qid")


@dataclass(frozen=True)
class QAExample:
    """One question with its gold answers and the titles of its supporting passages (in order, unique)."""

    id: str
    question: str
    answers: tuple[str, ...]
    supporting_titles: tuple[str, ...] = ()


def load_qa_examples(
    source: str | os.PathLike,
    *,
    split: str = "train",
    subset: str | None = None,
    question_field: str | None = None,
    answer_field: str | None = None,
    limit: int | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> list[QAExample]:
    """Load QA examples from a Hub id (e.g. ``hotpotqa/hotpot_qa`` with subset ``distractor``) or a file."""
    rows = load_rows(source, split=split, subset=subset, limit=limit, cache_dir=cache_dir)
    if not rows:
        return []
    question_key = pick_field(rows[0], QUESTION_FIELDS, question_field, "question")
    answer_key = pick_field(rows[0], ANSWER_FIELDS, answer_field, "answer")
    id_key = next((name for name in ID_FIELDS if name in rows[0]), None)
    return [_example(row, index, question_key, answer_key, id_key) for index, row in enumerate(rows)]


def demo_paths() -> tuple[Path, Path]:
    """Paths of the bundled demo corpus (id/title/text JSONL) and its two-hop questions (JSONL)."""
    root = resources.files("trace_train.data") / "demo"
    return Path(str(root / "corpus.jsonl")), Path(str(root / "questions.jsonl"))


def load_demo_questions() -> list[QAExample]:
    """The 12 bundled two-hop demo questions (written for this project; answers are in the demo corpus)."""
    return load_qa_examples(demo_paths()[1])


def _example(
    row: dict[str, Any], index: int, question_key: str, answer_key: str, id_key: str | None
) -> QAExample:
    question = row[question_key]
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"row {index}: the question ({question_key!r}) is empty or not text: {question!r}")
    answers = _answers(row[answer_key])
    if not answers:
        raise ValueError(f"row {index}: no gold answer in {answer_key!r}: {row[answer_key]!r}")
    return QAExample(
        id=str(row[id_key]) if id_key else str(index),
        question=question.strip(),
        answers=answers,
        supporting_titles=_titles(row.get("supporting_facts")),
    )


def _answers(value: Any) -> tuple[str, ...]:
    if isinstance(value, dict):
        value = value.get("text", [])
    values = [value] if isinstance(value, (str, int, float)) else list(value or [])
    return tuple(str(item).strip() for item in values if str(item).strip())


def _titles(facts: Any) -> tuple[str, ...]:
    if isinstance(facts, dict):
        titles = facts.get("title", [])
    else:
        titles = [fact[0] for fact in facts or []]
    return tuple(dict.fromkeys(titles))
