"""Attacks on the sandbox from the code it runs, for a root caller and for an ordinary user (uid 1000).

Each scenario runs in a separate caller process (``sandbox_caller.run_as_caller``) that owns files in its
home directory, listens on sockets and then checks what the sandboxed code managed to do. Scenarios
with ``deny_unshare`` run on a kernel that refuses namespaces (a seccomp filter in the caller makes
``unshare(2)`` fail), the degraded host that ``namespaces="auto"`` must report.
"""

import ctypes
import os
import struct
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile

import pytest

from tests.tools.sandbox_caller import run_as_caller

CALLERS = {"root": 0, "user": 1000}

PRELUDE = """
import os, socket, sys, warnings
from trace_train.tools.sandbox import (IsolationWarning, PythonSession, SandboxLimits,
                                       SandboxUnavailableError, run_python)
with open(HOME + "/victim.txt", "w") as f:
    f.write("mine")
with open(HOME + "/other.txt", "w") as f:
    f.write("mine too")

def sandboxed(code, **limits):
    r = run_python(code, limits=SandboxLimits(**limits))
    result.update(status=r.status, stdout=r.stdout, stderr=r.stderr, isolation=r.isolation,
                  missing=r.missing)
    return r

def reached(server):  # whether anything connected to the listening server (1 s timeout) during the call
    try:
        server.accept()
        return True
    except socket.timeout:
        return False

def caller_files():
    result["victim"] = open(HOME + "/victim.txt").read()
    result["other"] = os.path.exists(HOME + "/other.txt")
"""


def _run(scenario, caller, *, deny_unshare=False, python=sys.executable):
    result = run_as_caller(PRELUDE + scenario, uid=CALLERS[caller], deny_unshare=deny_unshare, python=python)
    if "skip" in result:
        pytest.skip(result["skip"])
    if not deny_unshare and result.get("missing"):
        pytest.skip(f"this kernel refuses part of the isolation: {result['missing']}")
    return result


def _landlock_abi():
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(ctypes.c_long(444), None, ctypes.c_size_t(0), ctypes.c_uint(1))  # ..._VERSION


def _needs_landlock():
    if _landlock_abi() < 6:
        pytest.skip("without namespaces only Landlock ABI >= 6 (Linux >= 6.12) keeps a user's files and "
                    "processes from code running as that user; this kernel lacks it")


NATIVE_WRITES = """
sandboxed(f'''
import os
print(os.system("echo pwned > {HOME}/victim.txt && rm -f {HOME}/other.txt"))
try:
    import ctypes
except ImportError:  # root without namespaces: nobody cannot read the standard library under /root
    print("-1 no ctypes")
    print("-1 no ctypes")
else:
    libc = ctypes.CDLL(None, use_errno=True)
    print(libc.open(b"{HOME}/victim.txt", os.O_WRONLY | os.O_TRUNC), ctypes.get_errno())
    print(libc.unlink(b"{HOME}/other.txt"), ctypes.get_errno())
print(os.path.exists("{HOME}/victim.txt"))
''', namespaces=MODE)
caller_files()
"""


@pytest.mark.parametrize("caller", CALLERS)
def test_subprocess_and_ctypes_cannot_touch_the_callers_files(caller):
    result = _run("MODE = 'require'" + NATIVE_WRITES, caller)
    assert result["victim"] == "mine" and result["other"], result
    assert result["status"] == "ok", result["stderr"]
    lines = result["stdout"].splitlines()
    assert lines[0] != "0" and lines[1].startswith("-1 ") and lines[2].startswith("-1 ")
    assert lines[3] == "False", "the caller's files are not even visible (the private root, issue 52)"
    assert "read-only-filesystem" in result["isolation"] and "private-root" in result["isolation"]


@pytest.mark.parametrize("caller", CALLERS)
def test_without_namespaces_native_code_cannot_touch_the_callers_files(caller):
    if caller == "user":
        _needs_landlock()
    result = _run("MODE = 'auto'" + NATIVE_WRITES, caller, deny_unshare=True)
    assert result["victim"] == "mine" and result["other"], result
    assert result["stdout"].splitlines()[0] != "0"


@pytest.mark.parametrize("caller", CALLERS)
def test_concurrent_calls_cannot_reach_each_others_working_directories(caller):
    scenario = """
import threading, time
first = threading.Thread(target=run_python, args=(
    "import os, time\\nopen('secret.txt', 'w').write('first')\\nos.makedirs('/tmp/first-was-here')\\n"
    "time.sleep(4)",), kwargs={"limits": SandboxLimits(namespaces="require", wall_seconds=20)})
first.start()
time.sleep(1.5)
sandboxed('''
import glob, os
found = [p for p in glob.glob("/tmp/*/*") + glob.glob("/tmp/*") if "first" in p or "secret" in p]
print(found, os.listdir("/tmp"))
''', namespaces="require")
first.join()
"""
    result = _run(scenario, caller)
    assert result["status"] == "ok", result["stderr"]
    found, listing = result["stdout"].split("] ")
    assert found == "[", f"the second call saw the first one's files: {found}]"
    assert listing.strip().count("trace-sandbox-") == 1, "only its own working directory is in /tmp"


@pytest.mark.parametrize("caller", CALLERS)
def test_temporary_directories_are_private_and_size_limited(caller):
    scenario = """
import uuid
name = "trace-leak-" + uuid.uuid4().hex
sandboxed(f'''
import subprocess
for d in ("/tmp", "/var/tmp", "/dev/shm"):
    print(subprocess.run(["sh", "-c", f"head -c 1000000 /dev/zero > {{d}}/{name}"]).returncode, end=" ")
print(subprocess.run(["sh", "-c", "head -c 8000000 /dev/zero > /dev/shm/big"]).returncode)
''', namespaces="require", scratch_bytes=4 << 20)
result["left"] = [d for d in ("/tmp", "/var/tmp", "/dev/shm") if os.path.exists(f"{d}/{name}")]
"""
    result = _run(scenario, caller)
    assert result["status"] == "ok", result["stderr"]
    assert result["stdout"].split()[:3] == ["0", "0", "0"], "its own /tmp, /var/tmp, /dev/shm are writable"
    assert result["stdout"].split()[3] != "0" and "No space left" in result["stderr"]
    assert result["left"] == [], "nothing is left in the host's temporary directories"


@pytest.fixture(params=[0o711, 0o700], ids=["traversable", "private"])
def venv_under_tmp(request):
    """A virtual environment in a fresh directory under ``/tmp`` (owned by uid 1000; mode 711, or 700,
    which only its owner and root may traverse) that sees this interpreter's packages through a ``.pth``
    file, with a canary module of its own and a host file beside it."""
    home = tempfile.mkdtemp(prefix="trace-venv-test-", dir="/tmp")
    try:
        venv = os.path.join(home, ".venv")
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
        python = os.path.join(venv, "bin", "python")
        packages = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                  check=True, capture_output=True, text=True).stdout.strip()
        ours = dict.fromkeys([sysconfig.get_path("purelib"), *site.getsitepackages()])
        with open(os.path.join(packages, "host_packages.pth"), "w") as f:
            f.write("import site; " + "; ".join(f"site.addsitedir({p!r})" for p in ours) + "\n")
        with open(os.path.join(packages, "trace_canary.py"), "w") as f:
            f.write("ALIVE = 'canary alive'\n")
        with open(os.path.join(home, "secret.txt"), "w") as f:
            f.write("host secret")
        for root, _, files in os.walk(home):
            for name in [root, *(os.path.join(root, n) for n in files)]:
                if os.geteuid() == 0:  # otherwise run_as_caller skips: switching callers needs root
                    os.lchown(name, CALLERS["user"], CALLERS["user"])
        os.chmod(home, request.param)
        yield home, python, packages
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.mark.parametrize("caller", CALLERS)
def test_an_interpreter_under_tmp_stays_usable_read_only_and_alone(caller, venv_under_tmp):
    # The sandbox covers /tmp with a private tmpfs; a .venv (or checkout) there is bound back read-only.
    home, python, packages = venv_under_tmp
    scenario = """
sandboxed('''
import os, subprocess, sys
import trace_canary
print(trace_canary.ALIVE)
print(subprocess.run([sys.executable, "-c", "import trace_canary; print(trace_canary.ALIVE)"],
                     capture_output=True, text=True).stdout.strip())
print(bool(os.statvfs(sys.prefix).f_flag & os.ST_RDONLY))
print(os.path.exists("HOME_DIR/secret.txt"))
try:
    open("PACKAGES/planted.py", "w").write("pwned")
    print("planted")
except OSError as error:
    print("refused by the hook" if str(error).startswith("sandbox:") else f"refused: {error}")
shell = subprocess.run(["sh", "-c", "echo pwned > PACKAGES/planted.py"], capture_output=True, text=True)
print("written" if shell.returncode == 0 else "read-only" if "Read-only file system" in shell.stderr
      else shell.stderr.strip())
'''.replace("HOME_DIR", VENV_HOME).replace("PACKAGES", PACKAGES), namespaces="require")
result["planted"] = os.path.exists(PACKAGES + "/planted.py")
"""
    scenario = f"VENV_HOME, PACKAGES = {home!r}, {packages!r}\n" + scenario
    result = _run(scenario, caller, python=python)
    assert result["status"] == "ok", result["stderr"]
    alive, started, read_only, secret, planted, shell = result["stdout"].splitlines()
    assert alive == started == "canary alive", "the venv's packages and interpreter work in the sandbox"
    assert read_only == "True", "the interpreter's directories are mounted read-only"
    assert secret == "False", "nothing else of the host's /tmp is visible"
    assert planted == "refused by the hook", "the audit hook refuses a Python-level write there"
    assert shell == "read-only" and not result["planted"], "the mount refuses a native write"
    with open(os.path.join(home, "secret.txt")) as f:
        assert f.read() == "host secret"


@pytest.mark.parametrize("caller", CALLERS)
def test_an_interpreter_reached_through_a_symlink_under_tmp_keeps_its_packages(caller, venv_under_tmp):
    # The venv lives under /var/lib (outside every private temporary directory); the caller starts
    # it as /tmp/<link>/.venv/bin/python, so sys.prefix and sys.path name the link.
    home, _, _ = venv_under_tmp
    outside = [d for d in ("/var/lib", os.path.expanduser("~")) if os.access(d, os.W_OK | os.X_OK)]
    if not outside:
        pytest.skip("needs a writable directory outside /tmp (/var/lib or $HOME) to hold the venv")
    real = tempfile.mkdtemp(prefix="trace-venv-real-", dir=outside[0])
    link = tempfile.mktemp(prefix="trace-venv-link-", dir="/tmp")
    try:
        os.chmod(real, 0o755)
        shutil.move(os.path.join(home, ".venv"), os.path.join(real, ".venv"))
        os.symlink(real, link)
        scenario = """
sandboxed('''
import sys, subprocess
import trace_canary
print(trace_canary.ALIVE, sys.prefix.startswith("/tmp/"))
print(subprocess.run([sys.executable, "-c", "import trace_canary; print(trace_canary.ALIVE)"],
                     capture_output=True, text=True).stdout.strip())
''', namespaces="require")
"""
        result = _run(scenario, caller, python=os.path.join(link, ".venv", "bin", "python"))
        assert result["status"] == "ok", result["stderr"]
        assert result["stdout"].splitlines() == ["canary alive True", "canary alive"]
    finally:
        shutil.rmtree(real, ignore_errors=True)
        if os.path.islink(link):
            os.unlink(link)


@pytest.mark.parametrize("caller", CALLERS)
def test_host_processes_are_invisible_in_proc(caller):
    scenario = """
sandboxed('''
import os
lines = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        lines.append(open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\\\\0", b" ").decode())
    except OSError:
        pass
print(len(lines), any("sandbox_caller" in line for line in lines))
''', namespaces="require")
"""
    result = _run(scenario, caller)
    assert result["status"] == "ok", result["stderr"]
    count, caller_seen = result["stdout"].split()
    assert caller_seen == "False" and int(count) <= 3  # the reaper, the worker and at most one more


UNIX_SOCKET = """
server = socket.socket(socket.AF_UNIX)
server.bind(HOME + "/agent.sock")
os.chmod(HOME + "/agent.sock", 0o777)
server.listen(1)
server.settimeout(1.0)
snippet = (f"import socket; s = socket.socket(socket.AF_UNIX); s.connect({HOME + '/agent.sock'!r}); "
           "print('connected')")
sandboxed(f'''
import subprocess, sys
r = subprocess.run([sys.executable, "-c", {snippet!r}], capture_output=True, text=True)
print(r.stdout.strip() or r.stderr.strip().splitlines()[-1])
''', namespaces=MODE)
result["reached"] = reached(server)
"""


@pytest.mark.parametrize("caller", CALLERS)
def test_host_unix_sockets_are_unreachable(caller):
    result = _run("MODE = 'require'" + UNIX_SOCKET, caller)
    assert result["reached"] is False, result["stdout"]
    assert "connected" not in result["stdout"] and "Operation not permitted" in result["stdout"]


def test_host_unix_sockets_are_unreachable_without_namespaces():
    result = _run("MODE = 'auto'" + UNIX_SOCKET, "user", deny_unshare=True)
    assert result["reached"] is False and "connected" not in result["stdout"], result["stdout"]


LOOPBACK = """
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(1)
server.settimeout(1.0)
port = server.getsockname()[1]
sandboxed(f"import os\\nos.system(\\"bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected'\\")",
          namespaces=MODE)
result["reached"] = reached(server)
"""


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize("deny_unshare", [False, True], ids=["namespaces", "no-namespaces"])
def test_host_loopback_is_unreachable(caller, deny_unshare):
    mode = "auto" if deny_unshare else "require"
    result = _run(f"MODE = {mode!r}" + LOOPBACK, caller, deny_unshare=deny_unshare)
    assert result["reached"] is False and "connected" not in result["stdout"], result


KILL_CALLER = """
sandboxed(f"import os\\nos.system('kill -9 {CALLER_PID}')\\nprint('sent')", namespaces=MODE)
result["survived"] = True
"""


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize("deny_unshare", [False, True], ids=["namespaces", "no-namespaces"])
def test_code_cannot_kill_its_caller(caller, deny_unshare):
    mode = "auto" if deny_unshare else "require"
    if deny_unshare and caller == "user":
        _needs_landlock()
    result = _run(f"MODE = {mode!r}" + KILL_CALLER, caller, deny_unshare=deny_unshare)  # raises if killed
    assert result["survived"] and result["stdout"] == "sent\n"


DAEMON = """
import time
marker = f"{1000 + time.time() % 1000:.6f}"  # a unique sleep that outlasts the wall clock
sandboxed(f'''
import os
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/bin/sleep", ["sleep", "{marker}"])
    os._exit(0)
os.wait()
print("daemon started", flush=True)
if {TIME_OUT}:
    import time
    time.sleep(60)
''', namespaces=MODE, wall_seconds=4 if TIME_OUT else 10, max_processes=1024)
# max_processes: without a user namespace the limit counts every process of the caller's uid, and this test
# is about daemons outliving the call, not that count (test_sandbox_nproc.py): the user's other jobs must
# not make its fork fail
time.sleep(0.3)
left = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        if marker.encode() in open(f"/proc/{pid}/cmdline", "rb").read():
            left.append(pid)
    except OSError:
        pass
result["left"] = left
"""


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize("deny_unshare", [False, True], ids=["namespaces", "no-namespaces"])
@pytest.mark.parametrize("time_out", [False, True], ids=["returns", "times-out"])
def test_no_process_outlives_the_call(caller, deny_unshare, time_out):
    mode = "auto" if deny_unshare else "require"
    result = _run(f"MODE = {mode!r}\nTIME_OUT = {time_out}" + DAEMON, caller, deny_unshare=deny_unshare)
    assert result["stdout"] == "daemon started\n", result["stderr"]
    assert result["left"] == [], "a daemonised process survived the call"


def test_a_users_capabilities_are_dropped_and_its_process_count_limited():
    scenario = """
sandboxed('''
import ctypes, os
print([line.split()[1] for line in open("/proc/self/status") if line.startswith("CapEff")][0])
libc = ctypes.CDLL(None, use_errno=True)
print(libc.mount(b"none", b"/tmp", b"tmpfs", 0, None), ctypes.get_errno())
children = 0
try:
    for _ in range(50):
        if os.fork() == 0:
            import time; time.sleep(30)
        children += 1
except OSError as e:
    print("stopped after", children, type(e).__name__)
''', namespaces="require", max_processes=5, wall_seconds=10)
"""
    result = _run(scenario, "user")
    lines = result["stdout"].splitlines()
    assert lines[0] == "0000000000000000", result["stderr"]
    assert lines[1] == "-1 1", "mount(2) fails with EPERM"
    assert lines[2].startswith("stopped after") and int(lines[2].split()[2]) <= 4


PYTHON_WRITE_PATHS = {
    "sqlite3": "import sqlite3\nc = sqlite3.connect('{HOME}/db')\nc.execute('create table t(x)')\nc.commit()",
    "sqlite3-attach": "import sqlite3\nsqlite3.connect(':memory:').execute(\"attach '{HOME}/db' as d\")",
    "os.open-dir_fd": "import os\nfd = os.open('/usr', os.O_RDONLY)\n"  # the caller's home is not even shown
                      "os.write(os.open('victim.txt', os.O_WRONLY | os.O_TRUNC, dir_fd=fd), b'pwned')",
    "os.rename-dst_dir_fd": "import ctypes, os\nfd = ctypes.CDLL(None).open(b'{HOME}', os.O_RDONLY)\n"
                            "os.rename('victim.txt', 'db', src_dir_fd=fd, dst_dir_fd=fd)",
}


@pytest.mark.parametrize("attack", PYTHON_WRITE_PATHS)
def test_the_audit_hook_sees_python_write_paths(attack):
    """The hook itself refuses these (before the kernel layers would): its message is in the error."""
    code = PYTHON_WRITE_PATHS[attack]
    result = _run(f"sandboxed({code!r}.format(HOME=HOME), namespaces='require')\ncaller_files()\n"
                  "result['db'] = os.path.exists(HOME + '/db')", "user")
    assert result["status"] == "error"
    assert "PermissionError: sandbox: " in result["stderr"], result["stderr"]
    assert result["victim"] == "mine" and not result["db"]


DEGRADED = """
from trace_train.envs.registry import make_env_factory
import yaml
from trace_train.config_loader import PRESET_DIR
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    first = sandboxed("print(1 + 1)", namespaces="auto")
    sandboxed("print(2 + 2)", namespaces="auto")
result["warnings"] = [str(w.message) for w in caught if issubclass(w.category, IsolationWarning)]
result["first"] = first.stdout
try:
    PythonSession(limits=SandboxLimits(namespaces="require"))
except SandboxUnavailableError as error:
    result["require"] = str(error)
preset = yaml.safe_load(open(PRESET_DIR / "math_qwen3_8b.yaml"))
try:
    make_env_factory("math_python", preset["task"]["env"])
except SandboxUnavailableError as error:
    result["preset"] = str(error)
"""


@pytest.mark.parametrize("caller", CALLERS)
def test_degraded_isolation_is_reported_once_and_require_fails_at_start_up(caller):
    result = _run(DEGRADED, caller, deny_unshare=True)
    assert result["first"] == "2\n" or caller == "root"
    assert len(result["warnings"]) == 1, result["warnings"]
    warning = result["warnings"][0]
    assert "network-namespace" in warning and "mount-namespace" in warning
    assert "Operation not permitted" in warning
    assert ("user-namespace" in warning) == (caller == "user")
    assert "namespaces='require'" in result["require"] and "Operation not permitted" in result["require"]
    assert "namespaces='require'" in result["preset"]


def test_resource_limits_hold_for_a_user_caller():
    scenario = """
statuses = [
    run_python("while True:\\n    pass", limits=SandboxLimits(cpu_seconds=1, wall_seconds=30)).status,
    run_python("b = []\\nwhile True:\\n    b.append(bytearray(50 << 20))",
               limits=SandboxLimits(memory_bytes=512 << 20)).status,
    run_python("open('big', 'wb').write(b'0' * (2 << 20))",
               limits=SandboxLimits(max_file_bytes=1 << 20)).status,
    run_python("import time\\ntime.sleep(60)", limits=SandboxLimits(wall_seconds=1.5)).status,
]
sandboxed('''
import resource
try:
    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    print("raised")
except (ValueError, OSError):
    print("refused")
''', namespaces="require")
result["statuses"] = statuses
"""
    result = _run(scenario, "user")
    assert result["statuses"] == ["cpu_limit", "memory_limit", "file_size_limit", "timeout"]
    assert result["stdout"] == "refused\n"


SHARED_KERNEL_STATE = """
sandboxed('''
import ctypes, errno, fcntl, os, termios
libc = ctypes.CDLL(None, use_errno=True)
NR = {"x86_64": dict(shmget=29, msgget=68, semget=64, mq_open=240, add_key=248, keyctl=250, memfd_create=319),
      "aarch64": dict(shmget=194, msgget=186, semget=190, mq_open=180, add_key=217, keyctl=219,
                      memfd_create=279)}[os.uname().machine]
calls = dict(shmget=(0, 1 << 20, 0o1600), msgget=(0, 0o1600), semget=(0, 1, 0o1600),
             mq_open=(b"q", os.O_CREAT | os.O_RDWR, 0o600, None),
             add_key=(b"user", b"k", b"v", 1, -3),  # into the session keyring
             keyctl=(0, -3, 0),  # KEYCTL_GET_KEYRING_ID of the session keyring
             memfd_create=(b"m", 0))
for name, args in calls.items():
    print(name, libc.syscall(NR[name], *args), errno.errorcode.get(ctypes.get_errno()))
try:
    fcntl.ioctl(0, termios.TIOCSTI, b"x")
    print("TIOCSTI allowed")
except OSError as error:
    print("TIOCSTI", errno.errorcode[error.errno])
''', namespaces=MODE)
"""


@pytest.mark.parametrize("caller", CALLERS)
def test_ipc_keyrings_memfd_and_terminal_injection_are_refused(caller):
    result = _run("MODE = 'require'" + SHARED_KERNEL_STATE, caller)
    assert result["status"] == "ok", result["stderr"]
    lines = result["stdout"].splitlines()
    assert lines[:-1] == [f"{name} -1 EPERM" for name in
                          ("shmget", "msgget", "semget", "mq_open", "add_key", "keyctl", "memfd_create")]
    assert lines[-1] == "TIOCSTI EPERM"
    assert "ipc-namespace" in result["isolation"]


# Every call that makes a socket, or memory that neither RLIMIT_AS nor the size-capped tmpfs bounds (name:
# x86_64 number, aarch64 number). A call a later kernel adds is numbered above the filter's ceiling and
# gets ENOSYS; raising the ceiling means reviewing the calls below it and adding such calls here.
MEMORY_AND_SOCKET_CALLS = {
    "socket": (41, 198), "socketpair": (53, 199), "accept": (43, 202), "accept4": (288, 242),
    "memfd_create": (319, 279), "memfd_secret": (447, 447), "userfaultfd": (323, 282), "bpf": (321, 280),
    "perf_event_open": (298, 241), "pidfd_getfd": (438, 438), "io_uring_setup": (425, 425),
    "shmget": (29, 194), "msgget": (68, 186), "semget": (64, 190), "mq_open": (240, 180),
    "add_key": (248, 217), "open_tree": (428, 428), "fsopen": (430, 430), "fsmount": (432, 432),
    "open_tree_attr": (467, 467),
}
REVIEWED_UP_TO = 469  # Linux 6.18's last call (file_setattr)


def test_the_filter_refuses_every_memory_or_socket_creating_call_and_every_unreviewed_one():
    """A static check of the tables (fails when a listed call leaves the deny list, or when the ceiling is
    raised past the calls reviewed here) and of the program (the ceiling is in it)."""
    from trace_train.tools import _sandbox_child as child

    for m, machine in enumerate(("x86_64", "aarch64")):
        denied = set(child.SECCOMP_DENIED[machine])
        missing = {name for name, numbers in MEMORY_AND_SOCKET_CALLS.items() if numbers[m] not in denied}
        assert not missing, f"{machine}: the seccomp filter lets {sorted(missing)} through"
        program = child.seccomp_filter(child.SECCOMP_DENIED[machine], machine)
        assert struct.pack("HBBI", 0x25, 0, 1, REVIEWED_UP_TO) in program, \
            "calls past the reviewed ceiling must return ENOSYS"
    assert child.SECCOMP_REVIEWED_UP_TO == REVIEWED_UP_TO, (
        "the ceiling moved: review the new calls, add the memory- or socket-creating ones to "
        "SECCOMP_DENIED and MEMORY_AND_SOCKET_CALLS, then REVIEWED_UP_TO here")


MEMORY_AND_SOCKETS = """
NR = """ + repr(MEMORY_AND_SOCKET_CALLS) + """
sandboxed('''
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
m = 0 if os.uname().machine == "x86_64" else 1
NR = ''' + repr(NR) + '''
pair = (ctypes.c_int * 2)()
def show(name, value):
    print(name, value, errno.errorcode.get(ctypes.get_errno()))
show("socketpair", libc.socketpair(1, 1, 0, pair))  # AF_UNIX, SOCK_STREAM
show("socketpair-raw", libc.syscall(NR["socketpair"][m], 1, 1, 0, pair))
show("memfd_secret", libc.syscall(NR["memfd_secret"][m], 0))
show("accept4", libc.syscall(NR["accept4"][m], 0, None, None, 0))
show("userfaultfd", libc.syscall(NR["userfaultfd"][m], 0))
show("bpf", libc.syscall(NR["bpf"][m], 0, None, 0))
show("perf_event_open", libc.syscall(NR["perf_event_open"][m], None, 0, -1, -1, 0))
show("pidfd_getfd", libc.syscall(NR["pidfd_getfd"][m], 0, 0, 0))
show("fsopen", libc.syscall(NR["fsopen"][m], b"tmpfs", 0))
show("unreviewed-470", libc.syscall(470, 0, 0, 0))
show("unreviewed-1000", libc.syscall(1000, 0, 0, 0))
''', namespaces=MODE)
"""


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize("mode", ["require", "off"])
def test_memory_and_socket_creating_calls_are_refused(caller, mode):
    """memfd_secret and socketpair (the red team's 300-400 MiB per process past the memory bound) and the
    rest of their kind are EPERM, with or without namespaces; a call of a later kernel is ENOSYS."""
    result = _run(f"MODE = {mode!r}" + MEMORY_AND_SOCKETS, caller)
    assert result["status"] == "ok", result["stderr"]
    assert "seccomp" in result["isolation"]
    names = ["socketpair", "socketpair-raw", "memfd_secret", "accept4", "userfaultfd", "bpf", "perf_event_open",
             "pidfd_getfd", "fsopen"]
    assert result["stdout"].splitlines() == [f"{name} -1 EPERM" for name in names] + \
        ["unreviewed-470 -1 ENOSYS", "unreviewed-1000 -1 ENOSYS"]


LEAVES_ITS_GROUP = """
import time
marker = f"{1000 + time.time() % 1000:.6f}"  # a unique sleep that outlasts the wall clock
sandboxed(f'''
import os
os.setsid()  # the worker itself leaves the process group that the caller kills at the deadline
print("left", flush=True)
os.execv("/bin/sleep", ["sleep", "{marker}"])
''', namespaces=MODE, wall_seconds=3)
time.sleep(1.5)
left = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        if marker.encode() in open(f"/proc/{pid}/cmdline", "rb").read():
            left.append(pid)
    except OSError:
        pass
result["left"] = left
"""


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize("deny_unshare", [False, True], ids=["namespaces", "no-namespaces"])
def test_code_that_leaves_the_callers_process_group_dies_at_the_wall_clock(caller, deny_unshare):
    mode = "auto" if deny_unshare else "require"
    result = _run(f"MODE = {mode!r}" + LEAVES_ITS_GROUP, caller, deny_unshare=deny_unshare)
    assert result["status"] == "timeout" and result["stdout"] == "left\n", result
    assert result["left"] == [], "the code outlived its call"


@pytest.mark.parametrize("caller", CALLERS)
def test_private_temporary_directories_bound_their_inodes(caller):
    scenario = """
sandboxed('''
import errno, os
made = 0
try:
    for made in range(100000):
        open(f"/tmp/f{made}", "w").close()
except OSError as error:
    print(made, errno.errorcode[error.errno])
''', namespaces="require", scratch_bytes=1 << 20, wall_seconds=30)
"""
    result = _run(scenario, caller)
    assert result["status"] == "ok", result["stderr"]
    made, code = result["stdout"].split()
    assert code == "ENOSPC" and int(made) <= 64, "1 MiB of scratch allows 64 inodes"


@pytest.mark.parametrize("caller", CALLERS)
def test_the_callers_terminals_are_unreachable(caller):
    scenario = """
master, slave = os.openpty()  # a terminal of the caller's, as a login on another pty would be
sandboxed(f'''
import os
tty = {os.ttyname(slave)!r}
print(os.path.exists(tty), os.path.exists("/dev/tty"), os.path.exists("/dev/ptmx"), os.path.isdir("/dev/pts"))
for path in (tty, "/dev/tty", "/dev/ptmx"):
    try:
        os.close(os.open(path, os.O_RDWR | os.O_NOCTTY))
        print("opened", path)
    except OSError as error:
        print("refused", error.errno)
print(os.isatty(0), os.isatty(1), os.isatty(2))
''', namespaces="require")
"""
    result = _run(scenario, caller)
    assert result["status"] == "ok", result["stderr"]
    lines = result["stdout"].splitlines()
    assert lines[0] == "False False False False", "no terminal device is visible"
    assert all(line.startswith("refused") for line in lines[1:4]), lines
    assert lines[4] == "False False False"
