"""Answer metrics for (multi-hop) QA, with SQuAD's answer normalisation.

``normalize_answer`` lower-cases, removes punctuation, the articles a/an/the and extra whitespace
(the SQuAD v1.1 evaluation script, also used by HotpotQA and Search-R1). Every metric takes one
prediction and one or more gold answers and returns the best score over the golds.

- ``exact_match``: 1.0 when the normalised strings are equal.
- ``token_f1``: harmonic mean of token precision and recall of the normalised answers (SQuAD F1).
- ``f1_match``: the paper's "exact match at F1 >= 0.3" (our reading: a prediction counts as correct,
  1.0, when its token F1 against some gold answer is at least ``threshold``; else 0.0).

The paper reports multi-hop QA as exact match at F1 >= 0.3 and as token F1 (PAPER.md, Setup); we report
both (``f1_match``, ``token_f1``) next to ``exact_match``. We do not *train* on ``f1_match``: as a binary
reward it pays hedged answers the full 1, since F1 = 2PR / (P + R) stays above 0.3 for a list of
candidates ("yes no" against "yes": P = 1/2, R = 1, F1 = 2/3) and for a lone common word ("of" against
"Duke of York": P = 1, R = 1/3, F1 = 1/2), and a policy trained on it learns to list. Training rewards
(:data:`REWARDS`) are ``exact_match`` (the QA preset's) and the graded ``token_f1`` (a hedge is paid less
than the exact answer: 2/3 against 1), so our training signal is stricter than the paper's reading; the
reported ``f1_match`` is the number to compare with the paper.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable

REWARDS = ("exact_match", "token_f1")
"""The metrics a QA environment can train on; see :func:`is_binary_reward`."""
METRICS = ("exact_match", "f1_match", "token_f1")
"""The metrics a QA environment reports (``f1_match`` is reported, never a reward: see the module docstring)."""

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def check_reward(reward: str) -> str:
    """``reward`` if it is one of :data:`REWARDS`, else a ``ValueError`` naming them."""
    if reward == "f1_match":
        raise ValueError("`reward` 'f1_match' pays hedged answers ('yes no' scores 1 against 'yes'); train on "
                         "'exact_match' or 'token_f1' (f1_match is still reported by metrics() and trace-eval)")
    if reward not in REWARDS:
        raise ValueError(f"`reward` must be one of {REWARDS}, got {reward!r}")
    return reward


def is_binary_reward(reward: str) -> bool:
    """Whether the QA reward ``reward`` is 0 or 1: ``token_f1`` is graded (in [0, 1]), the others are not."""
    return reward != "token_f1"


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    if not isinstance(text, str):
        raise TypeError(f"`text` must be a str, got {type(text).__name__}")
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str | None, golds: str | Iterable[str]) -> float:
    """1.0 if the normalised prediction equals some normalised gold answer, else 0.0 (None scores 0)."""
    golds = _golds(golds)
    if prediction is None:
        return 0.0
    predicted = normalize_answer(prediction)
    return float(any(predicted == normalize_answer(gold) for gold in golds))


def token_f1(prediction: str | None, golds: str | Iterable[str]) -> float:
    """Best SQuAD token F1 of the prediction against the gold answers (None scores 0)."""
    golds = _golds(golds)
    if prediction is None:
        return 0.0
    predicted = normalize_answer(prediction).split()
    return max(_f1(predicted, normalize_answer(gold).split()) for gold in golds)


def f1_match(prediction: str | None, golds: str | Iterable[str], *, threshold: float = 0.3) -> float:
    """1.0 if ``token_f1(prediction, golds) >= threshold``, else 0.0 (the paper's EM at F1 >= 0.3)."""
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"`threshold` must be in (0, 1], got {threshold!r}")
    return float(token_f1(prediction, golds) >= threshold)


def _f1(predicted: list[str], gold: list[str]) -> float:
    common = sum((Counter(predicted) & Counter(gold)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def _golds(golds: str | Iterable[str]) -> list[str]:
    golds = [golds] if isinstance(golds, str) else list(golds)
    if not golds or not all(isinstance(gold, str) for gold in golds):
        raise ValueError(f"`golds` must be a str or a non-empty sequence of str, got {golds!r}")
    return golds
