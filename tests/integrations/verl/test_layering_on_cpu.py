"""House rules of the plugin: verl is imported only inside ``trace_train/integrations/verl``, nothing else in
the project imports the plugin, and its plain-Python parts import no verl (they run in the main venv)."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]
PLUGIN = ROOT / "trace_train" / "integrations" / "verl"


def imported(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
        elif isinstance(node, ast.ImportFrom) and node.level and path.is_relative_to(PLUGIN):
            continue
    return names


def sources(*folders: str):
    for folder in folders:
        yield from (ROOT / folder).rglob("*.py")


def test_verl_and_the_plugin_stay_inside_the_plugin():
    offenders = []
    for path in sources("trace_theory", "trace_train", "simulations", "figures"):
        if path.is_relative_to(PLUGIN):
            continue
        for name in imported(path):
            if name == "verl" or name.startswith("verl.") or name.startswith("trace_train.integrations"):
                offenders.append(f"{path.relative_to(ROOT)}: {name}")
    assert offenders == []


def test_the_plain_python_parts_import_without_verl():
    code = ("import sys; sys.modules['verl'] = None; import trace_train.integrations.verl.coordinator, "
            "trace_train.integrations.verl.tree_growth, trace_train.integrations.verl.trees; "
            "print(sorted(m for m in sys.modules if m.startswith('verl')))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "['verl']"  # only the blocked placeholder: nothing of verl was imported
