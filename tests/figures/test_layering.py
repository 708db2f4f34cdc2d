"""Architecture as a test: figures read results folders and import neither the simulator nor the trainer."""

import ast
import subprocess
import sys
from pathlib import Path

import figures

FORBIDDEN = ("simulations", "trace_train")
PACKAGE = Path(figures.__file__).parent


def _imported_roots(path: Path) -> set[str]:
    """Top-level packages imported anywhere in a module, function bodies included."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_no_figures_module_imports_the_simulator_or_the_trainer():
    modules = sorted(PACKAGE.glob("*.py"))
    assert len(modules) > len(figures.FIGURES)
    offenders = {p.name: sorted(_imported_roots(p) & set(FORBIDDEN)) for p in modules}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_static_check_sees_an_import_inside_a_function(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from simulations.results import run_experiment\n")
    assert _imported_roots(module) & set(FORBIDDEN) == {"simulations"}


def test_rendering_every_figure_loads_neither_package():
    code = (
        "import sys, figures, figures.cli; "
        "[figures.figure_module(n) for n in figures.FIGURES]; "
        f"print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
