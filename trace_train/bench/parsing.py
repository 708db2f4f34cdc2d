"""How reading an action scales with its length on adversarial input (unclosed tags), against the lazy
regexes it replaced.

    python -m trace_train.bench.parsing            # 100k and 200k characters

For each reader and input, the best of 3 runs at ``n`` and ``2n`` characters, and their ratio: about 2
for linear work, about 4 for quadratic. The environments read every action with ``visible_text``, then
``parse_tool_calls``, then an answer extractor of ``verifiers.answers``. A reader slower than
``--timeout-hint`` at ``n`` is not run at ``2n`` (the old regexes take about 30 s at 100k).
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Callable

from ..envs.tooling import visible_text
from ..verifiers.answers import extract_answer_tag, extract_math_answer
from ..tools.tool_calls import parse_tool_calls

_LAZY_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
_LAZY_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

READERS: dict[str, Callable[[str], object]] = {
    "visible_text": visible_text,
    "parse_tool_calls": parse_tool_calls,
    "lazy regex <think> (old)": lambda text: _LAZY_THINK.sub("", text),
    "lazy regex <tool_call> (old)": lambda text: _LAZY_CALL.findall(text),
    "extract_answer_tag": extract_answer_tag,
    "extract_math_answer": extract_math_answer,
}
INPUTS: dict[str, Callable[[int], str]] = {
    "<think> x n/7": lambda n: "<think>" * (n // 7),
    "<tool_call> x n/11": lambda n: "<tool_call>" * (n // 11),
    "<answer> x n/8": lambda n: "<answer>" * (n // 8),
    "\\boxed{ x n/7": lambda n: "\\boxed{" * (n // 7),
}


def best_time(reader: Callable[[str], object], text: str, repeats: int = 3) -> float:
    """Fastest of ``repeats`` runs, in seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        reader(text)
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chars", type=int, default=100_000, help="the smaller length n (the other is 2n)")
    parser.add_argument("--timeout-hint", type=float, default=5.0,
                        help="skip the 2n run of a reader whose n run took longer than this (seconds)")
    args = parser.parse_args(argv)
    n = args.chars
    print(f"{'reader':32s} {'input':22s} {'n s':>9s} {'2n s':>9s} {'ratio':>6s}")
    for reader_name, reader in READERS.items():
        for input_name, make in INPUTS.items():
            small = best_time(reader, make(n), repeats=1 if "old" in reader_name else 3)
            if small > args.timeout_hint:
                print(f"{reader_name:32s} {input_name:22s} {small:9.4f} {'skipped':>9s}")
                continue
            large = best_time(reader, make(2 * n), repeats=1 if "old" in reader_name else 3)
            print(f"{reader_name:32s} {input_name:22s} {small:9.4f} {large:9.4f} {large / small:6.1f}")


if __name__ == "__main__":
    main()
