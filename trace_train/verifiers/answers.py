"""Extracting the final answer from a model's response.

Two formats are recognised:

- the answer tag ``<answer>...</answer>`` (Search-R1's format; the last complete tag counts), and
- LaTeX ``\\boxed{...}`` or ``\\fbox{...}`` with balanced braces, or the short form ``\\boxed 5``
  (the last one counts).

For math, :func:`extract_math_answer` prefers the answer tag, and inside it a ``\\boxed{}`` if there
is one; without a tag it takes the last box in the whole response. For QA, the answer is the tag's text.
"""

from __future__ import annotations

import re

_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{|\\boxed +([^\s$]+)")


def extract_answer_tag(text: str) -> str | None:
    """Stripped content of the last complete ``<answer>...</answer>``, or None."""
    _check_text(text)
    matches = _TAG.findall(text)
    return matches[-1].strip() if matches else None


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (balanced braces) or ``\\boxed x``, or None."""
    _check_text(text)
    found = None
    for match in _BOX.finditer(text):
        if match.group(1) is not None:
            found = match.group(1)
            continue
        depth, start = 1, match.end()
        for position in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[position], 0)
            if depth == 0:
                found = text[start:position]
                break
    return None if found is None else found.strip()


def extract_math_answer(text: str) -> str | None:
    """The final math answer: the answer tag (its box if it has one), else the last box, else None."""
    tagged = extract_answer_tag(text)
    if tagged is not None:
        boxed = extract_boxed(tagged)
        return boxed if boxed is not None else tagged
    return extract_boxed(text)


def _check_text(text: str) -> None:
    if not isinstance(text, str):
        raise TypeError(f"`text` must be a str, got {type(text).__name__}")
