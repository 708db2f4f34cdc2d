"""``Origin``: how a forest node came to be, the one name every part of the forest imports."""

from __future__ import annotations

import enum

__all__ = ["Origin"]


class Origin(enum.IntEnum):
    """How a node came to be (stored as int8 in ``RolloutForest.origin``)."""

    ROOT = 0
    BARE = 1
    CONTINUATION = 2
