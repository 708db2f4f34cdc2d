"""Environments by name, so that configs can pick one: ``make_env_factory("search_qa", {"corpus": ...})``.

``ENVIRONMENTS[name](**options)`` returns an :class:`EnvFactory`: the zero-argument ``make_env`` the
rollout engine calls once per rollout (both live in :mod:`.spec`), with what a caller must know about the environment (the tool
schemas for the chat template, whether rewards are binary). Options are checked when the factory is
built (it builds one environment to validate them), and shared resources such as a BM25 index are
built once there and shared by every instance. Heavy imports (``bm25s``, ``bfcl_eval``) happen only
when their environment is built. Each builder carries its :class:`~.spec.TaskSpec` (``task_spec``): how
its rows are made or loaded and which row options (``task.rows``) it takes. Environments from outside
the package (import paths, the ``trace_rl.environments`` entry points) are found by :mod:`.spec`.

=================  =================================================================================
``guess_number``   ``system_prompt``, ``step_seconds=0`` (latency of every step, as a slow tool's)
``math_python``    ``max_tool_calls=8``, ``observation_role="tool"``, ``answer_timeout=5.0``,
                   ``system_prompt=None``, ``sandbox={}`` (fields of ``tools.sandbox.SandboxLimits``)
``search_qa``      ``corpus=None`` (a JSONL corpus for BM25) or ``retriever_url=None`` (a Search-R1
                   server; exactly one of the two), ``topk=3``, ``timeout=10.0`` (HTTP),
                   ``reward="exact_match"`` (or "token_f1"; "f1_match" is reported, refused as a reward), ``max_searches=4``,
                   ``observation_role="tool"``, ``system_prompt=None``
``bfcl``           ``observation_role="tool"``, ``max_steps_per_turn=None`` (BFCL's limit, 20)
``key_lock``       ``system_prompt=None``; rows: ``task.rows={keys: [2, 4, 8]}`` (the mix of key counts K)
=================  =================================================================================
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any, Callable, Mapping

from ..verifiers.qa import check_reward, is_binary_reward
from .base import Environment
from .spec import ENVIRONMENTS, EnvFactory, EvalSpec, TaskSpec, build_factory, find_environment

__all__ = ["ENVIRONMENTS", "EnvFactory", "make_env_factory"]




def make_env_factory(name: str, options: Mapping[str, Any] | None = None) -> EnvFactory:
    """The factory of environment ``name`` (registered, an import path or an entry point; see
    :mod:`.spec`) with ``options``; unknown option names are reported with the known ones."""
    return build_factory(find_environment(name), options or {})


def _checked(name: str, make: Callable[[], Environment], **facts) -> EnvFactory:
    make()  # validates the options now rather than in the first rollout
    return EnvFactory(name, make, **facts)


def _with_spec(spec: TaskSpec):
    """Attach the environment's task spec (how its rows are made or loaded) to its builder."""
    def attach(builder):
        builder.task_spec = spec
        return builder

    return attach


# ---------------------------------------------------------------------------------------------------
# Rows of the registered environments (``TaskSpec.rows``)
# ---------------------------------------------------------------------------------------------------


def guess_rows(source: None, *, split: str, subset: str | None, size: int, seed: int, low: int = 1,
               high: int = 16, max_guesses: int | list = 5, highs: list | None = None, shift: int = 0) -> list[dict]:
    """Generated games. ``highs`` (a list) mixes difficulties: each row draws its range [low, high] from
    it, so that, as in real data sets, some prompts are almost always solved and some almost never.
    ``max_guesses`` as a list mixes episode lengths the same way: each row draws its guess budget from it
    (episodes of 1 to 8 turns, as agent tasks vary in length). ``shift``: each row's range (and target)
    moves up by an offset drawn from 0..shift, so rows show distinct prompts ("from 38 to 53") and held-out
    games are ranges never trained on (the target alone is hidden: without a shift, rows of one range are
    one prompt)."""
    import numpy as np

    from .guess_number import make_rows

    if isinstance(shift, bool) or not isinstance(shift, int) or shift < 0:
        raise ValueError(f"`shift` must be a non-negative integer, got {shift!r}")
    if shift:
        rows = guess_rows(source, split=split, subset=subset, size=size, seed=seed, low=low, high=high,
                          max_guesses=max_guesses, highs=highs)
        offsets = np.random.default_rng([seed, 13]).integers(0, shift + 1, size)
        return [dict(row, low=row["low"] + int(o), high=row["high"] + int(o), target=row["target"] + int(o))
                for row, o in zip(rows, offsets)]

    if isinstance(max_guesses, (list, tuple)):
        if not max_guesses or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 1 for g in max_guesses):
            raise ValueError(f"`max_guesses` must be a positive integer or a non-empty list of them, got {max_guesses!r}")
        rows = guess_rows(source, split=split, subset=subset, size=size, seed=seed, low=low, high=high,
                          max_guesses=max(max_guesses), highs=highs)
        budget = np.random.default_rng([seed, 11]).choice(np.asarray(max_guesses), size)
        return [dict(row, max_guesses=int(g)) for row, g in zip(rows, budget)]
    if highs is None:
        return make_rows(size, seed=seed, low=low, high=high, max_guesses=max_guesses)
    choice = np.random.default_rng([seed, 7]).integers(0, len(highs), size)
    rows = {h: iter(make_rows(int((choice == i).sum()), seed=seed + i, low=low, high=int(h),
                              max_guesses=max_guesses)) for i, h in enumerate(highs)}
    return [next(rows[highs[i]]) for i in choice]


def math_rows(source: str, *, split: str, subset: str | None, size: int, seed: int) -> list[dict]:
    """Problems with answers (DeepScaleR, AIME, AMC, MATH-500 layouts; ``trace_train.data.math``)."""
    from ..data.math import load_math_problems
    from .math_python import math_rows as rows_of

    return rows_of(load_math_problems(source, split=split, subset=subset, limit=size))


def qa_rows(source: str, *, split: str, subset: str | None, size: int, seed: int) -> list[dict]:
    """HotpotQA / 2WikiMultiHopQA-style questions (``trace_train.data.qa``); "demo": the bundled set."""
    from ..data.qa import demo_paths, load_qa_examples
    from .search_qa import qa_rows as rows_of

    path = demo_paths()[1] if source == "demo" else source
    return rows_of(load_qa_examples(path, split=split, subset=subset, limit=size))


def bfcl_task_rows(source: str, *, split: str, subset: str | None, size: int, seed: int,
                   subsets: list | None = None) -> list[dict]:
    """BFCL v4 multi-turn tasks of the stored 80/20 split ``source`` ("train" or "test")."""
    from .bfcl import SUBSETS, bfcl_rows

    return bfcl_rows(tuple(subsets or SUBSETS), split=source)[:size]


def _qa_demonstration(row: Mapping[str, Any]) -> list[str]:
    from .search_qa import qa_demonstration

    return qa_demonstration(row)


def _demo_corpus(options: Mapping[str, Any]) -> dict:
    """search_qa without a corpus or a retriever searches the bundled demo corpus."""
    if options.get("corpus") is None and options.get("retriever_url") is None:
        from ..data.qa import demo_paths

        return {**options, "corpus": str(demo_paths()[0])}
    return dict(options)


# ---------------------------------------------------------------------------------------------------
# How trace-eval scores them (``EvalSpec``; ``config`` is trace-eval's EvalConfig)
# ---------------------------------------------------------------------------------------------------


def _pass_at_k(records, name: str, k: int) -> dict:
    return {f"pass@{k}": float(sum(max(s["metrics"][name] for s in r["samples"]) for r in records) / len(records))}


def math_metrics(records, means, *, k: int) -> dict:
    """``accuracy`` (share of correct rollouts, mean@k) and, for k > 1, ``pass@k``."""
    return {"accuracy": means["correct"], **(_pass_at_k(records, "correct", k) if k > 1 else {})}


def qa_metrics(records, means, *, k: int) -> dict:
    """``exact_match``, ``f1_match`` (exact match at F1 >= 0.3) and ``token_f1``: means over rollouts."""
    return {name: means[name] for name in ("exact_match", "f1_match", "token_f1")}


def bfcl_metrics(records, means, *, k: int) -> dict:
    """``accuracy`` (the official checker), overall and per subset."""
    subsets = sorted({r["subset"] for r in records})
    return {"accuracy": means["accuracy"], "per_subset": {
        s: float(sum(x["metrics"]["accuracy"] for r in records if r["subset"] == s for x in r["samples"])
                 / sum(len(r["samples"]) for r in records if r["subset"] == s)) for s in subsets}}


def _qa_check(config) -> None:
    if config.corpus is not None and config.retriever_url is not None:
        raise ValueError("give `corpus` or `retriever_url`, not both")
    if config.data != "demo" and config.corpus is None and config.retriever_url is None:
        raise ValueError("benchmark qa needs `corpus` (a JSONL file) or `retriever_url` unless data=demo")
    if config.corpus is not None and not Path(config.corpus).is_file():
        raise ValueError(f"the corpus {config.corpus!r} is not a file")


def _qa_options(config) -> dict:
    return _demo_corpus({"corpus": config.corpus, "retriever_url": config.retriever_url, "topk": config.topk,
                         "max_searches": config.max_tool_calls or 4})


BFCL_SPLITS = ("train", "test", "all")


def _bfcl_check(config) -> None:
    from .bfcl import SUBSETS

    if config.split not in BFCL_SPLITS:
        raise ValueError(f"bfcl `split` must be one of {BFCL_SPLITS}, got {config.split!r}")
    if not config.subsets or any(s not in SUBSETS for s in config.subsets):
        raise ValueError(f"`subsets` must be a non-empty list drawn from {SUBSETS}, got {config.subsets!r}")


def _bfcl_eval_rows(config) -> list[dict]:
    """The first ``limit`` tasks of each subset of the stored split ("all": both)."""
    from .bfcl import bfcl_rows

    split = None if config.split == "all" else config.split
    return [row for subset in config.subsets for row in bfcl_rows([subset], split=split)[:config.limit]]


# ---------------------------------------------------------------------------------------------------
# The registered environments
# ---------------------------------------------------------------------------------------------------


@_with_spec(TaskSpec(guess_rows, {"low": 1, "high": 16, "max_guesses": 5, "highs": None, "shift": 15},
                     data="generated",
                     prompt_key=lambda row: [row["low"], row["high"], row["max_guesses"]]))
@ENVIRONMENTS.register("guess_number")
def guess_number(*, system_prompt: str | None = None, step_seconds: float = 0.0) -> EnvFactory:
    from .guess_number import SYSTEM_PROMPT, GuessNumberEnv

    return _checked("guess_number", partial(GuessNumberEnv, system_prompt=system_prompt or SYSTEM_PROMPT,
                                            step_seconds=step_seconds))


@_with_spec(TaskSpec(math_rows, evaluation=EvalSpec(
    flags=("data", "max_tool_calls"), data_help="a JSONL/Parquet file or a Hub id with problem/answer columns",
    env_options=lambda config: {"max_tool_calls": config.max_tool_calls or 8}, metrics=math_metrics)))
@ENVIRONMENTS.register("math_python")
def math_python(*, max_tool_calls: int = 8, observation_role: str = "tool", answer_timeout: float = 5.0,
                system_prompt: str | None = None, sandbox: Mapping[str, Any] | None = None) -> EnvFactory:
    from ..tools.sandbox import SandboxLimits
    from .math_python import PYTHON_TOOL, MathPythonEnv

    try:
        limits = SandboxLimits(**dict(sandbox or {}))
    except TypeError as error:
        raise ValueError(f"`sandbox` takes fields of SandboxLimits: {error}") from None
    make = partial(MathPythonEnv, max_tool_calls=max_tool_calls, limits=limits,
                   observation_role=observation_role, answer_timeout=answer_timeout,
                   system_prompt=system_prompt)
    return _checked("math_python", make, tools=(PYTHON_TOOL,))


@_with_spec(TaskSpec(qa_rows, binary_rewards=lambda env: is_binary_reward(env.get("reward", "exact_match")),
                     env_defaults=_demo_corpus, evaluation=EvalSpec(
                         flags=("data", "corpus", "retriever_url", "max_tool_calls"),
                         data_help="a questions file, a Hub id, or 'demo'", check=_qa_check, env_options=_qa_options,
                         metrics=qa_metrics), demonstration=_qa_demonstration))
@ENVIRONMENTS.register("search_qa")
def search_qa(*, corpus: str | None = None, retriever_url: str | None = None, topk: int = 3,
              timeout: float = 10.0, reward: str = "exact_match", max_searches: int = 4,
              observation_role: str = "tool", system_prompt: str | None = None) -> EnvFactory:
    from ..tools.search import BM25Retriever, HttpRetriever, SearchTool
    from .search_qa import SEARCH_TOOL, SearchQAEnv

    if (corpus is None) == (retriever_url is None):
        raise ValueError("search_qa needs exactly one of `corpus` (a JSONL file for BM25) "
                         "and `retriever_url`")
    check_reward(reward)  # before the index is built
    if corpus is not None:
        if not Path(corpus).is_file():
            raise ValueError(f"search_qa: the corpus {str(corpus)!r} is not a file")
        retriever = BM25Retriever.from_jsonl(corpus)
    else:
        retriever = HttpRetriever(retriever_url, timeout=timeout)
    make = partial(SearchQAEnv, SearchTool(retriever, topk=topk), reward=reward, max_searches=max_searches,
                   observation_role=observation_role, system_prompt=system_prompt)
    return _checked("search_qa", make, tools=(SEARCH_TOOL,), binary_rewards=is_binary_reward(reward))


def _rg_rows(source: None, **kwargs) -> list[dict]:
    from .reasoning_gym_env import reasoning_gym_rows

    return reasoning_gym_rows(source, **kwargs)


def _rg_demonstration(row: Mapping[str, Any]) -> list[str]:
    from .reasoning_gym_env import demonstration

    return demonstration(row)


def success_metrics(records, means, *, k: int) -> dict:
    """``success`` (binary reward, mean@k), ``score`` (the raw graded score) and, for k > 1, ``pass@k``."""
    return {"success": means["success"], "score": means["score"],
            **(_pass_at_k(records, "success", k) if k > 1 else {})}


@_with_spec(TaskSpec(_rg_rows, data="generated", env_row_options=("dataset", "levels", "config"),
                     prompt_key=lambda row: row["question"], demonstration=_rg_demonstration,
                     evaluation=EvalSpec(max_turns=1, flags=(), metrics=success_metrics)))
@ENVIRONMENTS.register("reasoning_gym")
def reasoning_gym(*, dataset: str | None = None, levels: list | None = (0,), config: Mapping[str, Any] | None = None,
                  threshold: float = 1.0, attempts: int = 1, system_prompt: str | None = None) -> EnvFactory:
    """reasoning-gym's data set ``dataset`` (``levels`` and ``config`` shape its rows: ``reasoning_gym_env``)."""
    from .reasoning_gym_env import ReasoningGymEnv, _configs, check_dataset

    if dataset is None:
        raise ValueError("reasoning_gym: set the data set, e.g. task.env.dataset=countdown")
    check_dataset(dataset)
    _configs(dataset, None if levels is None else list(levels), dict(config or {}), seed=0, size=1)  # checks both
    return _checked("reasoning_gym", partial(ReasoningGymEnv, dataset, threshold=threshold, attempts=attempts,
                                             system_prompt=system_prompt))


@_with_spec(TaskSpec(bfcl_task_rows, {"subsets": None}, data="optional", default_sources=("train", "test"),
                     evaluation=EvalSpec(max_turns=40, flags=(), check=_bfcl_check, rows=_bfcl_eval_rows,
                                         metrics=bfcl_metrics)))
@ENVIRONMENTS.register("bfcl")
def bfcl(*, observation_role: str = "tool", max_steps_per_turn: int | None = None) -> EnvFactory:
    from ..tools.bfcl import MAX_STEPS_PER_TURN
    from .bfcl import BfclEnv

    steps = MAX_STEPS_PER_TURN if max_steps_per_turn is None else max_steps_per_turn
    return _checked("bfcl", partial(BfclEnv, observation_role=observation_role, max_steps_per_turn=steps))


# ---------------------------------------------------------------------------------------------------
# textarena: TextArena's single-player games (``textarena_env``). Options: ``env_id`` (a game id, or a
# list of them to mix levels), ``game_kwargs={}`` (over the id's constructor options, e.g. {size: 3}),
# ``success_threshold=1.0`` (reward = 1[TextArena score >= it]), ``system_prompt=None``
# ---------------------------------------------------------------------------------------------------


def textarena_rows(source: None, *, split: str, subset: str | None, size: int, seed: int,
                   env_id: str | list | None = None, game_kwargs: Mapping[str, Any] | None = None) -> list[dict]:
    """Seeded games of ``task.env.env_id``, one distinct opening each (``textarena_env.make_rows``); the
    trainer splits them by prompt (``trace_train.tasks.generated_rows``)."""
    from .textarena_env import make_rows

    if not env_id:
        raise ValueError("task textarena needs `task.env.env_id`: a single-player TextArena game id such as "
                         "FrozenLake-v0 (or a list of them)")
    return make_rows(env_id, size, seed=seed, game_kwargs=game_kwargs)


def _textarena_demonstration(row: Mapping[str, Any]) -> list[str]:
    from .textarena_env import demonstration

    return demonstration(row)


def textarena_metrics(records, means, *, k: int) -> dict:
    """``success``, ``score`` and ``pass@k`` (:func:`success_metrics`), and ``per_level``: success per level
    (the index of the game in a list of ``env_id``; from the row ids, ``<env id>/L<level>/<seed>``)."""
    levels: dict[str, list] = {}
    for record in records:
        level = str(record["id"]).split("/")[1] if str(record["id"]).count("/") == 2 else "-"
        levels.setdefault(level, []).extend(s["metrics"]["success"] for s in record["samples"])
    return {**success_metrics(records, means, k=k),
            "per_level": {level: float(sum(v) / len(v)) for level, v in sorted(levels.items())}}


def _textarena_check(config) -> None:
    if not config.env_options.get("env_id"):
        raise ValueError("trace-eval --task textarena needs the game: --env-options '{env_id: FrozenLake-v0}'")


@_with_spec(TaskSpec(textarena_rows, data="generated", env_row_options=("env_id", "game_kwargs"),
                     demonstration=_textarena_demonstration,
                     evaluation=EvalSpec(max_turns=16, flags=(), check=_textarena_check, metrics=textarena_metrics)))
@ENVIRONMENTS.register("textarena")
def textarena(*, env_id: str | list | None = None, game_kwargs: Mapping[str, Any] | None = None,
              success_threshold: float = 1.0, system_prompt: str | None = None) -> EnvFactory:
    """TextArena's single-player game ``env_id`` (or games: a list mixes them as levels)."""
    from .textarena_env import TextArenaEnv, check_game

    if not env_id or not isinstance(env_id, (str, list, tuple)):
        raise ValueError("textarena needs `env_id`: a single-player TextArena game id such as FrozenLake-v0 "
                         f"(or a list of them), got {env_id!r}")
    for game in [env_id] if isinstance(env_id, str) else env_id:
        check_game(game, game_kwargs)
    return _checked("textarena", partial(TextArenaEnv, success_threshold=success_threshold,
                                         system_prompt=system_prompt))


def key_lock_rows(source: None, *, split: str, subset: str | None, size: int, seed: int,
                  keys: list | int = (2, 4, 8)) -> list[dict]:
    """Generated key-then-lock rows, K drawn from ``keys`` (``key_lock_env.make_rows``); the trainer splits them
    by prompt (``trace_train.tasks.generated_rows``)."""
    from .key_lock_env import make_rows

    return make_rows(size, keys=list(keys) if isinstance(keys, tuple) else keys, seed=seed)


def _key_lock_demonstration(row: Mapping[str, Any]) -> list[str]:
    from .key_lock_env import random_player

    return random_player(row)


def key_lock_metrics(records, means, *, k: int) -> dict:
    """``success`` (and ``pass@k`` for k > 1), ``opened`` (the right key used) and ``per_keys``: success per
    key count K (from the row ids, ``key_lock/K<K>/...``)."""
    by_keys: dict[str, list] = {}
    for record in records:
        parts = str(record["id"]).split("/")
        by_keys.setdefault(parts[1] if len(parts) == 3 else "-", []).extend(
            s["metrics"]["success"] for s in record["samples"])
    return {"success": means["success"], "opened": means["opened"],
            **(_pass_at_k(records, "success", k) if k > 1 else {}),
            "per_keys": {key: float(sum(v) / len(v)) for key, v in sorted(by_keys.items())}}


@_with_spec(TaskSpec(key_lock_rows, {"keys": [2, 4, 8]}, data="generated", demonstration=_key_lock_demonstration,
                     evaluation=EvalSpec(max_turns=2, flags=(), metrics=key_lock_metrics)))
@ENVIRONMENTS.register("key_lock")
def key_lock(*, system_prompt: str | None = None) -> EnvFactory:
    """Key, then lock (``key_lock_env``): turn 1 a key of K, turn 2 a chest; reward 1 only with both right."""
    from .key_lock_env import SYSTEM_PROMPT, KeyLockEnv

    return _checked("key_lock", partial(KeyLockEnv, system_prompt=system_prompt or SYSTEM_PROMPT))
