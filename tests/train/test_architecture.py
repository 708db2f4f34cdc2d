"""Import boundaries: the engine, environments and chat formatting load without torch or vLLM."""

import subprocess
import sys


def test_engine_imports_without_torch_or_vllm():
    code = (
        "import sys, trace_train.rollout.engine, trace_train.envs, trace_train.backends; "
        "print(sorted(m for m in ('torch', 'vllm', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_scheduler_stands_without_the_engine():
    """The scheduler is handed a BatchBuilder and its settings; it neither imports nor reaches into the engine."""
    code = "import sys, trace_train.rollout.scheduler; print('trace_train.rollout.engine' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_configs_and_tasks_import_without_torch():
    """Every config class sits on the ground floor: reading or validating a config loads no model code."""
    code = (
        "import sys, trace_train.configs, trace_train.tasks, trace_train.config_loader; "
        "trace_train.configs.TrainConfig(); "
        "print(sorted(m for m in ('torch', 'vllm', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_loop_file_holds_the_loop():
    """``train.py`` stays a training script: under 600 lines, no knowledge of the predictor base's private
    state or of the forest's private index, no duck-typed capabilities (they are declared on the bases)."""
    import re
    from pathlib import Path

    package = Path(__file__).resolve().parents[2] / "trace_train"
    train = (package / "train.py").read_text()
    assert len(train.splitlines()) < 600
    assert "offset_keys" not in train and "_offsets" not in train
    for path in package.rglob("*.py"):
        text = path.read_text()
        assert not re.search(r"getattr\([^)]*needs_states", text), path
        assert "._child_index" not in text or path.name == "forest.py", path
