"""The config's history as resumes see it: which fields a run may change, and which came and went.

A run resumes only under the config it started with (``run.resume``), compared through a fingerprint of
everything that determines its trajectory. Fields change over the project's life; each change is written
here once, so that runs started before it still resume. (Renamed and removed *keys* of a config file are
``TrainConfig.RENAMED`` / ``TrainConfig.REMOVED``, applied when a config is loaded.)
"""

from __future__ import annotations

__all__ = ["ADDED_SINKS", "NOT_IN_FINGERPRINT", "REMOVED_IN_FINGERPRINT", "ADDED_IN_FINGERPRINT",
           "DEFAULT_CHANGED_IN_FINGERPRINT", "EAGER_ONLY", "BRANCHING_ONLY", "DEFAULT_CHANGED_IN_TRAJECTORY"]

ADDED_SINKS = ("max_env_failure_share", "env_failure_warn_share", "log_every", "quiet", "max_length_cut_share",
               "distributed")
"""Top-level fields added after checkpoints existed that only say where results and warnings go, when a run
stops, or how long its ranks wait for each other."""

NOT_IN_FINGERPRINT = ("steps", "checkpoint_every", "keep_checkpoints", "tensorboard", "wandb_project", "run_dir",
                      *ADDED_SINKS)
"""Fields that do not change what a run computes: a run may be resumed with other values of these."""

REMOVED_IN_FINGERPRINT = {"predictor": {"seed": 0}}
"""Fields removed after checkpoints existed, hashed at the value every run had, so older runs still resume."""

ADDED_IN_FINGERPRINT = {"predictor": {"probe_step": 1.0}, "rollout": {"expansion": "streamed", "eager_reserve": 0.0,
                                                                             "eager_lag": 1, "pilot": None,
                                                                             "pilot_band": None, "pilot_share": None},
                        "model": {"activation_checkpointing": False}, "optim": {"mini_batches": 1},
                        "algorithm": {"recompute_old_logprobs": None},
                        "backend": {"prefix_cache_bytes": 2**30, "block_size": None}}
"""Fields added after checkpoints existed: left out of the hash while they hold the default every older run
had, so older runs still resume (a run that sets another value is another trajectory, and hashes it)."""

DEFAULT_CHANGED_IN_FINGERPRINT = {"backend": {"sleep_during_update": (None, False)}}
"""Fields whose default changed after checkpoints existed, and that do not change the trajectory: the new
default (first) is hashed as the old one (second), so older runs still resume."""

EAGER_ONLY = {"rollout": {"eager_reserve": 0.0, "eager_lag": 1}}
"""Fields read only under ``rollout.expansion=eager``: a run with another expansion is hashed and compared at
these values (the ones every older run had), whatever it holds, so that a default changed here changes no
such run."""

BRANCHING_ONLY = {"rollout": {"expansion": "streamed"}}
"""Fields read only by a policy that branches (``AllocationPolicy.branches``; one that does not, GRPO or DAPO,
runs as with the barrier whatever they hold): a run of a registered policy that does not branch is hashed and
compared at these values (and :data:`EAGER_ONLY`'s), the ones every older run had, so that a GRPO run started
before ``rollout.expansion``'s default changed resumes without setting it."""

DEFAULT_CHANGED_IN_TRAJECTORY = {"rollout": {"eager_lag": (0, 1, "round 14"),
                                             "expansion": ("eager", "streamed", "2026-12-07")}}
"""Fields whose default changed after checkpoints existed and that do change the trajectory: (new default,
old default, when). A run started under the old default resumes only with it set again; the refusal says
so."""

