"""BFCL v4 multi-turn: tasks, the official executable API back ends, and the official checker.

Everything comes from the ``bfcl-eval`` package (install it with ``pip install --no-deps bfcl-eval``;
its only import-time need for what is used here is ``mpmath``). Only these modules are imported:
``bfcl_eval.constants.executable_backend_config`` and ``.default_prompts`` (plain constants), the API
classes under ``bfcl_eval.eval_checker.multi_turn_eval.func_source_code`` and
``bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker``. ``bfcl_eval.utils`` is avoided on
purpose: importing it creates ``result/``, ``score/`` and ``.file_locks/`` folders next to the installed
package; the data files are read directly instead, and the function documentation is assembled exactly
as its ``populate_test_cases_with_predefined_functions`` does (a test compares the two).

Semantics mirrored from BFCL's inference loop:

- A task has turns; each turn starts with user messages. In ``miss_func`` tasks some function documents
  are held out and added at a later turn whose user message is BFCL's "I have updated some more
  functions..." prompt (:data:`ADDED_FUNCTIONS_PROMPT`).
- Within a turn the model takes steps; each step's tool calls are executed in order and their results
  are the observations. A step without calls ends the turn. BFCL fails a task whose turn exceeds
  :data:`MAX_STEPS_PER_TURN` steps; environments should end the episode with reward 0 then.
- :class:`BfclBackend` executes call strings with BFCL's semantics (same result formatting, same error
  strings, same refused names) but without ``eval``: a call string must be ``name(literal, key=literal)``.
- :func:`check_bfcl` runs the official ``multi_turn_checker`` on the calls the back end recorded.

The checker ``eval``s every call string in the trainer's process (in ``multi_turn_utils``' namespace,
after prefixing each API method name with its instance), so a model that calls ``open`` or ``input``
would write files or hang the trainer. :func:`admit_call` is the one gate: a call reaches the checker
(and the record) only as the canonical string ``method(repr(literal), ..., key=repr(literal), ...)``,
built by this module from values it parsed, where ``method`` is a public method of the task's API
instances (the names the checker prefixes, so no name resolves to a builtin or a module global) and the
literals are strings, finite numbers, booleans, None, and lists, tuples and dicts of them, nested at most
``bounded_json.MAX_DEPTH`` levels. Anything else is recorded as :data:`REFUSED_CALL`, which is not
Python: the checker's ``eval`` fails on it with a SyntaxError before anything runs, so it counts as a
failed call. A legitimate call string evaluates to the same call before and after canonicalisation, so
the official verdict on legitimate calls is unchanged (tests compare with the raw checker).

The file system is bounded. BFCL's ``GorillaFileSystem`` lets one step make any number of calls, so a
model can nest directories thousands deep (``mkdir``/``cd`` pairs: the snapshot's deep copy, ``find``,
``du`` and the checker's recursive ``==`` then exceed the recursion limit), ``cp`` a directory into
itself (a cycle: ``find`` never ends) or ``cp`` shared subtrees into exponentially many paths. After a
call that adds entries (:data:`_FS_GROWING`), the tree reached from the root, walked without recursion
and counting every path, must hold at most :data:`MAX_FS_ENTRIES` entries nested at most
:data:`MAX_FS_DEPTH` levels (BFCL's scenarios: at most 125 entries, 5 levels); a call that breaks this
is undone, answered with an error, and recorded as :data:`REFUSED_CALL`, so the checker's replay does not
build the tree either. Every call within the bounds behaves exactly as in BFCL.

The paper's 80/20 train/test split is stored in ``bfcl_split.json`` (see :func:`make_bfcl_split`).
"""

from __future__ import annotations

import ast
import copy
import decimal
import importlib
import inspect
import json
import math
import threading
import uuid
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import mpmath
import numpy as np
from bfcl_eval.constants.default_prompts import (
    DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC,
    MAXIMUM_STEP_LIMIT,
)
from bfcl_eval.constants.executable_backend_config import (
    CLASS_FILE_PATH_MAPPING,
    MULTI_TURN_FUNC_DOC_FILE_MAPPING,
    STATELESS_CLASSES,
)
from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

from . import bounded_json

SUBSETS = ("base", "long_context", "miss_func", "miss_param")
ADDED_FUNCTIONS_PROMPT = DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC
MAX_STEPS_PER_TURN = MAXIMUM_STEP_LIMIT
SPLIT_FILE = Path(__file__).with_name("bfcl_split.json")
# Names BFCL refuses to execute (multi_turn_utils.execute_multi_turn_func_call).
_REFUSED = ("kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run")
REFUSED_CALL = "!refused-call"
"""Recorded in place of a call that may not reach the checker (see the module docstring)."""
# API classes whose methods change process-wide state: MathAPI.logarithm sets ``mpmath.mp.dps``, which every
# thread shares. Their calls (and checks of tasks that use them) run one at a time, and the state is put back.
_PROCESS_STATE_CLASSES = frozenset({"MathAPI"})
_PROCESS_STATE_LOCK = threading.RLock()
MAX_FS_ENTRIES = 10_000
"""The most files and directories the file system may hold, counting every path to them."""
MAX_FS_DEPTH = 32
"""The deepest the file system's directories may nest (the root is level 1)."""
_FS_CLASS = "GorillaFileSystem"
_FS_GROWING = frozenset({"mkdir", "touch", "echo", "cp", "mv"})
"""The file-system methods that add entries; the bounds are checked after each of their calls."""


@dataclass(frozen=True, eq=False)
class BfclTask:
    """One BFCL multi-turn task (data as shipped by ``bfcl-eval``, plus its ground truth)."""

    id: str
    subset: str
    turns: tuple[tuple[dict, ...], ...]
    """User messages that open each turn (``{"role": "user", "content": ...}``)."""
    functions: tuple[dict, ...]
    """Function documents available from the first turn (JSON schema, BFCL format)."""
    added_functions: dict[int, tuple[dict, ...]]
    """Documents held out until a turn (``miss_func`` only): turn index -> documents added then."""
    initial_config: dict
    involved_classes: tuple[str, ...]
    ground_truth: tuple[tuple[str, ...], ...]
    """Ground-truth call strings of each turn (an empty turn expects no call)."""
    excluded_functions: tuple[str, ...] = field(default=())
    """BFCL's ``excluded_function`` metadata; BFCL itself does not remove these, and neither do we."""

    @property
    def scenario(self) -> int:
        """The index shared by the four variants of one scenario (``multi_turn_base_7`` -> 7)."""
        return int(self.id.rsplit("_", 1)[1])

    @property
    def long_context(self) -> bool:
        return self.subset == "long_context"

    def functions_at(self, turn: int) -> list[dict]:
        """Function documents available during ``turn``."""
        if not 0 <= turn < len(self.turns):
            raise ValueError(f"`turn` must be in [0, {len(self.turns)}), got {turn!r}")
        added = [doc for t, docs in sorted(self.added_functions.items()) if t <= turn for doc in docs]
        return list(self.functions) + added


def load_bfcl_tasks(subsets: Sequence[str] = SUBSETS, *, split: str | None = None) -> list[BfclTask]:
    """Tasks of the given subsets, in file order; ``split`` keeps only ``"train"`` or ``"test"`` scenarios."""
    if isinstance(subsets, str) or not subsets or any(s not in SUBSETS for s in subsets):
        raise ValueError(f"`subsets` must be a non-empty sequence drawn from {SUBSETS}, got {subsets!r}")
    if split not in (None, "train", "test"):
        raise ValueError(f"`split` must be 'train', 'test' or None, got {split!r}")
    keep = None if split is None else set(load_bfcl_split()[split])
    tasks = [task for subset in subsets for task in _load_subset(subset)]
    return [task for task in tasks if keep is None or task.scenario in keep]


def make_bfcl_split(*, seed: int = 0, test_fraction: float = 0.2) -> dict[str, Any]:
    """The train/test split by scenario index: all four variants of a scenario land on the same side.

    A permutation of the 200 scenario indices by ``numpy.random.default_rng(seed)``; the first
    ``round(test_fraction * 200)`` are the test scenarios. Both lists are sorted.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"`test_fraction` must be in (0, 1), got {test_fraction!r}")
    scenarios = sorted({task.scenario for task in _load_subset("base")})
    order = np.random.default_rng(seed).permutation(len(scenarios))
    n_test = round(test_fraction * len(scenarios))
    test = sorted(scenarios[i] for i in order[:n_test])
    train = sorted(set(scenarios) - set(test))
    return {
        "seed": seed,
        "test_fraction": test_fraction,
        "unit": "scenario index",
        "train": train,
        "test": test,
    }


def load_bfcl_split() -> dict[str, Any]:
    """The stored split (``bfcl_split.json``, written once by :func:`make_bfcl_split` with seed 0)."""
    return json.loads(SPLIT_FILE.read_text())


# ---------------------------------------------------------------------------------------- back end


@dataclass(frozen=True, eq=False)
class BfclSnapshot:
    """A private deep copy of a back end's instances and recorded calls."""

    instances: dict[str, Any]
    calls: tuple[tuple[tuple[str, ...], ...], ...]


class BfclBackend:
    """Live BFCL API instances of one task, and the record of executed calls the checker needs.

    ``calls`` is the checker's input: one list per turn, one list of call strings per step.
    """

    def __init__(self, task: BfclTask):
        self.task = task
        self._instances = _instantiate(task)
        self._calls: list[list[list[str]]] = [[]]

    @property
    def turn(self) -> int:
        return len(self._calls) - 1

    @property
    def calls(self) -> list[list[list[str]]]:
        return copy.deepcopy(self._calls)

    def execute(self, call_strings: Sequence[str]) -> list[str]:
        """Run one step's calls in order; return one result string per call (errors included)."""
        if isinstance(call_strings, str) or not all(isinstance(c, str) for c in call_strings):
            raise ValueError("`call_strings` must be a sequence of str")
        methods = _method_owners(self._instances)
        admitted = [admit_call(call, methods) for call in call_strings]
        step: list[str] = []
        self._calls[-1].append(step)
        results = []
        for call in admitted:
            result, record = self._execute_one(call, methods)
            results.append(result)
            step.append(record)
        return results

    def next_turn(self) -> None:
        """Close the current turn; later calls belong to the next one."""
        if self.turn + 1 >= len(self.task.turns):
            raise ValueError(f"task {self.task.id} has only {len(self.task.turns)} turns")
        self._calls.append([])

    def state(self) -> dict[str, dict[str, Any]]:
        """Public attributes of every stateful instance: what the checker compares."""
        return {
            name: {k: copy.deepcopy(v) for k, v in vars(instance).items() if not k.startswith("_")}
            for name, instance in self._instances.items()
            if name not in STATELESS_CLASSES
        }

    def snapshot(self) -> BfclSnapshot:
        return BfclSnapshot(copy.deepcopy(self._instances), tuple(tuple(map(tuple, t)) for t in self._calls))

    def restore(self, snapshot: BfclSnapshot) -> None:
        """Return exactly to ``snapshot`` (which stays reusable: it is copied again)."""
        if not isinstance(snapshot, BfclSnapshot) or set(snapshot.instances) != set(self._instances):
            raise ValueError(f"`snapshot` must be a BfclSnapshot of task {self.task.id}")
        self._instances = copy.deepcopy(snapshot.instances)
        self._calls = [[list(step) for step in turn] for turn in snapshot.calls]

    def _execute_one(self, call: AdmittedCall | RefusedCall, methods: dict[str, str]) -> tuple[str, str]:
        """The call's observation and what is recorded for the checker."""
        if isinstance(call, RefusedCall):
            return call.error, call.record
        owner = methods[call.name]
        bounded = owner == _FS_CLASS and call.name in _FS_GROWING
        before = copy.deepcopy(self._instances[owner]) if bounded else None
        try:  # BFCL turns every failure, of the call or of formatting its result, into this observation
            with process_state_guard((owner,)):
                result = getattr(self._instances[owner], call.name)(*call.args, **dict(call.kwargs))
                observation = _format_result(result)
        except Exception as error:
            observation = f"Error during execution: {error}"
        problem = file_system_problem(self._instances[owner]) if bounded else None
        if problem is not None:
            self._instances[owner] = before
            return f"Error during execution: {call.name} refused: {problem}", REFUSED_CALL
        return observation, call.record


def file_system_problem(fs: Any) -> str | None:
    """Why a ``GorillaFileSystem`` is past the bounds (see the module docstring), or None.

    Walks every path from the root with an explicit stack and stops at the first path past a bound, so
    it takes at most ``MAX_FS_ENTRIES`` steps whatever the tree (a cycle is an endless path)."""
    entries, stack = 0, [(getattr(fs, "root", None), 1)]
    while stack:
        item, level = stack.pop()
        if item is None:
            continue
        entries += 1
        if entries > MAX_FS_ENTRIES:
            return f"the file system may hold at most {MAX_FS_ENTRIES} entries (every path counted)"
        if level > MAX_FS_DEPTH:
            return f"directories may nest at most {MAX_FS_DEPTH} levels"
        contents = getattr(item, "contents", None)
        if isinstance(contents, dict):
            stack.extend((child, level + 1) for child in contents.values())
    return None


@contextmanager
def process_state_guard(classes: Collection[str]) -> Iterator[None]:
    """Run calls of these API classes alone and restore the process-wide state they may change.

    BFCL's MathAPI sets ``mpmath.mp.dps`` (the precision of every mpmath computation in the process) and
    the thread's ``decimal`` precision, and leaves them set; episodes stepped on concurrent threads would
    compute with each other's precision.
    For classes without such state this does nothing.
    """
    if not _PROCESS_STATE_CLASSES.intersection(classes):
        yield
        return
    with _PROCESS_STATE_LOCK, decimal.localcontext():  # square_root sets the thread's decimal precision
        dps = mpmath.mp.dps
        try:
            yield
        finally:
            mpmath.mp.dps = dps


# ---------------------------------------------------------------------------------------- the gate


@dataclass(frozen=True)
class AdmittedCall:
    """A call of an API method with literal arguments; ``record`` is the only form the checker sees."""

    name: str
    args: tuple
    kwargs: tuple[tuple[str, Any], ...]

    @property
    def record(self) -> str:
        """``name(repr(arg), ..., key=repr(value), ...)``: BFCL's own ``convert_to_function_call`` layout."""
        parts = [repr(arg) for arg in self.args] + [f"{key}={value!r}" for key, value in self.kwargs]
        return f"{self.name}({','.join(parts)})"


@dataclass(frozen=True)
class RefusedCall:
    """A call that does not run; ``error`` is its observation (BFCL's wording where BFCL has one)."""

    error: str
    record: str = REFUSED_CALL


def admit_call(call: Any, methods: Collection[str]) -> AdmittedCall | RefusedCall:
    """The gate between a call string and both the API instances and the checker's ``eval``.

    Admitted: ``name(literal, ..., key=literal, ...)`` with ``name`` in ``methods`` (the public methods
    of the task's instances), no ``*``/``**``, no repeated keyword, and every argument a literal
    string, finite int or float, bool, None, or a list, tuple or dict of literals nested at most
    ``bounded_json.MAX_DEPTH`` levels. Everything else is refused, with the error BFCL would show for
    BFCL's refused names, syntax errors and unknown names, and a plain explanation otherwise.
    """
    if not isinstance(call, str):
        return RefusedCall(f"Error during execution: a call must be a string, got {type(call).__name__}")
    head = call.split("(")[0] if "(" in call else call
    head = head.split(".")[1] if "." in head else head  # BFCL's refusal check, as BFCL does it
    if head in _REFUSED:
        return RefusedCall(f"Error during execution: Function call {head} is not allowed.")
    try:
        node = ast.parse(call.strip(), "<string>", mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:  # BFCL shows str(error)
        return RefusedCall(f"Error during execution: {str(error) or type(error).__name__}")
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        return RefusedCall("Error during execution: a call must have the form name(arguments), "
                           "with name one of the documented functions")
    name = node.func.id
    if name not in methods:
        return RefusedCall(f"Error during execution: name '{name}' is not defined")
    keys = [keyword.arg for keyword in node.keywords]
    if any(isinstance(arg, ast.Starred) for arg in node.args) or None in keys:
        return RefusedCall(f"Error during execution: the arguments of {name} cannot use * or **")
    if len(set(keys)) < len(keys):
        repeated = next(key for key in keys if keys.count(key) > 1)
        return RefusedCall(f"Error during execution: keyword argument repeated: {repeated}")
    try:
        args = tuple(_literal(arg) for arg in node.args)
        kwargs = tuple((keyword.arg, _literal(keyword.value)) for keyword in node.keywords)
    except ValueError:
        return RefusedCall(f"Error during execution: the arguments of {name} must be literals: strings, "
                           f"finite numbers, booleans, None, and lists, tuples or dicts of these")
    return AdmittedCall(name, args, kwargs)


def _literal(node: ast.expr) -> Any:
    """The value of a literal argument node, or a ValueError (see :func:`admit_call`)."""
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise ValueError("not a literal") from None
    if not _is_plain(value, 0):
        raise ValueError("not a plain literal")
    return value


def _is_plain(value: Any, depth: int) -> bool:
    if depth > bounded_json.MAX_DEPTH:
        return False
    if value is None or type(value) in (str, bool, int):
        return True
    if type(value) is float:
        return math.isfinite(value)
    if type(value) in (list, tuple):
        return all(_is_plain(item, depth + 1) for item in value)
    if type(value) is dict:
        return all(_is_plain(k, depth + 1) and _is_plain(v, depth + 1) for k, v in value.items())
    return False


def _format_result(result: Any) -> str:
    """BFCL's rendering of a method's result: a str as is, a dict as JSON if it can be, else ``str``."""
    if type(result) is str:
        return result
    if type(result) is dict:
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            return str(result)
    return str(result)


# ---------------------------------------------------------------------------------------- checker


@dataclass(frozen=True)
class BfclVerdict:
    """The official checker's verdict; ``reward`` is 1.0 when ``valid``."""

    valid: bool
    error_type: str | None = None
    error_message: str | None = None

    @property
    def reward(self) -> float:
        return 1.0 if self.valid else 0.0


def check_bfcl(task: BfclTask, calls: Sequence[Sequence[Sequence[str]]]) -> BfclVerdict:
    """Judge a whole episode with BFCL's ``multi_turn_checker``, as its evaluation runner does.

    ``calls`` is :attr:`BfclBackend.calls`: turns, steps, call strings. An episode with fewer turns than
    the task is "force terminated", as in BFCL; empty steps are dropped, as the runner drops them. Every
    call string passes :func:`admit_call` first (the ground truth, from ``bfcl-eval``'s data, does not
    need to). The checker replays everything on fresh instances; the instances it creates are removed
    afterwards.
    """
    if len(calls) != len(task.ground_truth):
        return BfclVerdict(
            False,
            "multi_turn:force_terminated",
            f"The length of the model result turns ({len(calls)}) does not match the length "
            f"of the ground truth turns ({len(task.ground_truth)}).",
        )
    methods = _task_methods(task.involved_classes)
    decoded = [[[admit_call(call, methods).record for call in step] for step in turn if step]
               for turn in calls]
    entry = {
        "id": task.id,
        "initial_config": copy.deepcopy(task.initial_config),
        "involved_classes": list(task.involved_classes),
    }
    model_name = f"trace_{uuid.uuid4().hex}"
    try:
        with process_state_guard(task.involved_classes):  # the checker replays the calls in this process
            result = multi_turn_checker(
                decoded,
                [list(turn) for turn in task.ground_truth],
                entry,
                f"multi_turn_{task.subset}",
                model_name,
            )
    except Exception as error:  # an internal assertion of the checker; the episode cannot be valid
        return BfclVerdict(False, "multi_turn:checker_error", f"{type(error).__name__}: {error}")
    finally:
        _forget_checker_instances(model_name)
    if result["valid"]:
        return BfclVerdict(True)
    return BfclVerdict(False, result.get("error_type"), result.get("error_message"))


# ---------------------------------------------------------------------------------------- helpers


def _data_dir() -> Path:
    return Path(str(resources.files("bfcl_eval") / "data"))


def _read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@cache
def _function_docs(class_name: str) -> tuple[dict, ...]:
    return tuple(
        _read_jsonl(_data_dir() / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name])
    )


@cache
def _load_subset(subset: str) -> tuple[BfclTask, ...]:
    rows = _read_jsonl(_data_dir() / f"BFCL_v4_multi_turn_{subset}.json")
    answers = {
        row["id"]: row["ground_truth"]
        for row in _read_jsonl(_data_dir() / "possible_answer" / f"BFCL_v4_multi_turn_{subset}.json")
    }
    return tuple(_task(row, subset, answers[row["id"]]) for row in rows)


def _task(row: dict, subset: str, ground_truth: list[list[str]]) -> BfclTask:
    functions = [copy.deepcopy(doc) for name in row["involved_classes"] for doc in _function_docs(name)]
    added: dict[int, tuple[dict, ...]] = {}
    for turn, names in row.get("missed_function", {}).items():
        held = []
        for name in names:  # the first document of that name is held out, as in BFCL
            index = next(i for i, doc in enumerate(functions) if doc["name"] == name)
            held.append(functions.pop(index))
        added[int(turn)] = tuple(held)
    turns = tuple(
        tuple(messages)
        if messages or t not in added
        else ({"role": "user", "content": ADDED_FUNCTIONS_PROMPT},)
        for t, messages in enumerate(row["question"])
    )
    return BfclTask(
        id=row["id"],
        subset=subset,
        turns=turns,
        functions=tuple(functions),
        added_functions=added,
        initial_config=row["initial_config"],
        involved_classes=tuple(row["involved_classes"]),
        ground_truth=tuple(tuple(turn) for turn in ground_truth),
        excluded_functions=tuple(row.get("excluded_function", ())),
    )


def _instantiate(task: BfclTask) -> dict[str, Any]:
    instances = {}
    for name in task.involved_classes:
        instance = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[name]), name)()
        if name not in STATELESS_CLASSES:
            instance._load_scenario(
                copy.deepcopy(task.initial_config.get(name, {})), long_context=task.long_context
            )
        instances[name] = instance
    return instances


def _method_owners(instances: dict[str, Any]) -> dict[str, str]:
    """Public method name -> class name; a later class wins a name clash, as in BFCL."""
    owners = {}
    for class_name, instance in instances.items():
        for method_name, _ in inspect.getmembers(instance, predicate=inspect.ismethod):
            if not method_name.startswith("_"):
                owners[method_name] = class_name
    return owners


@cache
def _task_methods(involved_classes: tuple[str, ...]) -> frozenset[str]:
    """The method names the checker prefixes with an instance for these classes (its own predicate)."""
    instances = {
        name: getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[name]), name)()
        for name in involved_classes
    }
    return frozenset(_method_owners(instances))


def _forget_checker_instances(model_name: str) -> None:
    """The checker keeps its instances in ``multi_turn_utils``' globals, keyed by model name: drop ours."""
    namespace = vars(multi_turn_utils)
    for key in [key for key in list(namespace) if key.startswith(model_name + "_")]:  # other threads add keys
        del namespace[key]
