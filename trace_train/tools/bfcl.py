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

The paper's 80/20 train/test split is stored in ``bfcl_split.json`` (see :func:`make_bfcl_split`).
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

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

SUBSETS = ("base", "long_context", "miss_func", "miss_param")
ADDED_FUNCTIONS_PROMPT = DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC
MAX_STEPS_PER_TURN = MAXIMUM_STEP_LIMIT
SPLIT_FILE = Path(__file__).with_name("bfcl_split.json")
# Names BFCL refuses to execute (multi_turn_utils.execute_multi_turn_func_call).
_REFUSED = ("kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run")


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
        self._calls[-1].append(list(call_strings))
        methods = _method_owners(self._instances)
        return [self._execute_one(call, methods) for call in call_strings]

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

    def _execute_one(self, call: str, methods: dict[str, str]) -> str:
        head = call.split("(")[0] if "(" in call else call
        head = head.split(".")[1] if "." in head else head
        if head in _REFUSED:
            return f"Error during execution: Function call {head} is not allowed."
        try:
            name, args, kwargs = _parse_call(call)
            if name not in methods:
                raise NameError(f"name '{name}' is not defined")
            result = getattr(self._instances[methods[name]], name)(*args, **kwargs)
        except Exception as error:  # BFCL turns every failure into this observation
            return f"Error during execution: {error}"
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
    the task is "force terminated", as in BFCL; empty steps are dropped, as the runner drops them. The
    checker replays everything on fresh instances; the instances it creates are removed afterwards.
    """
    if len(calls) != len(task.ground_truth):
        return BfclVerdict(
            False,
            "multi_turn:force_terminated",
            f"The length of the model result turns ({len(calls)}) does not match the length "
            f"of the ground truth turns ({len(task.ground_truth)}).",
        )
    decoded = [[list(step) for step in turn if step] for turn in calls]
    entry = {
        "id": task.id,
        "initial_config": copy.deepcopy(task.initial_config),
        "involved_classes": list(task.involved_classes),
    }
    model_name = f"trace_{uuid.uuid4().hex}"
    try:
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


def _parse_call(call: str) -> tuple[str, list, dict]:
    """``name(literal, key=literal)`` -> (name, args, kwargs); anything else raises."""
    node = ast.parse(call.strip(), "<string>", mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"{call!r} is not a function call of the form name(arguments)")
    if any(isinstance(arg, ast.Starred) for arg in node.args) or any(kw.arg is None for kw in node.keywords):
        raise ValueError(f"{call!r} uses * or ** arguments, which are not supported")
    args = [ast.literal_eval(arg) for arg in node.args]
    kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
    return node.func.id, args, kwargs


def _forget_checker_instances(model_name: str) -> None:
    """The checker keeps its instances in ``multi_turn_utils``' globals, keyed by model name: drop ours."""
    namespace = vars(multi_turn_utils)
    for key in [key for key in list(namespace) if key.startswith(model_name + "_")]:  # other threads add keys
        del namespace[key]
