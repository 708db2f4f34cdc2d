"""Write the math preset's data as verl parquet files: DeepScaleR to train on, AIME 2024 to validate on.

``python -m trace_train.integrations.verl.prepare_math --out data/trace_math`` writes ``train.parquet`` and
``test.parquet`` with verl's columns: ``prompt`` (the ``math_python`` environment's system prompt and the
problem), ``data_source``, ``reward_model`` ({"style": "rule", "ground_truth": answer}), ``agent_name``
(``trace_tool_agent``) and ``extra_info`` (the problem's id). Problems are read by ``trace_train``'s loader.
"""

from __future__ import annotations

import argparse
import os

from trace_train.data.math import load_math_problems
from trace_train.envs.math_python import SYSTEM_PROMPT

DATA_SOURCE = "trace_math"
SETS = {"train": ("agentica-org/DeepScaleR-Preview-Dataset", "train"), "test": ("HuggingFaceH4/aime_2024", "train")}


def rows(source: str, split: str, *, max_tool_calls: int = 8, limit: int | None = None) -> list[dict]:
    system = SYSTEM_PROMPT.format(max_tool_calls=max_tool_calls)
    return [{"data_source": DATA_SOURCE, "agent_name": "trace_tool_agent",
             "prompt": [{"role": "system", "content": system}, {"role": "user", "content": p.problem}],
             "reward_model": {"style": "rule", "ground_truth": p.answer}, "extra_info": {"id": p.id}}
            for p in load_math_problems(source, split=split, limit=limit)]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for train.parquet and test.parquet")
    parser.add_argument("--limit", type=int, default=None, help="at most this many problems per file")
    args = parser.parse_args(argv)
    import pandas as pd

    os.makedirs(args.out, exist_ok=True)
    for name, (source, split) in SETS.items():
        path = os.path.join(args.out, f"{name}.parquet")
        pd.DataFrame(rows(source, split, limit=args.limit)).to_parquet(path)
        print(f"{path}: {source} ({split})")


if __name__ == "__main__":
    main()
