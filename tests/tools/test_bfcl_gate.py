"""The BFCL checker ``eval``s call strings in the trainer's process: only API methods with literal
arguments may reach it (``tools.bfcl.admit_call``), and the official verdict on legitimate calls stays
exact. Attacks come both as a model's tool calls (through ``BfclEnv``) and as raw call strings given to
``BfclBackend.execute`` and ``check_bfcl``."""

from __future__ import annotations

import ast
import builtins
import json
import sys
import uuid

import pytest

from trace_train.envs.bfcl import BfclEnv
from trace_train.tools import bfcl
from trace_train.tools.bfcl import BfclBackend, check_bfcl, load_bfcl_tasks

TASKS = {task.id: task for task in load_bfcl_tasks()}
FILES = "multi_turn_base_0"  # TwitterAPI + GorillaFileSystem
MATH = "multi_turn_base_15"  # has MathAPI


def tool_call(name: str, /, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


MODEL_ATTACKS = [  # (name, arguments) of a model's tool call; {victim} is a file the trainer owns
    ("open", {"file": "{victim}", "mode": "w"}),
    ("input", {}),
    ("__import__", {"name": "os"}),
    ("breakpoint", {}),
    ("exec", {"source": "open('{victim}', 'w')"}),
    ("compile", {"source": "1", "filename": "x", "mode": "eval"}),
    ("globals", {}),
    ("print", {"value": "leak"}),
    ("execute_multi_turn_func_call", {  # a global of the checker's module: a second eval of anything
        "func_call_list": ["open('{victim}', 'w')"], "initial_config": {}, "involved_classes": [],
        "model_name": "x", "test_entry_id": "y"}),
    ("_process_method_calls", {"function_call_string": "x", "instance_mapping": {}}),
    ("class_instance", {}),  # a local variable of the checker's eval frame
    ("_load_scenario", {"scenario": {}}),  # a private method of an API instance
    ("__init__", {}),
    ("__class__", {}),
]
RAW_ATTACKS = [  # call strings given to the back end directly
    "cd(folder=__import__('os').getcwd())",
    "cd.__globals__['__builtins__']['open']('{victim}', 'w')",
    "ls().__class__()",
    "cd(folder=pwd())",
    "cd(*['a'])",
    "cd(**{'folder': 'a'})",
    "(lambda: open('{victim}', 'w'))()",
    "cd(folder=f'{{open(\"{victim}\", \"w\")}}')",
    "cd(folder=[x for x in ()])",
    "cd(folder=(y := 1))",
    "cd(folder=1e999)",  # infinity: its repr `inf` is a name
    "cd(folder=set())",
    "cd(folder=1j)",
    "cd(folder=b'x')",
    "cd(folder=" + "[" * 60 + "]" * 60 + ")",
    "cd(folder=" + "[" * 100_000 + "]" * 100_000 + ")",
    "cd(folder=" + "-" * 100_000 + "1)",
    "cd(folder='a')\nopen('{victim}', 'w')",
    "cd(folder='a'); open('{victim}', 'w')",
    "cd(folder='a', folder='b')",
    "cd(folder='a') if open('{victim}', 'w') else 1",
    "open('{victim}', 'w')",
    "[open('{victim}', 'w')]",
    "__builtins__['open']('{victim}', 'w')",
    "\x00open('{victim}', 'w')",
]


@pytest.fixture
def victim(tmp_path):
    path = tmp_path / "trainer_file.txt"
    path.write_text("precious")
    yield path
    assert path.read_text() == "precious"


@pytest.fixture
def checker_evals(monkeypatch):
    """Every string the checker's module hands to ``eval``; one that is not an admitted call (an API
    instance's method applied to literals) or the refused marker is recorded and never evaluated."""
    seen, violations = [], []

    def spy(source, *rest):
        seen.append(source)
        frame = sys._getframe(1)
        refused = source == getattr(bfcl, "REFUSED_CALL", None)
        if not refused and not _is_prefixed_method_call(source, frame.f_locals):
            violations.append(source)
            raise RuntimeError("refused by the test")
        return builtins.eval(source, frame.f_globals, frame.f_locals)

    monkeypatch.setattr(bfcl.multi_turn_utils, "eval", spy, raising=False)
    return seen, violations


def _is_prefixed_method_call(source: str, frame_locals: dict) -> bool:
    try:
        node = ast.parse(source, mode="eval").body
    except SyntaxError:
        return False
    mapping = frame_locals.get("class_method_name_mapping", {})
    function = node.func if isinstance(node, ast.Call) else None
    if not (isinstance(function, ast.Attribute) and isinstance(function.value, ast.Name)):
        return False
    if mapping.get(function.attr) != function.value.id:
        return False
    try:
        [ast.literal_eval(arg) for arg in node.args] + [ast.literal_eval(kw.value) for kw in node.keywords]
    except ValueError:
        return False
    return all(kw.arg is not None for kw in node.keywords)


def _fill(value, victim):
    if isinstance(value, str):
        return value.replace("{victim}", str(victim))
    if isinstance(value, list):
        return [_fill(item, victim) for item in value]
    if isinstance(value, dict):
        return {key: _fill(item, victim) for key, item in value.items()}
    return value


@pytest.mark.parametrize("name, arguments", MODEL_ATTACKS, ids=[name for name, _ in MODEL_ATTACKS])
def test_a_models_call_of_a_builtin_never_reaches_the_checkers_eval(name, arguments, victim, checker_evals):
    seen, violations = checker_evals
    env = BfclEnv()
    env.reset({"id": FILES})
    result = env.step(tool_call("pwd") + tool_call(name, **_fill(arguments, victim)))
    while not env.snapshot().finished:
        env.step("No more calls.")
    assert env.verify() == 0.0
    assert violations == [] and bfcl.REFUSED_CALL in seen
    assert result.observation.count("Error during execution") == 1
    assert env.snapshot().backend.calls[0] == (("pwd()", bfcl.REFUSED_CALL),)


@pytest.mark.parametrize("attack", RAW_ATTACKS)
def test_a_call_string_that_is_not_a_method_applied_to_literals_is_recorded_refused(attack, victim,
                                                                                      checker_evals):
    seen, violations = checker_evals
    task = TASKS[FILES]
    call = attack.replace("{victim}", str(victim))
    calls = [[[call]]] + [[] for _ in task.ground_truth[1:]]  # the raw string, straight to check_bfcl
    assert not check_bfcl(task, calls).valid
    assert violations == [] and seen
    backend = BfclBackend(task)
    [observation] = backend.execute([call])
    assert observation.startswith("Error during execution")
    assert backend.calls == [[[bfcl.REFUSED_CALL]]]


def test_open_for_writing_from_a_tool_call_leaves_the_trainers_file_intact(victim):
    """The reported attack, without any instrumentation: on the old code, verify() truncated the file."""
    env = BfclEnv()
    env.reset({"id": FILES})
    env.step(tool_call("open", file=str(victim), mode="w"))
    while not env.snapshot().finished:
        env.step("Done.")
    assert env.verify() == 0.0  # the fixture checks the file


def test_a_result_too_large_to_print_is_an_error_observation():
    """BFCL's MathAPI returns 10**5000, which neither json.dumps nor str can render: an observation, as
    BFCL's executor gives, not an exception out of step()."""
    env = BfclEnv()
    env.reset({"id": MATH})
    result = env.step(tool_call("power", base=10, exponent=5000))
    assert result.observation.startswith("Error during execution: Exceeds the limit (4300 digits)")


def _official_verdict(task, calls):
    """``multi_turn_checker`` on the call strings as given, with no gate (only for legitimate calls)."""
    if len(calls) != len(task.ground_truth):
        return (False, "multi_turn:force_terminated")
    name = f"official_{uuid.uuid4().hex}"
    try:
        result = bfcl.multi_turn_checker([[list(s) for s in turn if s] for turn in calls],
                                         [list(turn) for turn in task.ground_truth],
                                         {"id": task.id, "initial_config": task.initial_config,
                                          "involved_classes": list(task.involved_classes)},
                                         f"multi_turn_{task.subset}", name)
    finally:
        bfcl._forget_checker_instances(name)
    return (result["valid"], result.get("error_type"))


def _variants(task):
    """Legitimate call records for ``task``: the ground truth as written, respaced and requoted, with a
    call dropped, with an extra read-only call, with a wrong value and with an unknown keyword."""
    truth = [[list(turn)] if turn else [] for turn in task.ground_truth]
    first = next(t for t, turn in enumerate(task.ground_truth) if turn)
    node = ast.parse(task.ground_truth[first][0], mode="eval").body
    spaced = [[[c.replace("=", " = ").replace("(", "( ", 1) for c in step] for step in turn]
              for turn in truth]
    dropped = [[list(step) for step in turn] for turn in truth]
    dropped[first][0] = dropped[first][0][1:] or [f"{node.func.id}()"]
    extra = [[list(step) for step in turn] for turn in truth]
    reader = "pwd()" if "GorillaFileSystem" in task.involved_classes else "get_current_time()"
    extra[first][0].insert(0, reader)
    keyword = [[list(step) for step in turn] for turn in truth]
    keyword[first][0][0] = f"{node.func.id}(no_such_keyword='x')"
    wrong = [[list(step) for step in turn] for turn in truth]
    if node.keywords:
        key = node.keywords[0].arg
        wrong[first][0][0] = f"{node.func.id}({key}='not the value (cd(folder=1))')"
    return [truth, spaced, dropped, extra, keyword, wrong]


def test_check_bfcl_agrees_with_the_official_checker_on_legitimate_calls():
    sample = [task for task in TASKS.values() if task.scenario % 25 == 4]  # 8 scenarios x 4 subsets
    verdicts = []
    for task in sample:
        for calls in _variants(task):
            ours = check_bfcl(task, calls)
            assert (ours.valid, ours.error_type) == _official_verdict(task, calls), task.id
            verdicts.append(ours.valid)
        backend = BfclBackend(task)  # what the back end records is judged the same
        for turn, calls in enumerate(task.ground_truth):
            if turn:
                backend.next_turn()
            backend.execute([ast.unparse(ast.parse(c)) for c in calls])  # another layout, same values
        assert check_bfcl(task, backend.calls).valid, task.id
    assert True in verdicts and False in verdicts


def test_legitimate_calls_are_recorded_in_bfcls_own_layout():
    backend = BfclBackend(TASKS[FILES])
    backend.execute(["cd( folder = \"document\" )  # a comment", "echo(content='ls(a) \\n', file_name=None)",
                     "mean([1, 2.5, -3])"])
    assert backend.calls == [[["cd(folder='document')", "echo(content='ls(a) \\n',file_name=None)",
                               bfcl.REFUSED_CALL]]]
