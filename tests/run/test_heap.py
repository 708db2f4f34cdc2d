"""The run's long-lived objects are kept out of full collections, and given back afterwards."""

import gc
import weakref

from trace_train.run.heap import startup_objects_frozen


import pytest


class _Cycle:
    def __init__(self):
        self.me = self


@pytest.fixture(autouse=True)
def nothing_frozen():
    """Each test starts with nothing frozen (an in-process vLLM engine of an earlier test freezes its own
    objects and keeps them so); what was frozen is frozen again afterwards."""
    frozen = gc.get_freeze_count()
    gc.unfreeze()
    yield
    if frozen:
        gc.freeze()


def test_objects_alive_at_the_start_are_frozen_for_the_block_and_collectable_after_it():
    gc.collect()
    assert gc.get_freeze_count() == 0
    held = _Cycle()
    gone = weakref.ref(held)
    with startup_objects_frozen():
        assert gc.get_freeze_count() > 0
        assert not any(o is held for o in gc.get_objects(generation=2))  # frozen: no collection walks it
        del held
        gc.collect()
        assert gone() is not None  # a frozen cycle is never collected
        young = _Cycle()
        young_ref = weakref.ref(young)
        del young
        gc.collect()
        assert young_ref() is None  # what the run creates is collected as usual
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert gone() is None  # unfrozen on leaving: a process that runs several jobs frees each one's cycles


def _still_frozen(frozen: int) -> bool:
    """The freeze holds: a frozen object freed meanwhile (its last reference dropped, say by a thread an
    earlier test left ending now) leaves the permanent generation, so the count may fall by a few, whereas
    an unfreeze empties it."""
    return 0 < gc.get_freeze_count() <= frozen and gc.get_freeze_count() > frozen // 2


def test_an_inner_block_leaves_the_outer_freeze_alone():
    with startup_objects_frozen():
        frozen = gc.get_freeze_count()
        with startup_objects_frozen():
            assert _still_frozen(frozen)
        assert _still_frozen(frozen)  # the inner block did not unfreeze
    assert gc.get_freeze_count() == 0


def test_a_freeze_made_before_the_block_is_kept_after_it():
    """vLLM freezes its own objects after its engine starts (in-process, inside a run's build): the block
    leaves that freeze as it found it."""
    gc.freeze()
    frozen = gc.get_freeze_count()
    with startup_objects_frozen():
        assert _still_frozen(frozen)
    assert _still_frozen(frozen)
