"""Every root allocator satisfies ``trace_theory.RootAllocator``: the step driver's local default and the
distributed trainer's global one take the same arguments, ``cost`` included (unequal root prices under
torchrun reach the global allocation)."""

from __future__ import annotations

import inspect
import subprocess
import sys

import numpy as np
import pytest

from trace_theory import RootAllocator, get_policy
from trace_theory.step import _allocate_roots_locally
from trace_train.run.distributed import DistInfo, GlobalRootAllocator

IMPLEMENTATIONS = {"local": _allocate_roots_locally, "global": GlobalRootAllocator(DistInfo())}


@pytest.mark.parametrize("name", sorted(IMPLEMENTATIONS))
def test_every_root_allocator_satisfies_the_protocol(name):
    impl = IMPLEMENTATIONS[name]
    assert isinstance(impl, RootAllocator)
    protocol = inspect.signature(RootAllocator.__call__)
    own = inspect.signature(impl)
    for p in list(protocol.parameters.values())[1:]:  # every argument the driver may pass is accepted by name
        assert p.name in own.parameters, f"{name} lacks `{p.name}`"
        assert own.parameters[p.name].kind == p.kind, f"{name}'s `{p.name}` is {own.parameters[p.name].kind}"
        assert (own.parameters[p.name].default is inspect.Parameter.empty) == (p.default is inspect.Parameter.empty)


def test_the_local_allocator_prices_roots_as_the_policy_does():
    policy, v, cost = get_policy("trace_tokens"), np.array([0.5, 0.3, 0.9, 0.6]), np.array([1.0, 2.0, 0.5, 1.5])
    m = _allocate_roots_locally(policy, v, 12, rng=np.random.default_rng(0), concentration=None, cost=cost)
    assert m.tolist() == policy.allocate_roots(v, 12, rng=np.random.default_rng(0), cost=cost).tolist()


GLOBAL_WITH_COST = """
import os, numpy as np, torch.distributed as dist
from trace_theory import get_policy
from trace_train.run.distributed import DistInfo, GlobalRootAllocator
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)
policy, v, cost = get_policy("trace_tokens"), np.array([0.5, 0.3, 0.9, 0.6]), np.array([1.0, 2.0, 0.5, 1.5])
m = GlobalRootAllocator(DistInfo(0, 1))(policy, v, 12, rng=np.random.default_rng(0), concentration=None, cost=cost)
print(m.tolist() == policy.allocate_roots(v, 12, rng=np.random.default_rng(0), cost=cost).tolist())
dist.destroy_process_group()
"""


def test_the_global_allocator_takes_the_roots_prices():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = subprocess.run([sys.executable, "-c", GLOBAL_WITH_COST.format(port=port)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "True"
