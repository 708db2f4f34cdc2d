"""A resumable sampler of candidate pools: the prompts each training step allocates rollouts over."""

from __future__ import annotations

import numpy as np

__all__ = ["PromptSampler"]


class PromptSampler:
    """Candidate pools drawn without replacement, epoch by epoch, in a seeded order; shardable by rank.

    The position (epoch, offset) is the whole state, so a resumed run draws exactly the pools an
    uninterrupted one would have drawn.
    """

    def __init__(self, rows: list, pool_size: int, *, seed: int, rank: int = 0, world_size: int = 1):
        if len(rows) < pool_size * world_size:
            raise ValueError(f"the training set has {len(rows)} rows; a step needs {pool_size * world_size} "
                             "(rollout.pool_size times the number of processes)")
        self.rows, self.pool_size, self.seed = rows, pool_size, seed
        self.rank, self.world_size = rank, world_size
        self.epoch, self.offset = 0, 0

    def _order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.rows))

    def next_pool(self) -> list:
        span = self.pool_size * self.world_size
        if self.offset + span > len(self.rows):
            self.epoch, self.offset = self.epoch + 1, 0
        idx = self._order(self.epoch)[self.offset:self.offset + span]
        self.offset += span
        mine = idx[self.rank * self.pool_size:(self.rank + 1) * self.pool_size]
        return [self.rows[i] for i in mine]

    def state(self) -> dict:
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state(self, state: dict) -> None:
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])
