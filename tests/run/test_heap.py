"""The run's long-lived objects are kept out of full collections, and given back afterwards."""

import gc
import weakref

from trace_train.run.heap import startup_objects_frozen


class _Cycle:
    def __init__(self):
        self.me = self


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


def test_an_inner_block_leaves_the_outer_freeze_alone():
    with startup_objects_frozen():
        frozen = gc.get_freeze_count()
        with startup_objects_frozen():
            assert gc.get_freeze_count() == frozen
        assert gc.get_freeze_count() == frozen  # the inner block did not unfreeze
    assert gc.get_freeze_count() == 0
