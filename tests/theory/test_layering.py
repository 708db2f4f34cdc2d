"""Architecture as a test: the theory core imports NumPy and SciPy only."""

import subprocess
import sys

HEAVY = ["torch", "transformers", "vllm", "pandas", "matplotlib"]


def test_importing_trace_theory_pulls_in_no_heavy_dependency():
    code = (
        "import sys, trace_theory, trace_theory.advantages, trace_theory.metrics; "
        f"print(','.join(sorted(set({HEAVY!r}) & set(sys.modules))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"trace_theory imported {out.stdout.strip()}"


def test_the_probe_detects_a_heavy_import():
    """The check above can fail: importing pandas next to trace_theory is seen."""
    code = f"import sys, pandas, trace_theory; print(','.join(sorted(set({HEAVY!r}) & set(sys.modules))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "pandas"
