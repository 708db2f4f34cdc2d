"""Write the target-sum rows: ``python examples/target_sum/make_rows.py`` (from the repository root).

``rows.jsonl``: 96 rows, the user's file (three distinct allowed numbers from 1-9; 1-3 turns; the target is
the sum of ``turns`` allowed numbers, so every row is solvable). Its first 24 rows are what a run holds out
when it is given no ``task.eval``; ``rows_heldout.jsonl`` is exactly those 24 rows and ``rows_train.jsonl``
the other 72, so a run given ``task.eval=rows_heldout.jsonl`` is scored on the same episodes.
``rows_easier.jsonl``: the advice's "easier mix" (docs/training.md): the 72 training rows plus 72 rows with
one turn and the target among the allowed numbers, none of whose prompts is held out.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
HELD_OUT = 24


def make_rows(n: int, *, seed: int, turns=(1, 2, 3), prefix: str = "t") -> list[dict]:
    rng, rows = random.Random(seed), []
    while len(rows) < n:
        numbers = sorted(rng.sample(range(1, 10), 3))
        k = rng.choice(turns)
        target = sum(rng.choice(numbers) for _ in range(k))
        rows.append({"id": f"{prefix}{len(rows)}", "target": target, "numbers": numbers, "turns": k})
    return rows


def prompt(row: dict) -> tuple:
    return row["target"], tuple(row["numbers"]), row["turns"]


def write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def main() -> None:
    rows = make_rows(96, seed=0)
    write(HERE / "rows.jsonl", rows)
    write(HERE / "rows_heldout.jsonl", rows[:HELD_OUT])
    write(HERE / "rows_train.jsonl", rows[HELD_OUT:])
    held = {prompt(row) for row in rows[:HELD_OUT]}
    easy = [row for row in make_rows(200, seed=1, turns=(1,), prefix="e") if prompt(row) not in held][:72]
    write(HERE / "rows_easier.jsonl", rows[HELD_OUT:] + easy)


if __name__ == "__main__":
    main()
