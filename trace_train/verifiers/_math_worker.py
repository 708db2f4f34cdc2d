"""Worker process of ``trace_train.verifiers.math``: runs math-verify without signal-based timeouts.

Protocol on stdin/stdout, one JSON object per line: after start-up the worker writes ``{"ready": true}``;
then for each request ``{"prediction": str, "gold": str}`` it writes ``{"status": s}`` with ``s`` one of
``"correct"``, ``"wrong"``, ``"unparsable"``. The parent enforces timeouts by killing this process.
"""

import json
import logging
import sys

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

CONFIG = (LatexExtractionConfig(), ExprExtractionConfig())


def compare(prediction: str, gold: str) -> str:
    """Both answers wrapped in ``\\boxed{}``, parsed, and compared gold-first (not symmetric)."""
    try:
        gold_parsed = parse("\\boxed{" + gold + "}", extraction_config=CONFIG, parsing_timeout=None)
        predicted = parse("\\boxed{" + prediction + "}", extraction_config=CONFIG, parsing_timeout=None)
        if not gold_parsed or not predicted:
            return "unparsable"
        return "correct" if verify(gold_parsed, predicted, timeout_seconds=None) else "wrong"
    except Exception:  # sympy raises many types on odd input; any of them means no match
        return "unparsable"


def main() -> None:
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout disabled": the parent enforces it
    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        out.write(json.dumps({"status": compare(request["prediction"], request["gold"])}) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
