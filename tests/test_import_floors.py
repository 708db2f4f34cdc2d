"""The house's storeys: no import cycle and no upward import in ``trace_train`` or ``trace_theory``.

Each package declares its storeys below, bottom first; :mod:`tests.import_floors` reads every import
statically (lazy ones included) and computes each module's floor from them. A new module must be placed
on a storey; an arrow from a storey to a higher one, or a cycle, fails with the offending import.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.import_floors import cycles, faults, floors, import_graph

ROOT = Path(__file__).resolve().parents[1]

TRAIN_STOREYS = (
    ("ground", ("trace_train", "trace_train.chat", "trace_train.child_python", "trace_train.config_loader", "trace_train.preflight",
                "trace_train.tools.*",
                "trace_train.verifiers.*", "trace_train.data.*")),
    ("environments and back ends", ("trace_train.envs.*", "trace_train.backends.*")),
    ("configs", ("trace_train.configs", "trace_train.tasks")),
    ("parts", ("trace_train.predictors.*", "trace_train.rollout.*", "trace_train.update.*", "trace_train.run.*",
               "trace_train.tiny")),
    ("commands", ("trace_train.train", "trace_train.evaluate")),
    ("integrations", ("trace_train.integrations", "trace_train.integrations.*")),
    ("benchmarks", ("trace_train.bench.*", "trace_train.gpu_check")),  # gpu_check: the GPU check at its old name
)

THEORY_STOREYS = (
    ("helpers", ("trace_theory._checks", "trace_theory._bracketing", "trace_theory._numerics",
                 "trace_theory._registry", "trace_theory._origin", "trace_theory._forest_links",
                 "trace_theory._roots_repair", "trace_theory._water_fill", "trace_theory._roots_closed_form")),
    ("values", ("trace_theory.contrast", "trace_theory.dynamic_sampling", "trace_theory._priced",
                "trace_theory._roots_table")),
    ("forest", ("trace_theory._forest_checks", "trace_theory.forest", "trace_theory._forest_builder",
                "trace_theory.targets", "trace_theory.metrics")),
    ("decisions", ("trace_theory.allocate", "trace_theory.policies", "trace_theory.advantages", "trace_theory.eager",
                   "trace_theory.benchmark")),
    ("expansion modes", ("trace_theory.expansion", "trace_theory.expansion.*")),
    ("driver", ("trace_theory.step", "trace_theory.pipelined", "trace_theory.selfcheck", "trace_theory")),
)

PACKAGES = {"trace_train": TRAIN_STOREYS, "trace_theory": THEORY_STOREYS}


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_cycle_and_no_upward_import(package):
    graph = import_graph(ROOT / package)
    assert faults(graph, PACKAGES[package]) == []
    assert set(floors(graph)) == set(graph)  # a floor for every module: the graph has no cycle


def test_the_configs_stand_below_every_part_they_configure():
    graph = import_graph(ROOT / "trace_train")
    floor = floors(graph)
    parts = [m for m in graph if m.startswith(("trace_train.rollout.", "trace_train.update.", "trace_train.predictors."))
             and "trace_train.configs" in _reach(graph, m)]
    assert parts and all(floor[m] > floor["trace_train.configs"] for m in parts)
    assert not {m for m in _reach(graph, "trace_train.configs")
                if m.startswith(("trace_train.rollout", "trace_train.update", "trace_train.predictors"))}


def _reach(graph, start):
    seen, todo = set(), [start]
    while todo:
        for d in graph[todo.pop()]:
            if d not in seen:
                seen.add(d)
                todo.append(d)
    return seen


# ---------------------------------------------------------------------------------------------------
# The checker fails on what it must catch
# ---------------------------------------------------------------------------------------------------


def test_a_synthetic_upward_import_and_cycle_are_caught():
    storeys = (("low", ("p.a", "p.b")), ("high", ("p.c",)))
    clean = {"p.a": set(), "p.b": {"p.a"}, "p.c": {"p.a", "p.b"}}
    assert faults(clean, storeys) == []
    assert floors(clean) == {"p.a": 0, "p.b": 1, "p.c": 2}
    upward = {**clean, "p.b": {"p.a", "p.c"}}
    assert "upward import: p.b (low) imports p.c (high)" in faults(upward, storeys)
    assert cycles(upward) == [["p.b", "p.c"]]
    assert "p.d is on no declared storey" in faults({**clean, "p.d": set()}, storeys)


def _copy(package: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__")))


def test_an_added_upward_import_in_trace_train_fails(tmp_path):
    copy = _copy("trace_train", tmp_path)
    configs = copy / "configs.py"
    configs.write_text(configs.read_text() + "\n\ndef _late():\n    from .rollout.engine import RolloutEngine\n")
    found = faults(import_graph(copy), TRAIN_STOREYS)
    assert "upward import: trace_train.configs (configs) imports trace_train.rollout.engine (parts)" in found
    assert any(line.startswith("import cycle:") for line in found)  # the engine reads its config


def test_an_added_upward_import_in_trace_theory_fails(tmp_path):
    copy = _copy("trace_theory", tmp_path)
    origin = copy / "_origin.py"
    origin.write_text(origin.read_text() + "\nfrom .benchmark import *  # noqa\n")
    found = faults(import_graph(copy), THEORY_STOREYS)
    assert found == ["upward import: trace_theory._origin (helpers) imports trace_theory.benchmark (decisions)"]


def test_type_checking_imports_and_package_arrows(tmp_path):
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .a import x\n")
    (pkg / "a.py").write_text("x = 1\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import y\n"
                              "from . import a\nfrom p import x\n")
    (pkg / "c.py").write_text("def f():\n    import p.b\n")
    assert import_graph(pkg) == {"p": {"p.a"}, "p.a": set(), "p.b": {"p.a", "p"}, "p.c": {"p.b"}}
