"""The ``verl.plugins`` entry point: ``import verl`` imports this module, which registers TRACE with verl.

verl loads every entry point of the group ``verl.plugins`` at import (``VERL_USE_EXTERNAL_PLUGINS``: "auto",
the default; "none"; or a comma-separated list of names, which must then include ``trace``) and logs a
plugin that raises at DEBUG only, so a broken plugin would be silently absent. This module therefore never
raises: it checks the installed verl against :data:`~trace_train.integrations.verl.VERL_VERSIONS` and
registers, and when something is wrong it says so in ONE line at WARNING level (verl's default level shows
it), naming what failed and how to fix it; :data:`PROBLEM` keeps that line and :data:`REGISTERED` what was
registered:

* ``estimators``: ``trace`` and ``trace_<name>`` (``algorithm.adv_estimator``), :mod:`.estimator`;
* ``agent_loops``: ``trace_tool_agent`` (``actor_rollout_ref.rollout.agent.default_agent_loop``);
* ``trainers``: ``trace`` (``trainer.v1.trainer_mode``), which needs verl's V1 stack (TransferQueue).

Check an install: ``python -c "import verl, trace_train.integrations.verl.plugin as p; print(p.summary())"``.
"""

from __future__ import annotations

import logging

from . import VERL_VERSION, VERL_VERSIONS

__all__ = ["REGISTERED", "PROBLEM", "register", "summary", "supported"]

logger = logging.getLogger("trace_train.integrations.verl")

REGISTERED: dict[str, list[str]] = {"estimators": [], "agent_loops": [], "trainers": []}
PROBLEM: str | None = None
"""The one line logged when the plugin could not register everything (None: it did)."""


def _fail(line: str) -> None:
    global PROBLEM
    PROBLEM = line
    logger.warning(line)


def register() -> dict[str, list[str]]:
    """Register TRACE's estimators, agent loop and trainer with verl (idempotent); see the module docstring."""
    try:
        import verl
    except Exception as error:  # noqa: BLE001 - reported in one line, never raised (verl would hide it)
        _fail(f"TRACE's verl plugin is not registered: `import verl` failed ({type(error).__name__}: {error}); "
              f"install it with `pip install -e '.[verl]'` in the TRACE repository (verl{VERL_VERSIONS})")
        return REGISTERED
    found = getattr(verl, "__version__", "unknown")
    if not supported(found):
        _fail(f"TRACE's verl plugin is not registered: it needs verl{VERL_VERSIONS} (tested: {VERL_VERSION}), "
              f"found verl {found} (`pip install -e '.[verl]'` in the TRACE repository)")
        return REGISTERED
    step = "the advantage estimators"
    try:
        from .estimator import register_estimators

        REGISTERED["estimators"] = register_estimators()
        step = "the trace_tool_agent agent loop"
        from .agent_loop import AGENT_LOOP

        REGISTERED["agent_loops"] = [AGENT_LOOP]
        step = "the trace trainer (verl's V1 stack: ray, transfer_queue)"
        from . import trainer  # noqa: F401  (registers "trace")

        REGISTERED["trainers"] = ["trace"]
    except Exception as error:  # noqa: BLE001 - reported in one line, never raised (verl would hide it)
        _fail(f"TRACE's verl plugin could not register {step}: {type(error).__name__}: {error}")
    return REGISTERED


def supported(version: str) -> bool:
    """Whether verl ``version`` is in :data:`~trace_train.integrations.verl.VERL_VERSIONS`."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        return Version(str(version)) in SpecifierSet(VERL_VERSIONS)
    except InvalidVersion:
        return False


def summary() -> str:
    """One line: what is registered, read back from verl's own registries (or the problem)."""
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY

    estimators = sorted(n for n in ADV_ESTIMATOR_REGISTRY if n == "trace" or n.startswith("trace_"))
    loops = sorted(n for n in _agent_loop_registry if n.startswith("trace"))
    try:
        from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

        trainers = sorted(n for n in TRAINER_REGISTRY if n.startswith("trace"))
    except Exception:  # noqa: BLE001 - the V1 stack is missing: PROBLEM says so
        trainers = []
    import verl

    found = getattr(verl, "__version__", "?")
    line = f"TRACE in verl {found}: estimators {estimators}, agent loops {loops}, trainers {trainers}"
    return line if PROBLEM is None else f"{line}; problem: {PROBLEM}"


register()
