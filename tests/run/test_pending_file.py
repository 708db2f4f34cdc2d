"""Pipelined expansion's ``pending.pkl``: plain data round-trips, anything else is refused unrun."""

from __future__ import annotations

import json
import os
import pickle
from dataclasses import dataclass

import numpy as np
import pytest

from trace_theory import RolloutForest
from trace_theory.pipelined import Pending
from trace_theory.step import Starts, StepRecord
from trace_train.envs.base import EndReason
from trace_train.envs.guess_number import GuessState
from trace_train.rollout.batch import NodePayload
from trace_train.rollout.pipeline import Carried
from trace_train.run.checkpoint import CheckpointError, load_checkpoint, save_checkpoint


def _pending() -> Pending:
    forest = RolloutForest.from_parents(np.array([-1, 0, 1]), np.array([np.nan, np.nan, 1.0]), prompt=np.array([3]))
    nodes = tuple(NodePayload((1, 2), (-0.5, -0.1), "4", (5,), "higher", ({"role": "user", "content": "x"},),
                              snapshot, "stop", end) for snapshot, end in
                  [(None, None), (GuessState(4, 8, 1, 4, ()), None), (GuessState(4, 8, 2, 4, (4,)), EndReason.DONE)])
    record = StepRecord(forest, np.array([0, 0, 0, 1]), node_ids=np.array([1]), node_v=np.array([0.4]),
                        expansion="pipelined")
    starts = Starts(np.array([1]), np.array([2], dtype=np.int8), np.array([2]))
    return Pending(record, starts, Carried(forest, nodes, {3: {"target": 4}}))


def test_the_pending_step_round_trips_through_a_checkpoint(tmp_path):
    pending = _pending()
    ckpt = save_checkpoint(tmp_path, 1, policy={}, pending=[pending, None])
    back = load_checkpoint(ckpt, restore_random_state=False).pending
    assert back[1] is None and back[0].carried.nodes == pending.carried.nodes
    np.testing.assert_array_equal(back[0].starts.count, [2])
    np.testing.assert_array_equal(back[0].record.forest.parent, pending.record.forest.parent)
    assert back[0].record.expansion == "pipelined" and back[0].carried.nodes[2].end_reason is EndReason.DONE
    assert load_checkpoint(save_checkpoint(tmp_path, 2, policy={}), restore_random_state=False).pending is None


@dataclass
class Opaque:
    handle: object


def test_a_planted_pending_file_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"

    class Planted:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    ckpt = save_checkpoint(tmp_path, 1, policy={}, pending=[None])
    (ckpt / "pending.pkl").write_bytes(pickle.dumps([Planted()]))
    meta = json.loads((ckpt / "trainer_state.json").read_text())
    meta["file_bytes"]["pending.pkl"] = (ckpt / "pending.pkl").stat().st_size
    (ckpt / "trainer_state.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=r"pending\.pkl: refused: it asks for \S*system.*could run code"):
        load_checkpoint(ckpt)
    assert not marker.exists()


def test_a_snapshot_that_cannot_be_pickled_fails_the_write_in_one_line(tmp_path):
    pending = _pending()
    nodes = pending.carried.nodes[:2] + (NodePayload((), (), "", (), "", (), Opaque(lambda: 0)),)
    bad = Pending(pending.record, pending.starts, Carried(pending.record.forest, nodes, {}))
    with pytest.raises(ValueError, match=r"^the pending step of rollout.expansion=pipelined cannot be saved: .*"
                                         r"environment snapshots must be picklable"):
        save_checkpoint(tmp_path, 1, policy={}, pending=[bad])
    assert not list((tmp_path / "checkpoints").glob("step_*"))


def test_an_enum_pickled_by_getattr_loads_and_no_other_getattr_does(tmp_path):
    """Python 3.11.2 (Debian 12's) pickles an enum member as ``getattr(cls, name)``: that form loads as the
    member; ``getattr`` on anything but an enum's member name is refused unrun."""
    from trace_train.run.plain_pickle import PickleRefused, load

    class ByName:
        def __init__(self, target, name):
            self.target, self.name = target, name

        def __reduce__(self):
            return (getattr, (self.target, self.name))

    (tmp_path / "enum.pkl").write_bytes(pickle.dumps([ByName(EndReason, "DONE")], protocol=4))
    assert load(tmp_path / "enum.pkl") == [EndReason.DONE]
    for target, name in ((EndReason, "__class__"), (EndReason, "_missing_"), (Starts, "of")):
        (tmp_path / "bad.pkl").write_bytes(pickle.dumps([ByName(target, name)], protocol=4))
        with pytest.raises(PickleRefused):
            load(tmp_path / "bad.pkl")
