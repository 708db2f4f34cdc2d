"""Compute threads are set deliberately (``trace_train.run.threads``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from trace_train.run.threads import available_cpus, set_compute_threads


def _in_child(code: str, **env) -> str:
    unset = ("OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND")
    environment = {k: v for k, v in os.environ.items() if k not in unset}
    environment.update(env)
    return subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_threads_follow_the_setting_then_omp_num_threads_then_the_cpus_the_process_may_use():
    code = ("import torch, os; from trace_train.run.threads import set_compute_threads as s; n = s({}); "
            "print(n, torch.get_num_threads(), os.environ['VLLM_CPU_OMP_THREADS_BIND'])")
    cpus = available_cpus()
    assert _in_child(code.format(1)) == f"1 1 {cpus[0]}"
    assert _in_child(code.format(None), OMP_NUM_THREADS="1") == f"1 1 {cpus[0]}"
    n = len(cpus)
    assert _in_child(code.format(None)) == f"{n} {n} {','.join(map(str, cpus))}"


def test_a_bad_thread_count_is_refused():
    with pytest.raises(ValueError, match="`threads` must be a positive integer or None"):
        set_compute_threads(0)
