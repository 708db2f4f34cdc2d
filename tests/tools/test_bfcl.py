"""BFCL v4 multi-turn: official data, back ends and checker; exact snapshot/restore; the stored split."""

import json
import os
import subprocess
import sys

import pytest

from trace_train.tools import bfcl
from trace_train.tools.bfcl import (
    SUBSETS,
    BfclBackend,
    BfclSnapshot,
    check_bfcl,
    load_bfcl_split,
    load_bfcl_tasks,
    make_bfcl_split,
)
from trace_train.tools.tool_calls import ToolCall, parse_tool_calls

TASKS = load_bfcl_tasks()
BY_ID = {task.id: task for task in TASKS}
SAMPLE = [task for task in TASKS if task.scenario % 10 == 3]  # 20 scenarios x 4 subsets


def _replay(task, upto_turn=None):
    backend = BfclBackend(task)
    observations = []
    for turn, calls in enumerate(task.ground_truth[:upto_turn]):
        if turn:
            backend.next_turn()
        if calls:
            observations.append(backend.execute(list(calls)))
    return backend, observations


def test_all_subsets_load_with_ground_truth():
    assert [sum(t.subset == s for t in TASKS) for s in SUBSETS] == [200, 200, 200, 200]
    assert all(len(t.turns) == len(t.ground_truth) for t in TASKS)
    assert all(
        t.turns[turn][0]["content"] == bfcl.ADDED_FUNCTIONS_PROMPT
        for t in TASKS
        for turn in t.added_functions
    )


def test_function_documents_match_bfcls_own_assembly(tmp_path):
    """Compare with bfcl_eval.utils.load_dataset_entry, run in a subprocess so its folders go to tmp_path."""
    script = (
        "import json, sys\nfrom bfcl_eval.utils import load_dataset_entry\nout = {}\n"
        "for s in sys.argv[1:]:\n    for e in load_dataset_entry('multi_turn_' + s, "
        "include_language_specific_hint=False):\n"
        "        out[e['id']] = [e['function'], e.get('missed_function', {})]\nprint(json.dumps(out))"
    )
    env = dict(os.environ, BFCL_PROJECT_ROOT=str(tmp_path))
    official = json.loads(
        subprocess.run(
            [sys.executable, "-c", script, *SUBSETS], env=env, capture_output=True, text=True, check=True
        ).stdout
    )
    assert set(official) == set(BY_ID)
    for task_id, (functions, missed) in official.items():
        task = BY_ID[task_id]
        assert list(task.functions) == functions
        assert {str(turn): list(docs) for turn, docs in task.added_functions.items()} == missed
        last = len(task.turns) - 1
        assert len(task.functions_at(last)) == len(functions) + sum(len(d) for d in missed.values())


def test_replaying_ground_truth_passes_the_official_checker_for_every_task():
    failures = [
        (task.id, verdict.error_type)
        for task in TASKS
        if not (verdict := check_bfcl(task, _replay(task)[0].calls)).valid
    ]
    assert failures == []


def test_wrong_or_missing_calls_fail_the_checker():
    task = BY_ID["multi_turn_base_0"]
    backend, _ = _replay(task)
    calls = backend.calls
    calls[0] = [
        ["cd(folder='document')", "mkdir(dir_name='tmp')", "mv(source='final_report.pdf', destination='tmp')"]
    ]
    verdict = check_bfcl(task, calls)
    assert (
        not verdict.valid
        and verdict.error_type == "multi_turn:instance_state_mismatch"
        and verdict.reward == 0
    )
    calls = backend.calls
    calls[2] = []
    assert check_bfcl(task, calls).error_type == "multi_turn:empty_turn_model_response"
    short = check_bfcl(task, backend.calls[:2])
    assert short.error_type == "multi_turn:force_terminated"


def test_checker_leaves_no_instances_behind_and_is_repeatable():
    task = BY_ID["multi_turn_miss_param_3"]
    before = set(vars(bfcl.multi_turn_utils))
    calls = _replay(task)[0].calls
    assert check_bfcl(task, calls).valid and check_bfcl(task, calls).valid
    broken = [[["cd(folder='nowhere')"]] for _ in calls]
    assert not check_bfcl(task, broken).valid
    assert check_bfcl(task, calls).valid
    assert set(vars(bfcl.multi_turn_utils)) == before


def test_backend_execution_equals_bfcls_own_executor():
    """Same observations as multi_turn_utils.execute_multi_turn_func_call, errors included."""
    extra = ["no_such_function(x=1)", "cd(nonexistent_argument=1)", "kill(pid=1)", "cd(folder=", "cd(*['a'])"]
    for task in SAMPLE:
        backend = BfclBackend(task)
        name = f"equivalence_{task.id}"
        try:
            for turn, calls in enumerate(task.ground_truth):
                if turn:
                    backend.next_turn()
                step = list(calls) + extra
                official, _ = bfcl.multi_turn_utils.execute_multi_turn_func_call(
                    step,
                    task.initial_config,
                    list(task.involved_classes),
                    name,
                    task.id,
                    long_context=task.long_context,
                )
                ours = backend.execute(step)
                # cd(*['a']) is evaluated by BFCL but refused here: the only intended difference
                assert ours[:-1] == official[:-1], task.id
                assert ours[-1].startswith("Error during execution:")
        finally:
            bfcl._forget_checker_instances(name)


def test_snapshot_restore_reproduces_the_factual_continuation_exactly():
    for task in SAMPLE:
        if len(task.ground_truth) < 2:
            continue
        branch = len(task.ground_truth) // 2
        backend, _ = _replay(task, upto_turn=branch)
        snapshot = backend.snapshot()
        state_at_branch = backend.state()
        factual = []
        for calls in task.ground_truth[branch:]:
            backend.next_turn()
            factual.append(backend.execute(list(calls)) if calls else [])
        final_state, final_calls = backend.state(), backend.calls
        backend.restore(snapshot)
        backend.execute(["cd(folder='..')", "rm(file_name='anything')", "post_tweet(content='x')"])
        backend.restore(snapshot)  # a snapshot can be restored any number of times
        assert backend.state() == state_at_branch
        replayed = []
        for calls in task.ground_truth[branch:]:
            backend.next_turn()
            replayed.append(backend.execute(list(calls)) if calls else [])
        assert replayed == factual and backend.state() == final_state and backend.calls == final_calls
        assert check_bfcl(task, backend.calls).valid


def test_scripted_agent_through_qwen3_tool_calls_reaches_reward_one():
    """Render ground truth as Qwen3 <tool_call> blocks, parse them back, execute, and check."""
    import ast

    tasks = [
        t
        for t in SAMPLE
        if all(not ast.parse(c, mode="eval").body.args for turn in t.ground_truth for c in turn)
    ][:12]
    assert len(tasks) >= 8
    for task in tasks:
        backend = BfclBackend(task)
        for turn, calls in enumerate(task.ground_truth):
            if turn:
                backend.next_turn()
            blocks = []
            for call in calls:
                node = ast.parse(call, mode="eval").body
                arguments = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
                blocks.append(
                    "<tool_call>\n"
                    + json.dumps({"name": node.func.id, "arguments": arguments})
                    + "\n</tool_call>"
                )
            parsed = parse_tool_calls("Let me do that.\n" + "\n".join(blocks))
            assert all(isinstance(c, ToolCall) for c in parsed)
            if parsed:
                backend.execute([c.to_call_string() for c in parsed])
        assert check_bfcl(task, backend.calls).valid, task.id


def test_stored_split_is_the_seeded_80_20_split_by_scenario():
    stored = load_bfcl_split()
    assert stored == make_bfcl_split(seed=stored["seed"], test_fraction=stored["test_fraction"])
    assert len(stored["train"]) == 160 and len(stored["test"]) == 40
    assert set(stored["train"]).isdisjoint(stored["test"]) and set(stored["train"]) | set(
        stored["test"]
    ) == set(range(200))
    train, test = load_bfcl_tasks(split="train"), load_bfcl_tasks(split="test")
    assert len(train) == 640 and len(test) == 160
    assert {t.scenario for t in train}.isdisjoint({t.scenario for t in test})
    assert make_bfcl_split(seed=1) != stored


def test_inputs_are_validated():
    task = BY_ID["multi_turn_base_0"]
    with pytest.raises(ValueError, match="`subsets` must be a non-empty sequence drawn from"):
        load_bfcl_tasks(["base", "web_search"])
    with pytest.raises(ValueError, match="`split` must be 'train', 'test' or None, got 'dev'"):
        load_bfcl_tasks(split="dev")
    with pytest.raises(ValueError, match=r"`turn` must be in \[0, 4\), got 4"):
        task.functions_at(4)
    backend = BfclBackend(task)
    with pytest.raises(ValueError, match="`call_strings` must be a sequence of str"):
        backend.execute("cd(folder='x')")
    for _ in range(3):
        backend.next_turn()
    with pytest.raises(ValueError, match="task multi_turn_base_0 has only 4 turns"):
        backend.next_turn()
    with pytest.raises(ValueError, match="`snapshot` must be a BfclSnapshot of task multi_turn_base_0"):
        backend.restore(BfclBackend(BY_ID["multi_turn_base_1"]).snapshot())
    with pytest.raises(ValueError, match="`test_fraction` must be in"):
        make_bfcl_split(test_fraction=1.0)
    assert isinstance(backend.snapshot(), BfclSnapshot)


def test_math_calls_leave_mpmath_precision_alone_and_agree_across_threads():
    """MathAPI.logarithm sets the process-wide mpmath precision: calls run alone and restore it."""
    import decimal
    import threading

    import mpmath

    task = next(t for t in TASKS if "MathAPI" in t.involved_classes)
    calls = [f"logarithm(value=7, base=3, precision={p})" for p in (5, 60)]
    serial = {call: BfclBackend(task).execute([call])[0] for call in calls}
    assert serial[calls[0]] != serial[calls[1]]  # the precision shows in the result
    before, prec = mpmath.mp.dps, decimal.getcontext().prec
    BfclBackend(task).execute([calls[1], "square_root(number=2, precision=70)"])
    assert mpmath.mp.dps == before and decimal.getcontext().prec == prec

    seen, barrier = [], threading.Barrier(8)

    def worker(call):
        backend = BfclBackend(task)
        barrier.wait()
        seen.extend((call, backend.execute([call])[0]) for _ in range(40))

    threads = [threading.Thread(target=worker, args=(calls[i % 2],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(result == serial[call] for call, result in seen) and len(seen) == 320
