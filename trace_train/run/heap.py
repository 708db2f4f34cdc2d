"""Python's garbage collector kept off the objects a run holds for its whole life.

A full (oldest-generation) collection walks every tracked object: after torch, transformers and a model are
loaded that is about 400,000 objects and 0.14 s on one CPU core, a pause that lands on whichever step happens
to cross the collector's threshold, more often on steps that keep more objects alive (an eager TRACE step's
trees). :func:`startup_objects_frozen` collects once and moves every object alive at that point into the
collector's permanent generation (``gc.freeze``, as vLLM does after its engine starts), so later collections walk
only what the run created since; on leaving, the objects go back to the collector (``gc.unfreeze``), so that a
process that runs several jobs (tests, benchmarks) frees each one's cycles afterwards.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator

__all__ = ["startup_objects_frozen"]


@contextlib.contextmanager
def startup_objects_frozen() -> Iterator[None]:
    """Freeze the objects alive now for the ``with`` block (a no-op where objects are frozen already: inside
    another such block, or after an in-process vLLM engine started, which freezes its own and keeps them so)."""
    if gc.get_freeze_count():  # whoever froze them keeps its freeze
        yield
        return
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
