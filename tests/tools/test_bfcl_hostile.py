"""Hostile BFCL file-system calls: deep, cyclic or exponentially shared directories are refused and
undone, so snapshots, ``find`` and the checker stay bounded (issue 24); calls within the bounds behave
as in BFCL."""

from __future__ import annotations

import pytest

from trace_train.tools.bfcl import (MAX_FS_DEPTH, MAX_FS_ENTRIES, REFUSED_CALL, BfclBackend, check_bfcl,
                                    file_system_problem, load_bfcl_tasks)

pytest.importorskip("bfcl_eval")


@pytest.fixture(scope="module")
def task():
    return next(t for t in load_bfcl_tasks(["base"]) if "GorillaFileSystem" in t.involved_classes)


def _depth(fs) -> int:
    deepest, stack = 0, [(fs.root, 1)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        stack.extend((c, level + 1) for c in getattr(item, "contents", {}).values())
    return deepest


def test_directories_nest_at_most_the_bound_and_the_state_stays_copyable(task):
    backend = BfclBackend(task)
    results = backend.execute(["mkdir(dir_name='d')", "cd(folder='d')"] * 600)
    fs = backend._instances["GorillaFileSystem"]
    assert _depth(fs) == MAX_FS_DEPTH and file_system_problem(fs) is None
    refused = [r for r in results if "mkdir refused" in r]
    assert refused and refused[0] == (f"Error during execution: mkdir refused: directories may nest at most "
                                      f"{MAX_FS_DEPTH} levels")
    step = backend.calls[0][0]
    assert step.count(REFUSED_CALL) == len(refused) and step[0] == "mkdir(dir_name='d')"
    backend.restore(backend.snapshot())  # a deep copy of the whole state: no RecursionError
    assert "Error" not in backend.execute(["find(path='/')"])[0]
    assert check_bfcl(task, backend.calls).error_type == "multi_turn:force_terminated"


def test_a_directory_copied_into_itself_is_refused(task):
    backend = BfclBackend(task)
    results = backend.execute(["mkdir(dir_name='a')", "cp(source='a', destination='a')", "find(path='.')"])
    assert results[1].startswith("Error during execution: cp refused: ")
    assert results[2].startswith('{"matches": ') and backend.calls[0][0][1] == REFUSED_CALL


def test_shared_subtrees_cannot_multiply_paths_past_the_bound(task):
    backend = BfclBackend(task)
    backend.execute(["mkdir(dir_name='a')", "cd(folder='a')", "touch(file_name='f')", "cd(folder='..')"])
    doubling = ["cp(source='a', destination='b')", "mkdir(dir_name='c')", "mv(source='a', destination='c')",
                "mv(source='b', destination='c')", "mv(source='c', destination='a')"]  # paths under a double
    results = backend.execute(doubling * 16)
    assert any("refused: the file system may hold at most" in r for r in results)
    fs = backend._instances["GorillaFileSystem"]
    assert file_system_problem(fs) is None
    assert len(backend.execute(["find(path='/')"])[0].split(",")) <= MAX_FS_ENTRIES
