"""Environments by name, so that configs can pick one: ``make_env_factory("search_qa", {"corpus": ...})``.

``ENVIRONMENTS[name](**options)`` returns an :class:`EnvFactory`: the zero-argument ``make_env`` the
rollout engine calls once per rollout, with what a caller must know about the environment (the tool
schemas for the chat template, whether rewards are binary). Options are checked when the factory is
built (it builds one environment to validate them), and shared resources such as a BM25 index are
built once there and shared by every instance. Heavy imports (``bm25s``, ``bfcl_eval``) happen only
when their environment is built.

=================  =================================================================================
``guess_number``   ``system_prompt``
``math_python``    ``max_tool_calls=8``, ``observation_role="tool"``, ``answer_timeout=5.0``,
                   ``system_prompt=None``, ``sandbox={}`` (fields of ``tools.sandbox.SandboxLimits``)
``search_qa``      ``corpus=None`` (a JSONL corpus for BM25) or ``retriever_url=None`` (a Search-R1
                   server; exactly one of the two), ``topk=3``, ``timeout=10.0`` (HTTP),
                   ``reward="exact_match"`` ("f1_match", "token_f1"), ``max_searches=4``,
                   ``observation_role="tool"``, ``system_prompt=None``
``bfcl``           ``observation_role="tool"``, ``max_steps_per_turn=None`` (BFCL's limit, 20)
=================  =================================================================================
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Mapping

from trace_theory._registry import Registry

from .base import Environment

__all__ = ["ENVIRONMENTS", "EnvFactory", "make_env_factory"]


@dataclass(frozen=True)
class EnvFactory:
    """A ``make_env`` for the rollout engine, with the facts about its environment a caller needs."""

    name: str
    """The registry name."""
    make: Callable[[], Environment]
    """Builds a fresh environment (shared resources are bound in)."""
    tools: tuple[dict, ...] = ()
    """JSON schemas of the tools, for chat templates that take ``tools=`` (``tooling.chat_format``)."""
    binary_rewards: bool = True
    """Whether ``verify`` returns only 0 or 1; else the engine needs ``binary_rewards=False``."""

    def __call__(self) -> Environment:
        return self.make()


ENVIRONMENTS: Registry[Callable[..., EnvFactory]] = Registry("environment")


def make_env_factory(name: str, options: Mapping[str, Any] | None = None) -> EnvFactory:
    """``ENVIRONMENTS[name](**options)``, with unknown option names reported with the known ones."""
    builder = ENVIRONMENTS[name]
    options = dict(options or {})
    known = list(inspect.signature(builder).parameters)
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"environment {name!r} has no option {unknown[0]!r}; options: {', '.join(known)}")
    return builder(**options)


def _checked(name: str, make: Callable[[], Environment], **facts) -> EnvFactory:
    make()  # validates the options now rather than in the first rollout
    return EnvFactory(name, make, **facts)


@ENVIRONMENTS.register("guess_number")
def guess_number(*, system_prompt: str | None = None) -> EnvFactory:
    from .guess_number import SYSTEM_PROMPT, GuessNumberEnv

    return _checked("guess_number", partial(GuessNumberEnv, system_prompt=system_prompt or SYSTEM_PROMPT))


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


@ENVIRONMENTS.register("search_qa")
def search_qa(*, corpus: str | None = None, retriever_url: str | None = None, topk: int = 3,
              timeout: float = 10.0, reward: str = "exact_match", max_searches: int = 4,
              observation_role: str = "tool", system_prompt: str | None = None) -> EnvFactory:
    from ..tools.search import BM25Retriever, HttpRetriever, SearchTool
    from .search_qa import REWARDS, SEARCH_TOOL, SearchQAEnv

    if (corpus is None) == (retriever_url is None):
        raise ValueError("search_qa needs exactly one of `corpus` (a JSONL file for BM25) "
                         "and `retriever_url`")
    if reward not in REWARDS:  # before the index is built
        raise ValueError(f"`reward` must be one of {REWARDS}, got {reward!r}")
    if corpus is not None:
        if not Path(corpus).is_file():
            raise ValueError(f"search_qa: the corpus {str(corpus)!r} is not a file")
        retriever = BM25Retriever.from_jsonl(corpus)
    else:
        retriever = HttpRetriever(retriever_url, timeout=timeout)
    make = partial(SearchQAEnv, SearchTool(retriever, topk=topk), reward=reward, max_searches=max_searches,
                   observation_role=observation_role, system_prompt=system_prompt)
    return _checked("search_qa", make, tools=(SEARCH_TOOL,), binary_rewards=reward != "token_f1")


@ENVIRONMENTS.register("bfcl")
def bfcl(*, observation_role: str = "tool", max_steps_per_turn: int | None = None) -> EnvFactory:
    from ..tools.bfcl import MAX_STEPS_PER_TURN
    from .bfcl import BfclEnv

    steps = MAX_STEPS_PER_TURN if max_steps_per_turn is None else max_steps_per_turn
    return _checked("bfcl", partial(BfclEnv, observation_role=observation_role, max_steps_per_turn=steps))
