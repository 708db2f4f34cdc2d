"""Environments behind one protocol (:mod:`.base`), by name in :data:`ENVIRONMENTS` (:mod:`.registry`).

- ``guess_number``: a synthetic multi-turn task a tiny model learns on a CPU.
- ``math_python``: math with a sandboxed Python tool, checked by math-verify.
- ``search_qa``: multi-hop QA with a search tool (local BM25 or a Search-R1 HTTP retriever).
- ``bfcl``: BFCL v4 multi-turn function calling with the official back ends and checker.

The tool environments' modules import their tool back ends (``bm25s``, ``bfcl_eval``) when imported;
this package imports only the protocol, the registry and the guess-the-number task.
"""
from .base import EndReason, Environment, EpisodeLimits, Message, StepResult, is_concurrency_safe  # noqa: F401
from .guess_number import GuessNumberEnv, GuessState, make_rows  # noqa: F401
from .registry import ENVIRONMENTS, EnvFactory, make_env_factory  # noqa: F401
