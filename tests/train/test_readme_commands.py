"""Every command block of README.md runs top to bottom as printed, in a copy of a fresh clone's files.

The blocks are the fenced ``bash`` blocks, in README order, each line (backslash continuations joined) run
in one shared working directory, so a line sees what the lines above it left (``runs/ParityEnv/hf`` for
``trace-eval``) and a second run into one ``run_dir`` is caught as the user would meet it. A block is left
out only by an explicit marker on the line above it, ``<!-- readme-test: skip (reason) -->`` (GPUs, Hub
downloads, benchmarks of many minutes, illustrative commands that name a user's own files); the test lists
what it left out. To stay within a test's time, every ``trace-train`` line (and ``torchrun ... -m
trace_train.train``) runs with ``steps=2`` appended: a run's length is the one field a rerun may change, so
the line is otherwise as printed.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from .test_trainer import _free_port

REPO = Path(__file__).resolve().parents[2]
SKIP = re.compile(r"<!--\s*readme-test:\s*skip\s*\((.+?)\)\s*-->")
FENCE = re.compile(r"^(?P<indent>[ \t]*)```bash[ \t]*\n(?P<body>.*?)^(?P=indent)```", re.S | re.M)
STEPS = "steps=2"


def readme_blocks(text: str) -> list[tuple[int, list[str], str | None]]:
    """(line number, command lines, skip reason or None) of every fenced bash block, in order."""
    blocks = []
    for match in FENCE.finditer(text):
        before = [ln for ln in text[:match.start()].splitlines() if ln.strip()]
        marker = SKIP.search(before[-1]) if before else None
        body = re.sub(r"\s*\\\n\s*", " ", match.group("body"))
        lines = [ln.strip() for ln in body.splitlines() if ln.strip() and not ln.strip().startswith("#")]
        blocks.append((text[:match.start()].count("\n") + 1, lines, marker.group(1) if marker else None))
    return blocks


def _argv(line: str, bin_dir: Path) -> list[str]:
    """The line's arguments with ``.venv/bin/NAME`` as the test's own environment's NAME, and ``steps=2``
    after a training command."""
    argv = shlex.split(line, comments=True)
    assert argv[0].startswith(".venv/bin/"), f"README command not run from .venv/bin: {line}"
    name = argv[0].removeprefix(".venv/bin/")
    program = Path(sys.executable) if name == "python" else bin_dir / name
    assert program.is_file(), f"{name} is not installed next to {sys.executable}"
    trains = name == "trace-train" or (name == "torchrun" and "trace_train.train" in argv)
    return [str(program), *argv[1:], *([STEPS] if trains else [])]


def test_the_readme_parser_finds_blocks_markers_and_continuations():
    text = ("intro\n\n```bash\n.venv/bin/a x \\\n    y   # note\n# only a comment\n```\n\n"
            "<!-- readme-test: skip (needs a GPU) -->\n  ```bash\n  .venv/bin/b\n  ```\n")
    assert readme_blocks(text) == [(3, [".venv/bin/a x y   # note"], None), (10, [".venv/bin/b"], "needs a GPU")]


def test_every_readme_block_is_run_or_skipped_by_a_marker_with_a_reason():
    blocks = readme_blocks((REPO / "README.md").read_text())
    assert sum(reason is None for _, _, reason in blocks) >= 4, blocks
    for number, lines, reason in blocks:
        assert lines, f"README.md line {number}: an empty bash block"
        assert reason is None or len(reason) > 5, f"README.md line {number}: a skip marker without a reason"


@pytest.mark.slow
def test_the_readme_command_blocks_run_top_to_bottom(tmp_path):
    blocks = readme_blocks((REPO / "README.md").read_text())
    shutil.copytree(REPO / "examples", tmp_path / "examples")  # a fresh clone's files; runs/ starts empty
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PET_MASTER_PORT": str(_free_port())}
    bin_dir = Path(sys.executable).parent
    skipped, ran = [], 0
    for number, lines, reason in blocks:
        if reason is not None:
            skipped.append(f"line {number} ({reason})")
            continue
        for line in lines:
            done = subprocess.run(_argv(line, bin_dir), cwd=tmp_path, env=env, capture_output=True, text=True,
                                  timeout=900)
            assert done.returncode == 0, f"README.md line {number}: {line}\n{done.stderr[-3000:]}"
            ran += 1
    assert ran >= 7
    warnings.warn(f"README blocks skipped by their markers: {'; '.join(skipped)}", stacklevel=1)
