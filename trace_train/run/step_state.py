"""What a resumed step reads besides the weights, captured before each step so that no checkpoint is
ever written with a later step's state, and the settings a resume may change.

A checkpoint of step N holds the policy and optimiser after step N's update and everything the next
step reads: the prompt sampler's position, the success predictor, the rollout engine's running cost
estimates (tokens per rollout, continuation cost ratio, turns per rollout, which set a token-priced
policy's prices), pipelined expansion's pending step and every random state. The trainer captures a
:class:`StepState` at the start of each step, before the rollout changes any of them; when the step's loss is not finite (no update was made),
the checkpoint of step N is written from that capture (or, when it is already on disk, left as it was),
never from the state the failed step left behind.

Resuming may change the run's length and the two settings a non-finite loss asks to change
(:data:`RESUME_OVERRIDES`: ``optim.lr``, ``optim.grad_clip``, ``steps``): the checkpoint records a
fingerprint of the config without them (:func:`trajectory_fingerprint`), the optimiser's learning rate
is set from the new config after its state is loaded, and each change is printed as one line.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from ..predictors.base import state_digest  # noqa: F401 (one digest for the job's checks)
from .checkpoint import capture_rng

__all__ = ["StepState", "engine_costs", "set_engine_costs", "state_digest", "RESUME_OVERRIDES",
           "trajectory_fingerprint", "describe_overrides", "apply_optimizer_overrides"]

RESUME_OVERRIDES = ("optim.lr", "optim.grad_clip", "steps")
"""Settings a resumed run may change (besides checkpointing and logging)."""


def engine_costs(engine) -> tuple:
    """The engine's running cost estimates, in checkpoint order."""
    return (engine.tokens_per_rollout, engine.continuation_cost_ratio, engine.turns_per_rollout)


def set_engine_costs(engine, costs) -> None:
    """Put back :func:`engine_costs` (a checkpoint written before ``turns_per_rollout`` was stored holds
    two: the third is then left unset, as that run had it after a restart)."""
    costs = tuple(costs)
    if len(costs) not in (2, 3):
        raise ValueError(f"engine_costs holds {len(costs)} values; expected 2 or 3")
    engine.tokens_per_rollout, engine.continuation_cost_ratio = costs[:2]
    if len(costs) == 3:
        engine.turns_per_rollout = costs[2]


@dataclass(frozen=True)
class StepState:
    """Everything besides weights and optimiser that a checkpoint holds, as of one moment."""

    predictor: dict
    sampler: dict
    engine_costs: tuple
    rng: dict
    eager_threshold: float | None = None
    """Eager expansion's carried threshold (``RolloutEngine.eager_threshold``)."""
    pending: Any = None
    """Pipelined expansion's pending step (``RolloutEngine.pending``: immutable, never changed in place)."""

    @classmethod
    def capture(cls, run) -> "StepState":
        """The state of ``run`` now (copied: later steps cannot change it)."""
        return cls(copy.deepcopy(run.predictor.state_dict()), copy.deepcopy(run.sampler.state()),
                   engine_costs(run.engine), capture_rng(), run.engine.eager_threshold, run.engine.pending)


def trajectory_fingerprint(cfg, resume_fingerprint) -> str:
    """``resume_fingerprint`` of ``cfg`` with the :data:`RESUME_OVERRIDES` at their defaults."""
    defaults = type(cfg)()
    plain = dataclasses.replace(cfg, steps=defaults.steps,
                                optim=dataclasses.replace(cfg.optim, lr=defaults.optim.lr,
                                                          grad_clip=defaults.optim.grad_clip))
    return hashlib.sha256(json.dumps(["no-overrides", resume_fingerprint(plain)]).encode()).hexdigest()[:16]


def _get(data: dict, dotted: str) -> Any:
    for key in dotted.split("."):
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def describe_overrides(stored: dict, current: dict) -> list[str]:
    """``name: old -> new`` for each of :data:`RESUME_OVERRIDES` that differs between two config dicts."""
    return [f"{name}: {_get(stored, name)!r} -> {_get(current, name)!r}" for name in RESUME_OVERRIDES
            if _get(stored, name) != _get(current, name)]


def apply_optimizer_overrides(optimizer, cfg) -> None:
    """Set the learning rate of every parameter group to ``cfg.optim.lr`` (a loaded optimiser state
    brings the old one back; ``grad_clip`` is read from the config at each step)."""
    for group in optimizer.param_groups:
        group["lr"] = cfg.optim.lr
