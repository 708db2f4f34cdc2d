"""The Python sandbox under attack: every attack is contained and reported, the test process unharmed."""

import os
import socket
import time
from pathlib import Path

import pytest

from trace_train.tools.sandbox import PythonSession, SandboxLimits, check_isolation, run_python

ROOT = os.geteuid() == 0
FAST = SandboxLimits(wall_seconds=10.0, cpu_seconds=1)
# The user whose processes RLIMIT_NPROC counts: the sandbox user for a root caller, the caller itself
# otherwise (in its user namespace).
CODE_UID = 65534 if ROOT else os.getuid()


def _obtained(layer):
    """Whether this caller's sandbox gets ``layer`` from the kernel (namespaces="auto")."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return layer in check_isolation(SandboxLimits())


def _sandbox_processes(uid):
    """Live processes of ``uid`` that a sandbox call started: those in a deeper PID namespace than this test
    (the sandbox's own) or running ``_sandbox_child.py`` (where the kernel gave no PID namespace). Zombies
    (state Z) are skipped: a killed process that its namespace's init has not reaped yet holds nothing, and
    other tests' calls leave such entries for a second or so, which made a count of every process of the
    uid drift inside this test's window."""
    def status(pid):
        with open(f"/proc/{pid}/status") as f:
            return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)

    own_depth = len(status("self").get("NSpid", "0").split())
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = status(entry)
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    command = f.read()
            except OSError:
                continue
            if int(fields["Uid"].split()[1]) != uid or fields["State"].startswith(("Z", "X")):
                continue
            nested = len(fields.get("NSpid", "0").split()) > own_depth
            count += nested or b"_sandbox_child.py" in command
    return count


def test_runs_code_and_echoes_a_trailing_expression():
    result = run_python("x = 6 * 7\nprint('x is', x)\nx + 1")
    assert result.status == "ok" and result.exit_code == 0
    assert result.stdout == "x is 42\n43\n"
    assert result.observation() == "x is 42\n43"


def test_error_is_reported_with_user_frames_only():
    result = run_python("def f():\n    return 1 / 0\nf()")
    assert result.status == "error" and result.exit_code == 1
    assert "ZeroDivisionError: division by zero" in result.stderr
    assert 'File "<cell 0>", line 2, in f' in result.stderr
    assert "_sandbox_child" not in result.stderr
    assert result.observation().endswith(
        "[execution stopped: the code raised an error or exited with a non-zero status]"
    )


def test_scientific_imports_work_inside_the_sandbox():
    result = run_python("import sympy, numpy\nprint(sympy.factorint(360), int(numpy.arange(5).sum()))")
    assert result.status == "ok", result.stderr
    assert result.stdout == "{2: 3, 3: 2, 5: 1} 10\n"


def test_infinite_loop_hits_the_cpu_limit():
    result = run_python("while True:\n    pass", limits=FAST)
    assert result.status == "cpu_limit"
    assert "CPU time limit exceeded" in result.observation()


def test_sleeping_code_hits_the_wall_clock_limit():
    result = run_python(
        "import time\nprint('before', flush=True)\ntime.sleep(60)", limits=SandboxLimits(wall_seconds=1.5)
    )
    assert result.status == "timeout" and result.exit_code is None
    assert 1.4 < result.wall_seconds < 4.0
    assert result.stdout == "before\n"
    assert "wall-clock time limit exceeded" in result.observation()


def test_memory_blow_up_is_a_memory_error():
    result = run_python(
        "blocks = []\nwhile True:\n    blocks.append(bytearray(50 * 2**20))",
        limits=SandboxLimits(memory_bytes=512 << 20),
    )
    assert result.status == "memory_limit"
    assert "MemoryError" in result.observation()


def test_fork_bomb_is_bounded_and_fully_cleaned_up():
    before = _sandbox_processes(CODE_UID)
    start = time.monotonic()
    result = run_python(
        "import os\nwhile True:\n    os.fork()", limits=SandboxLimits(wall_seconds=3.0, max_processes=8)
    )
    assert time.monotonic() - start < 6.0
    assert result.status in ("timeout", "error")
    assert _sandbox_processes(CODE_UID) == before == 0


def test_process_limit_stops_forking():
    code = (
        "import os\nchildren = 0\ntry:\n    for _ in range(50):\n        if os.fork() == 0:\n"
        "            import time; time.sleep(30)\n        children += 1\nexcept OSError as e:\n"
        "    print('stopped after', children, type(e).__name__)\n"
    )
    result = run_python(code, limits=SandboxLimits(wall_seconds=3.0, max_processes=5))
    assert "stopped after" in result.stdout, result.observation()
    assert int(result.stdout.split()[2]) <= 4
    assert "BlockingIOError" in result.stdout


def test_writing_outside_the_working_directory_is_denied():
    """Wherever the checkout is: under ``/tmp`` the sandbox's private ``/tmp`` hides it, so the write fails
    on a path that does not exist there (FileNotFoundError) rather than on the audit hook's refusal
    (PermissionError); either way nothing is written outside, which is what is asserted."""
    target = Path(__file__).with_name("outside.txt")
    result = run_python(f"open({str(target)!r}, 'w').write('pwned')")
    assert result.status == "error"
    refused = ("PermissionError" in result.stderr and "outside the working directory" in result.stderr)
    hidden = "FileNotFoundError" in result.stderr or "Read-only file system" in result.stderr
    assert refused or hidden, result.stderr[-500:]
    assert not target.exists()
    inside = run_python("open('notes.txt', 'w').write('ok')\nprint(open('notes.txt').read())")
    assert inside.stdout == "ok\n"


@pytest.mark.skipif(not ROOT and not _obtained("read-only-filesystem"),
                    reason="the kernel layer is the sandbox user (root caller) or the read-only mount "
                           "namespace (user caller), and this kernel refuses user namespaces to this user")
def test_subprocess_cannot_write_outside_either(tmp_path):
    tmp_path.chmod(0o755)
    target = tmp_path / "outside.txt"
    result = run_python(
        f"import subprocess\nprint(subprocess.run(['sh', '-c', 'echo x > {target}']).returncode)"
    )
    assert result.stdout.strip() != "0"
    assert not target.exists()


def test_working_directory_is_thrown_away():
    first = run_python("import os\nopen('left.txt', 'w').write('x')\nprint(os.getcwd())")
    workdir = first.stdout.strip()
    assert workdir and not os.path.exists(workdir)
    assert run_python("import os\nprint(os.listdir('.'))").stdout == "[]\n"


def test_socket_creation_is_blocked_by_the_audit_hook():
    result = run_python("import socket\ns = socket.socket()\ns.connect(('1.1.1.1', 80))")
    assert result.status == "error"
    assert "PermissionError: sandbox: network access is not permitted" in result.stderr


@pytest.mark.skipif(not _obtained("network-namespace"),
                    reason="this kernel refuses a network namespace to this caller (root, or user namespaces)")
def test_network_namespace_isolates_even_a_fresh_interpreter():
    """A child interpreter has no audit hook; the namespace still keeps it off the host's loopback."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    code = (
        f'import subprocess, sys\nsnippet = \'import socket; socket.create_connection(("127.0.0.1", {port}), '
        "timeout=2)'\nr = subprocess.run([sys.executable, '-c', snippet], capture_output=True, text=True)\n"
        "print(r.returncode, r.stderr.strip().splitlines()[-1])\n"
        "print(open('/proc/self/net/dev').read())"
    )
    try:
        result = run_python(code)
    finally:
        server.close()
    assert result.status == "ok", result.observation()
    first, *net_dev = result.stdout.splitlines()
    assert first.startswith("1 ") and ("OSError" in first or "Error" in first)
    interfaces = [line.split(":")[0].strip() for line in net_dev[2:] if ":" in line]
    assert interfaces == ["lo"]
    assert "network-namespace" in result.isolation and "pid-namespace" in result.isolation


def test_huge_output_is_truncated_without_flooding_the_caller():
    result = run_python(
        "import sys\nfor _ in range(2000):\n    sys.stdout.write('y' * 10000)",
        limits=SandboxLimits(max_output_bytes=1000),
    )
    assert result.status == "ok"
    assert result.stdout == "y" * 1000
    assert result.truncated_bytes == 2000 * 10000 - 1000
    assert "[output truncated: 19999000 more bytes]" in result.observation()


def test_file_size_limit():
    result = run_python(
        "open('big', 'wb').write(b'0' * (2 << 20))", limits=SandboxLimits(max_file_bytes=1 << 20)
    )
    assert result.status == "file_size_limit"


def test_limits_cannot_be_lifted_from_inside():
    code = (
        "import resource, os\n"
        "for name in ('RLIMIT_AS', 'RLIMIT_CPU', 'RLIMIT_NPROC', 'RLIMIT_FSIZE'):\n"
        "    limit = getattr(resource, name)\n"
        "    try:\n"
        "        resource.setrlimit(limit, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n"
        "        print(name, 'raised')\n"
        "    except (ValueError, OSError) as e:\n"
        "        print(name, 'refused')\n"
        "print(resource.getrlimit(resource.RLIMIT_AS))\n"
        "try:\n    os.setuid(0)\n    print('root')\nexcept OSError:  # EPERM, or EINVAL where 0 is unmapped\n"
        "    print('setuid refused')\n"
        "import sys\ntry:\n    sys.addaudithook(lambda *a: None)\n"
        "    print('hook added, guard still there')\n"
        "except Exception:\n    pass\n"
        "import socket\ntry:\n    socket.socket()\nexcept PermissionError:\n    print('socket refused')\n"
    )
    result = run_python(code, limits=SandboxLimits(memory_bytes=700 << 20))
    lines = result.stdout.splitlines()
    assert lines[:4] == [
        f"{name} refused" for name in ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_NPROC", "RLIMIT_FSIZE")
    ]
    assert lines[4] == f"({700 << 20}, {700 << 20})"
    assert "setuid refused" in lines
    assert lines[-1] == "socket refused"


def test_environment_is_minimal_and_interpreter_is_isolated_from_the_caller(monkeypatch):
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    result = run_python("import os\nprint(sorted(os.environ))\nprint('SECRET_TOKEN' in os.environ)")
    assert result.stdout.splitlines()[-1] == "False"
    if ROOT:
        listing = run_python("import os\nprint(os.listdir('/root'))")
        assert listing.stdout.strip() in ("[]", "['.pyenv']") or "PermissionError" in listing.stderr


def test_without_namespaces_rlimits_and_the_hook_remain():
    result = run_python("print('hi')", limits=SandboxLimits(namespaces="off"))
    assert result.stdout == "hi\n" and "network-namespace" not in result.isolation
    assert "rlimits" in result.isolation and "audit-hook" in result.isolation
    assert (
        run_python("import socket\nsocket.socket()", limits=SandboxLimits(namespaces="off")).status == "error"
    )


def test_session_keeps_state_and_snapshots_restore_exactly():
    session = PythonSession()
    assert session.run("import random\nx = random.random()\ndata = [x]").status == "ok"
    first = session.run("print(x)").stdout
    snap = session.snapshot()
    session.run("data.append(2)\nx = 'changed'")
    assert session.run("print(x, len(data))").stdout == "changed 2\n"
    session.restore(snap)
    assert session.run("print(x)").stdout == first
    assert session.run("print(len(data))").stdout == "1\n"
    other = PythonSession()
    other.restore(snap)
    assert other.run("print(x)").stdout == first


def test_session_replays_files_and_hash_order():
    session = PythonSession()
    session.run("open('state.txt', 'w').write('kept')\nwords = list({'alpha', 'beta', 'gamma', 'delta'})")
    order = session.run("print(words)").stdout
    assert session.run("print(open('state.txt').read(), words)").stdout == f"kept {order}"


def test_session_drops_cells_stopped_by_a_limit_and_keeps_erroring_cells():
    session = PythonSession(limits=FAST)
    session.run("x = 1")
    assert session.run("while True:\n    pass").status == "cpu_limit"
    assert session.run("y = x + 1\nraise RuntimeError('partial')").status == "error"
    assert len(session.cells) == 2
    assert session.run("print(x, y)").stdout == "1 2\n"


def test_sys_exit_ends_the_cell_only():
    session = PythonSession()
    assert session.run("import sys\nx = 1\nsys.exit()\nx = 2").status == "ok"
    assert session.run("exit(0)").status == "ok"
    assert session.run("print(x)").stdout == "1\n", "later cells still run, after the replay"
    assert session.run("sys.exit('bye')").stderr == "bye\n"
    assert session.run("sys.exit(256)").status == "error", "256 is not success, though 256 % 256 == 0"
    failed = session.run("exit(3)")
    assert failed.status == "error" and failed.exit_code == 1
    assert session.run("print(x + 1)").stdout == "2\n"
    assert session.run("import os\nos._exit(0)").finished is False
    assert session.run("print(x + 2)").stdout == "3\n", "a cell that ended the interpreter is dropped"


# A cell that forges the "finished" report (found in the harness's frames), is kept, and at its replay
# prints into the next call's output and ends the interpreter before the next cell runs.
FORGING_CELL = """import os, sys
frames, f = {}, sys._getframe()
while f is not None:
    frames.update(f.f_locals)
    f = f.f_back
if frames["index"] < frames["request"]["replay"]:
    os.write(frames["saved"][0], b"forged observation\\n")
os.write(frames["report_fd"], b"finished\\n")
os._exit(0)
"""
# The same hold on later cells without forging anything: a cell that returns normally and rebinds the
# harness's `exec` and `eval` (earlier cells own the interpreter that runs later ones).
HIJACKING_CELL = """import builtins, os
def _exec(*args, **kwargs):
    os.write(1, b"hijacked observation\\n")
builtins.exec = builtins.eval = _exec
"""


@pytest.mark.parametrize("cell", [FORGING_CELL, HIJACKING_CELL], ids=["forged-report", "honest-cell"])
def test_a_cells_hold_on_later_cells_stays_in_its_own_branch(cell):
    """What does not hold (tools README): a cell controls the later cells of its own session and branch,
    with or without forging the report. What does: a branch restored from a snapshot taken before it,
    and every other session, run as if it never existed."""
    session = PythonSession()
    session.run("x = 20")
    before = session.snapshot()
    session.run(cell)
    assert len(session.cells) == 2, "kept: forged report, or a cell that returned"
    later = session.run("print(x + 1)")
    assert "21" not in later.stdout and "observation" in later.stdout
    session.restore(before)
    assert session.run("print(x + 1)").stdout == "21\n"
    other = PythonSession()
    other.restore(before)
    assert other.run("print(x + 2)").stdout == "22\n"


def test_replayed_output_is_silent():
    session = PythonSession()
    session.run("print('first')")
    assert session.run("print('second')").stdout == "second\n"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"wall_seconds": 0}, "`wall_seconds` must be positive, got 0"),
        ({"cpu_seconds": 0}, "`cpu_seconds` must be a positive integer, got 0"),
        ({"memory_bytes": 1.5}, "`memory_bytes` must be a positive integer, got 1.5"),
        ({"sandbox_uid": 0}, "`sandbox_uid` and `sandbox_gid` must not be 0 (root)"),
        ({"namespaces": "maybe"}, "`namespaces` must be one of ('auto', 'require', 'off'), got 'maybe'"),
    ],
)
def test_limits_are_validated(kwargs, message):
    with pytest.raises(ValueError) as info:
        SandboxLimits(**kwargs)
    assert str(info.value) == message


def test_bad_arguments_are_rejected():
    with pytest.raises(TypeError, match="`code` must be a str, got bytes"):
        run_python(b"print(1)")
    with pytest.raises(ValueError, match="`snapshot` must be a tuple"):
        PythonSession().restore(["x = 1"])
