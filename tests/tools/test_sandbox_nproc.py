"""The sandbox's process limit counts the run's own processes only (issue 52, item 6): the machine's other
processes of the sandbox user (other jobs, concurrent sandbox calls) do not use it up."""

import os
import subprocess
import threading
import time

import pytest

from trace_train.tools.sandbox import SandboxLimits, run_python

FORKS = """
import os, time
time.sleep(6)  # meanwhile the caller starts 40 more processes as the sandbox user
children = 0
try:
    for _ in range(4):
        if os.fork() == 0:
            time.sleep(2)
            os._exit(0)
        children += 1
except OSError as error:
    print("refused", error)
print("forked", children)
"""


def _sandbox_user_pids(uid):
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status") as f:
                    if any(line.startswith("Uid:") and int(line.split()[1]) == uid for line in f):
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


@pytest.mark.skipif(os.geteuid() != 0, reason="a root caller runs the code as sandbox_uid (an ordinary user's "
                    "sandbox counts in its own user namespace already)")
def test_processes_the_sandbox_user_starts_elsewhere_after_the_limit_do_not_refuse_a_cells_fork():
    limits = SandboxLimits(namespaces="require", max_processes=5, wall_seconds=40)
    before = set(_sandbox_user_pids(limits.sandbox_uid))
    outcome = {}
    call = threading.Thread(target=lambda: outcome.update(result=run_python(FORKS, limits=limits)))
    call.start()
    deadline = time.monotonic() + 30
    while not set(_sandbox_user_pids(limits.sandbox_uid)) - before and time.monotonic() < deadline:
        time.sleep(0.05)  # the cell runs as the sandbox user: its limit is set
    others = [subprocess.Popen(["setpriv", f"--reuid={limits.sandbox_uid}", f"--regid={limits.sandbox_gid}",
                                "--clear-groups", "sleep", "30"]) for _ in range(40)]
    try:
        call.join(60)
    finally:
        for other in others:
            other.kill()
            other.wait()
    result = outcome["result"]
    assert result.status == "ok", result.stderr
    assert result.stdout.split() == ["forked", "4"], result.stdout
    assert "own-process-count" in result.isolation
