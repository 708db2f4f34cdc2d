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
