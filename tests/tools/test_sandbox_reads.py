"""The sandboxed code cannot read the training set's answers (issue 52, item 2): it sees only what the
interpreter needs, for a root caller and for an ordinary user (uid 1000), and the tools still work."""

import os
import sys

import pytest

from tests.tools.test_sandbox_attacks import CALLERS, _run
import trace_train

PACKAGE_DIR = os.path.dirname(os.path.realpath(trace_train.__file__))

QUESTION = "What is 1234 * 4321? (issue-52 canary)"
ANSWER = "5332114"

# The caller writes its training set where users keep one (0600 in its home, as the uid 1000 run had;
# world-readable elsewhere, as the root run had): its home,
# a Hugging Face cache under the home, a data directory under /tmp and one beside the checkout; then a
# cell searches the whole disk for its own question, as the red team's did, and prints what it found.
SEARCH = f"""
import json, tempfile
QUESTION, ANSWER = {QUESTION!r}, {ANSWER!r}
row = json.dumps({{"question": QUESTION, "answer": ANSWER}}) + "\\n"
places = [HOME, HOME + "/.cache/huggingface/datasets/math", tempfile.mkdtemp(prefix="data-"), CHECKOUT_DATA]
for place in places:
    try:
        os.makedirs(place, exist_ok=True)
        path = os.path.join(place, "train.jsonl")
        with open(path, "w") as f:
            f.write(row)
        os.chmod(path, 0o600 if place == HOME else 0o644)  # the user's own private file; shared data
        result.setdefault("planted", []).append(path)
    except OSError:
        pass  # the checkout is not the user's to write
sandboxed('''
import os
found = []
for top, dirs, files in os.walk("/"):
    if top.startswith(("/proc", "/sys", "/usr")):
        dirs[:] = []
        continue
    for name in files:
        if name == "train.jsonl" and len(found) < 5:
            try:
                text = open(os.path.join(top, name), errors="replace").read()
            except OSError:
                continue
            if {QUESTION!r} in text:
                found.append((os.path.join(top, name), text[text.index('"answer"'):][:30]))
print("FOUND", found)
for path in {{paths!r}}:
    print(path, os.path.exists(path))
''', namespaces="require", wall_seconds=60, cpu_seconds=30)
"""


def _scenario(paths):
    checkout = os.path.dirname(PACKAGE_DIR)
    return (f"CHECKOUT_DATA = {os.path.join(checkout, 'tests', 'data', 'issue52-canary')!r}\n"
            + SEARCH.replace("{paths!r}", repr(paths)))


@pytest.mark.parametrize("caller", CALLERS)
def test_a_cell_cannot_find_its_own_answer_on_the_disk(caller):
    checkout = os.path.dirname(PACKAGE_DIR)
    hidden = [PACKAGE_DIR, os.path.join(checkout, "pyproject.toml"), os.path.join(checkout, "tests"),
              os.path.expanduser("~/.cache"), "/root/.cache"]
    try:
        result = _run(_scenario(hidden), caller)
    finally:
        canary = os.path.join(checkout, "tests", "data", "issue52-canary")
        if os.path.isdir(canary):
            for name in os.listdir(canary):
                os.remove(os.path.join(canary, name))
            os.rmdir(canary)
    assert result["status"] == "ok", result["stderr"]
    assert len(result["planted"]) >= 3, result
    lines = result["stdout"].splitlines()
    assert lines[0] == "FOUND []", f"the cell read its own answer: {lines[0]}"
    assert ANSWER not in result["stdout"]
    assert [line.rsplit(" ", 1)[1] for line in lines[1:]] == ["False"] * len(hidden), lines[1:]
    assert "private-root" in result["isolation"]


GUARDS = """
import time
sandboxed('''
import subprocess, sys, time
import numpy as np
print(int(np.arange(10).sum()))
print(subprocess.run(["sh", "-c", "echo from-a-shell"], capture_output=True, text=True).stdout.strip())
print(subprocess.run([sys.executable, "-c", "import numpy; print(numpy.ones(3).sum())"],
                     capture_output=True, text=True).stdout.strip())
time.sleep(1.5)
print("slept")
''', namespaces="require", wall_seconds=30)
"""


@pytest.mark.parametrize("caller", CALLERS)
def test_the_tools_still_work_in_the_private_root(caller):
    result = _run(GUARDS, caller)
    assert result["status"] == "ok", result["stderr"]
    assert result["stdout"].split() == ["45", "from-a-shell", "3.0", "slept"]
