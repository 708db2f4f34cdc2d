"""Environments from anywhere: the registry and factories, how ``task.name`` finds an environment, and the
task spec it carries.

``task.name`` is one of three things, tried in this order:

1. a name registered in ``trace_train.envs.ENVIRONMENTS`` (``guess_number``, ``math_python``, ...);
2. an import path ``package.module:attribute`` (or ``path/to/file.py:attribute``, loaded from the file)
   naming an *environment factory*: a class or function that, called with the options in ``task.env``,
   returns a fresh :class:`~.base.Environment` (or an :class:`EnvFactory`);
3. a name that a third-party package registers in the entry-point group ``trace_rl.environments``
   (``[project.entry-points."trace_rl.environments"] myenv = "mypkg.envs:MyEnv"``), the way pytest finds
   its plugins.

Each environment carries its :class:`TaskSpec` next to it, as the attribute ``task_spec`` of the
factory (a class attribute for a class); one without it gets ``TaskSpec()``: rows are read from
``task.train`` / ``task.eval``, a local JSONL/Parquet file or a Hugging Face data set id
(``trace_train.data.loading.load_rows``), binary rewards. The environment may also say, as the
attribute ``tools``, the JSON schemas of its tools (for chat templates that take ``tools=``). The task
spec's ``evaluation`` (:class:`EvalSpec`) is how ``trace-eval`` plays and scores the environment, so that
``trace-eval --task <name>`` evaluates whatever ``task.name=<name>`` trains.

**Row schema.** A row is one JSON object (one line of a JSONL file, one record of a Parquet file or a
Hub data set), passed unchanged to ``Environment.reset(row)``, which reads the fields it needs and raises
``ValueError`` naming any that are missing. An ``id`` field (unique) is recommended: ``trace-eval``
resumes by it.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass, field
from functools import partial
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from trace_theory._registry import Registry

from .base import Environment

__all__ = ["ENTRY_POINT_GROUP", "ENVIRONMENTS", "EnvFactory", "TaskSpec", "EvalSpec", "EnvironmentSource",
           "find_environment", "build_factory", "read_rows", "reward_metrics"]

ENTRY_POINT_GROUP = "trace_rl.environments"
DATA_MODES = ("required", "optional", "generated")


@dataclass(frozen=True)
class EnvFactory:
    """A ``make_env`` for the rollout engine, with the facts about its environment a caller needs."""

    name: str
    """The registry name."""
    make: Callable[[], Environment]
    """Builds a fresh environment (shared resources are bound in)."""
    tools: tuple[dict, ...] = ()
    """JSON schemas of the tools, for chat templates that take ``tools=`` (``trace_train.chat.ChatFormat``)."""
    binary_rewards: bool = True
    """Whether ``verify`` returns only 0 or 1; else the engine needs ``binary_rewards=False``."""

    def __call__(self) -> Environment:
        return self.make()


ENVIRONMENTS: Registry[Callable[..., EnvFactory]] = Registry("environment")
"""The registered environments; :mod:`.registry` registers the package's own (``trace_train.envs`` imports
it, so they are registered before any lookup)."""


def read_rows(source: str, *, split: str, subset: str | None, size: int, seed: int) -> list[dict]:
    """Rows as stored: a local JSONL/Parquet file or a Hugging Face data set id, at most ``size``."""
    from ..data.loading import load_rows

    try:
        return load_rows(source, split=split, subset=subset, limit=size)
    except FileNotFoundError as error:
        raise ValueError(str(error)) from None


def reward_metrics(records: list[dict], means: Mapping[str, float], *, k: int) -> dict:
    """``trace-eval``'s score of an environment without its own: ``mean_reward`` over rollouts, and with
    0/1 rewards and k > 1 ``pass@k`` (a task counts when any of its k rollouts has reward 1)."""
    rewards = [r for record in records for r in record["rewards"]]
    metrics = {"mean_reward": float(sum(rewards) / len(rewards))}
    if k > 1 and set(rewards) <= {0.0, 1.0}:
        metrics[f"pass@{k}"] = sum(max(record["rewards"]) for record in records) / len(records)
    return metrics


@dataclass(frozen=True)
class EvalSpec:
    """How ``trace-eval`` plays and scores an environment: its benchmark defaults, next to its task spec.

    The hooks receive ``trace-eval``'s :class:`~trace_train.evaluate.EvalConfig`."""

    max_turns: int = 8
    """Agent turns per rollout when ``--max-turns`` is not given."""
    flags: tuple[str, ...] = ("data",)
    """Which of trace-eval's environment flags (``data``, ``corpus``, ``retriever_url``, ``max_tool_calls``)
    apply; the others must stay unset."""
    data_help: str = "a local JSONL/Parquet file or a Hugging Face data set id"
    """What ``--data`` is, for the error when the environment needs it and it is missing."""
    check: Callable[[Any], None] | None = None
    """Further checks of the config (a ``ValueError`` on a bad one), run when it is built."""
    env_options: Callable[[Any], dict] | None = None
    """The environment options the config's flags set (``--env-options`` is applied over them)."""
    rows: Callable[[Any], list[dict]] | None = None
    """``rows(config)``: the tasks; None: the task spec's ``rows`` on ``--data`` (``--limit`` rows at most)."""
    metrics: Callable[..., dict] = reward_metrics
    """``metrics(records, means, *, k) -> dict``: the score reported (``means``: each measure of
    ``Environment.metrics`` averaged over rollouts)."""


@dataclass(frozen=True)
class TaskSpec:
    """What the trainer must know about an environment's data: how rows are made or loaded, and rewards."""

    rows: Callable[..., list[dict]] = read_rows
    """``rows(source, *, split, subset, size, seed, **row_options) -> list[dict]``: makes or loads at
    most ``size`` rows (``source`` is ``task.train`` or ``task.eval``; None when generating them)."""
    row_options: Mapping[str, Any] = field(default_factory=dict)
    """The options ``rows`` takes (``task.rows`` in a config), with their defaults."""
    data: str = "required"
    """"required": ``task.train`` must be given; "optional": ``default_sources`` stand in; "generated":
    ``rows`` makes the rows of each side (training, held-out) whose source is unset, and a side given a
    file or data set id reads it (rows as stored, ``task.rows`` then does not apply)."""
    default_sources: tuple[str | None, str | None] = (None, None)
    """Training and held-out sources used when the config gives none ("optional" data)."""
    binary_rewards: bool | Callable[[Mapping[str, Any]], bool] = True
    """Whether ``verify`` returns only 0 or 1; a function of the environment options if it depends on them."""
    env_defaults: Callable[[Mapping[str, Any]], dict] | None = None
    """Completes the environment options (``task.env``) before the environment is built."""
    env_row_options: tuple[str, ...] = ()
    """Options of ``task.env`` that ``rows`` takes too (e.g. reasoning-gym's ``dataset`` and ``levels``: the
    environment and its rows are set by one spelling)."""
    prompt_key: Callable[[Mapping[str, Any]], Any] | None = None
    """What makes two rows the same prompt, for keeping held-out prompts out of training
    (``trace_train.tasks``); None: the opening messages of a fresh environment reset on the row."""
    evaluation: EvalSpec = field(default_factory=EvalSpec)
    """How ``trace-eval`` plays and scores the environment (its benchmark defaults)."""
    demonstration: Callable[[Mapping[str, Any]], Sequence[str]] | None = None
    """A scripted expert: ``demonstration(row)`` -> the actions of one episode of that row. The tiny model
    (``model.name_or_path=tiny``) is warmed on them, played through the real environment, over the training
    rows only (``trace_train.tiny.play_demonstrations``, ``demonstration_transcript``); None: it is warmed on guess-the-number games."""

    def __post_init__(self):
        if self.data not in DATA_MODES:
            raise ValueError(f"`data` must be one of {DATA_MODES}, got {self.data!r}")

    def rewards_are_binary(self, env_options: Mapping[str, Any]) -> bool:
        return self.binary_rewards(env_options) if callable(self.binary_rewards) else bool(self.binary_rewards)


@dataclass(frozen=True)
class EnvironmentSource:
    """An environment found by :func:`find_environment`: its factory, its options and its task spec."""

    name: str
    factory: Callable[..., Any]
    """Called with the environment options: an ``EnvFactory`` builder (registered) or an environment factory."""
    spec: TaskSpec
    registered: bool = False

    def options(self) -> list[str] | None:
        """Names of the options the factory takes (None: any, it takes ``**kwargs``)."""
        parameters = inspect.signature(self.factory).parameters.values()
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
            return None
        return [p.name for p in parameters if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]


def find_environment(name: str) -> EnvironmentSource:
    """The environment ``task.name`` names (see the module docstring); a clear ``ValueError`` if none."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"`task.name` must be a non-empty string, got {name!r}")
    if name in ENVIRONMENTS:
        builder = ENVIRONMENTS[name]
        return EnvironmentSource(name, builder, _spec_of(builder, name), registered=True)
    if ":" in name:
        return _source(name, _import(name))
    plugins = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    if name in plugins:
        try:
            target = plugins[name].load()
        except Exception as error:  # a broken plugin must name itself
            raise ValueError(f"environment {name!r} (entry point {plugins[name].value!r}) fails to load: "
                             f"{type(error).__name__}: {error}") from None
        return _source(name, target)
    known = sorted({*ENVIRONMENTS.names(), *plugins})
    raise ValueError(f"unknown environment {name!r}; known: {', '.join(known)} (or an import path "
                     "package.module:attribute)")


def _spec_of(target: Any, name: str) -> TaskSpec:
    spec = getattr(target, "task_spec", None)
    if spec is None:
        return TaskSpec()
    if isinstance(spec, Mapping):
        return TaskSpec(**spec)
    if not isinstance(spec, TaskSpec):
        raise ValueError(f"environment {name!r}: `task_spec` must be a TaskSpec, got {type(spec).__name__}")
    return spec


def _source(name: str, target: Any) -> EnvironmentSource:
    if not callable(target):
        raise ValueError(f"environment {name!r} must name a class or function that builds an environment, "
                         f"got {type(target).__name__}")
    return EnvironmentSource(name, target, _spec_of(target, name))


def _import(path: str) -> Any:
    """``package.module:attribute`` or ``path/to/file.py:attribute``."""
    module_name, _, attribute = path.rpartition(":")
    if not module_name or not attribute:
        raise ValueError(f"import path {path!r} must look like package.module:attribute")
    try:
        if module_name.endswith(".py"):
            module = _load_file(Path(module_name))
        else:
            module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"cannot import {module_name!r} for environment {path!r}: {error} (is its folder "
                         "on PYTHONPATH?)") from None
    except Exception as error:  # noqa: BLE001 - the plugin's own code failed while importing: one line
        where = ""
        tb = error.__traceback__
        while tb is not None:
            where = f" ({tb.tb_frame.f_code.co_filename}, line {tb.tb_lineno})"
            tb = tb.tb_next
        if isinstance(error, SyntaxError):
            where = f" ({error.filename}, line {error.lineno})"
        raise ValueError(f"environment module {module_name!r} fails to import: {type(error).__name__}: "
                         f"{_text(error)}{where}") from None
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ValueError(f"module {module_name!r} has no attribute {attribute!r}")
        target = getattr(target, part)
    return target


def _text(error: BaseException) -> str:
    try:
        return str(error).splitlines()[0][:300] if str(error) else ""
    except Exception:  # noqa: BLE001 - an unprintable message
        return "<message could not be printed>"


def _load_file(path: Path):
    if not path.is_file():
        raise ImportError(f"{str(path)!r} is not a file")
    name = f"trace_user_env_{path.stem}"
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(path.resolve()):
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path.resolve())
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)  # a failed import leaves nothing half-made behind
        raise
    return module


ENVIRONMENT_METHODS = ("reset", "step", "verify", "snapshot", "restore")
"""What an :class:`Environment` has (``envs.base``)."""


def build_factory(source: EnvironmentSource, options: Mapping[str, Any]):
    """The :class:`EnvFactory` of an environment with these options (checked against the
    factory's parameters; one environment is built to validate them)."""
    options = dict(options)
    known = source.options()
    unknown = sorted(set(options) - set(known)) if known is not None else []
    if unknown:
        raise ValueError(f"environment {source.name!r} has no option {unknown[0]!r}; "
                         f"options: {', '.join(known) or 'none'}")
    made = source.factory(**options)
    if source.registered or isinstance(made, EnvFactory):
        return made
    if not isinstance(made, Environment):
        missing = [name for name in ENVIRONMENT_METHODS if not callable(getattr(made, name, None))]
        listed = ", ".join(missing[:-1]) + (" and " if len(missing) > 1 else "") + missing[-1]
        raise ValueError(f"environment {source.name!r}: the factory returned a {type(made).__name__}, which "
                         f"lacks the Environment method{'s' if len(missing) > 1 else ''} {listed} (an environment "
                         f"has {', '.join(ENVIRONMENT_METHODS[:-1])} and {ENVIRONMENT_METHODS[-1]})")
    return EnvFactory(source.name, partial(source.factory, **options), tools=tuple(getattr(made, "tools", ())),
                      binary_rewards=source.spec.rewards_are_binary(options))
