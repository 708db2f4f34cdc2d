"""Math answer checking with ``math-verify``.

The gold answer and the extracted prediction are each wrapped in ``\\boxed{}`` and parsed by
``math_verify.parse`` (LaTeX and plain-expression extraction), then compared with
``math_verify.verify`` (gold first: the comparison is not symmetric). So ``1/2``, ``0.5`` and
``\\frac{1}{2}`` agree, and ``x=3`` matches a gold ``3``.

Timeouts: math-verify bounds parsing and comparison with ``SIGALRM``, which only works in the main
thread of the main interpreter. :func:`check_math_answer` therefore refuses to run in other threads
(RuntimeError) rather than risk an unbounded sympy computation; call it from the main thread, or from
worker processes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
from math_verify.errors import TimeoutException

from trace_train.verifiers.answers import extract_math_answer

_CONFIG = (LatexExtractionConfig(), ExprExtractionConfig())


@dataclass(frozen=True)
class MathVerdict:
    """Result of checking one response: ``reward`` is 1.0 when correct, else 0.0.

    ``status`` is ``"correct"``, ``"wrong"``, ``"no_answer"`` (nothing extractable), ``"unparsable"``
    (extracted text that math-verify cannot parse) or ``"timeout"``.
    """

    status: str
    extracted: str | None

    @property
    def correct(self) -> bool:
        return self.status == "correct"

    @property
    def reward(self) -> float:
        return 1.0 if self.correct else 0.0


def check_math_answer(response: str, gold: str, *, timeout_seconds: int = 5) -> MathVerdict:
    """Extract the final answer of ``response`` (see ``answers``) and compare it with ``gold``."""
    if not isinstance(gold, str) or not gold.strip():
        raise ValueError(f"`gold` must be a non-empty str, got {gold!r}")
    extracted = extract_math_answer(response)
    if extracted is None or not extracted:
        return MathVerdict("no_answer", extracted)
    return MathVerdict(math_answers_equal(extracted, gold, timeout_seconds=timeout_seconds), extracted)


def math_answers_equal(prediction: str, gold: str, *, timeout_seconds: int = 5) -> str:
    """Compare two answer expressions; return ``"correct"``, ``"wrong"``, ``"unparsable"`` or ``"timeout"``."""
    if not isinstance(timeout_seconds, int) or isinstance(timeout_seconds, bool) or timeout_seconds < 1:
        raise ValueError(f"`timeout_seconds` must be a positive integer, got {timeout_seconds!r}")
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("math answer checking uses SIGALRM timeouts and must run in the main thread")
    try:
        gold_parsed = _parse(gold, timeout_seconds)
        predicted = _parse(prediction, timeout_seconds)
        if not gold_parsed or not predicted:
            return "unparsable"
        same = verify(gold_parsed, predicted, timeout_seconds=timeout_seconds, raise_on_error=True)
    except TimeoutException:
        return "timeout"
    except Exception:  # sympy raises many types on odd input; any of them means no match
        return "unparsable"
    return "correct" if same else "wrong"


def _parse(expression: str, timeout_seconds: int) -> list:
    return parse("\\boxed{" + expression + "}", extraction_config=_CONFIG, parsing_timeout=timeout_seconds,
                 raise_on_error=True)
