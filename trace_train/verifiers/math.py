"""Math answer checking with ``math-verify``, with a timeout that always holds.

The gold answer and the extracted prediction are each wrapped in ``\\boxed{}`` and parsed by
``math_verify.parse`` (LaTeX and plain-expression extraction), then compared with
``math_verify.verify`` (gold first: the comparison is not symmetric). So ``1/2``, ``0.5`` and
``\\frac{1}{2}`` agree, and ``x=3`` matches a gold ``3``.

Timeouts: math-verify's own timeouts use ``SIGALRM``, which works only in the main thread and which
nested timeouts inside math-verify can cancel, so a pathological answer could stall a trainer. Here the
comparison runs in a worker process (``_math_worker``, started on first use and reused); when it does
not answer within ``timeout_seconds`` it is killed, the result is ``"timeout"``, and the next call
starts a fresh worker. :class:`MathChecker` is thread-safe (one comparison at a time per checker).
"""

from __future__ import annotations

import atexit
import json
import select
import subprocess
import sys
import threading
from dataclasses import dataclass

from trace_train.child_python import module_command
from trace_train.verifiers.answers import extract_math_answer

_STARTUP_SECONDS = 120.0


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


class MathChecker:
    """A math-verify worker process with a hard per-comparison timeout."""

    def __init__(self):
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None

    def compare(self, prediction: str, gold: str, *, timeout_seconds: float = 5.0) -> str:
        """``"correct"``, ``"wrong"``, ``"unparsable"`` or ``"timeout"`` for two answer expressions."""
        if not isinstance(prediction, str) or not isinstance(gold, str):
            raise TypeError("`prediction` and `gold` must be str")
        if not timeout_seconds > 0:
            raise ValueError(f"`timeout_seconds` must be positive, got {timeout_seconds!r}")
        with self._lock:
            process = self._worker()
            process.stdin.write(json.dumps({"prediction": prediction, "gold": gold}) + "\n")
            process.stdin.flush()
            reply = _read_line(process, timeout_seconds)
            if reply is None:
                self._stop()
                return "timeout"
            return json.loads(reply)["status"]

    def close(self) -> None:
        """Stop the worker (a later comparison starts a new one)."""
        with self._lock:
            self._stop()

    def _worker(self) -> subprocess.Popen:
        if self._process is None or self._process.poll() is not None:
            self._process = subprocess.Popen(
                module_command("trace_train.verifiers._math_worker"),  # isolated: not the caller's cwd or PYTHONPATH
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                bufsize=1,
            )
            if _read_line(self._process, _STARTUP_SECONDS) is None:
                self._stop()
                raise RuntimeError("the math-verify worker did not start (is math-verify installed?)")
        return self._process

    def _stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process.stdin.close()
            self._process.stdout.close()
            self._process = None


def _read_line(process: subprocess.Popen, timeout: float) -> str | None:
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    line = process.stdout.readline() if ready else ""
    return line or None


_SHARED = MathChecker()
atexit.register(_SHARED.close)


def math_answers_equal(prediction: str, gold: str, *, timeout_seconds: float = 5.0) -> str:
    """Compare two answer expressions in the shared worker (see :class:`MathChecker`)."""
    return _SHARED.compare(prediction, gold, timeout_seconds=timeout_seconds)


def check_math_answer(response: str, gold: str, *, timeout_seconds: float = 5.0) -> MathVerdict:
    """Extract the final answer of ``response`` (see ``answers``) and compare it with ``gold``."""
    if not isinstance(gold, str) or not gold.strip():
        raise ValueError(f"`gold` must be a non-empty str, got {gold!r}")
    extracted = extract_math_answer(response)
    if not extracted:
        return MathVerdict("no_answer", extracted)
    return MathVerdict(math_answers_equal(extracted, gold, timeout_seconds=timeout_seconds), extracted)
