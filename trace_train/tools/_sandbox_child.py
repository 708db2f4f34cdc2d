"""Child side of the Python sandbox: run as a script by ``sandbox.py``, never imported.

The parent (``sandbox.py``) starts this script (with ``-s -P`` and a minimal environment) in a new
session and writes one JSON object to its stdin:
``{"cells": [str, ...], "replay": int, "workdir": str, "limits": {...}, "drop_to": [uid, gid] | null,
"namespaces": "auto" | "require" | "off", "seed": int, "report_fd": int}``.

Process tree (everything below runs before any model-written code):

- B, this script: reads the request, then (unless namespaces are off) calls ``unshare(2)`` for new
  network, PID and mount namespaces (plus a user namespace when not root). When it will drop root
  privileges it also makes the interpreter reachable for the sandbox user in its private mount
  namespace: each directory on the way to ``sys.path`` that others cannot traverse (``/root`` when
  Python was installed there) is covered with an empty tmpfs into which only the interpreter's own
  directories are bind-mounted back, which also hides everything else in it. Then B forks C and exits
  with C's code.
- C: PID 1 of the new PID namespace. Asks for SIGKILL when B dies, forks G, reaps every orphan until G
  exits, then exits with G's exit code (128 + signal number when G died from a signal). When C exits the
  kernel kills every process left in the namespace, so nothing the code started outlives the run.
- G: sets the resource limits (soft = hard, so they cannot be raised again), drops root privileges to
  the sandbox user when started as root, changes into the working directory, installs the audit-hook
  guard (no sockets, no writes outside the working directory), writes the isolation report to
  ``report_fd`` and only then runs the cells. Cells before index ``replay`` are replayed with stdout and
  stderr sent to /dev/null; the last cells run with output on the real pipes.
"""

import ast
import builtins
import ctypes
import json
import linecache
import os
import random
import resource
import signal
import sys
import tempfile
import traceback

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
MS_NOSUID, MS_NODEV, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 2, 4, 4096, 8192, 16384, 1 << 18
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
# Audit events whose first (and for rename/link also second) argument is a path that gets modified.
PATH_EVENTS = {
    "os.remove",
    "os.rmdir",
    "os.mkdir",
    "os.chmod",
    "os.chown",
    "os.truncate",
    "os.utime",
    "os.chflags",
    "os.lchflags",
    "os.mkfifo",
    "os.mknod",
}
TWO_PATH_EVENTS = {"os.rename", "os.link"}


def _exit_code(status):
    """Exit code of a waited-for child: its own code, or 128 + signal number when a signal killed it."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _libc_call(name, *args):
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        raise OSError(ctypes.get_errno(), f"{name}: {os.strerror(ctypes.get_errno())}")


def _encode(value):
    return None if value is None else os.fsencode(value)


def _mount(source, target, fstype, flags, data=None):
    encoded = [_encode(value) for value in (source, target, fstype)]
    _libc_call("mount", *encoded, ctypes.c_ulong(flags), _encode(data))


def _blocking_ancestor(path):
    """The top-most ancestor directory of ``path`` that others may not traverse, or None."""
    parts = os.path.realpath(path).split(os.sep)[1:-1]
    for depth in range(len(parts)):
        ancestor = os.sep + os.path.join(*parts[: depth + 1])
        if not os.stat(ancestor).st_mode & 0o001:
            return ancestor
    return None


def _expose_interpreter():
    """Make ``sys.path`` reachable for an unprivileged user, in this process's own mount namespace."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    needed = {os.path.realpath(p) for p in sys.path + [sys.prefix, sys.base_prefix] if os.path.isdir(p)}
    needed.add(os.path.dirname(os.path.realpath(sys.executable)))
    covered = {}
    for path in sorted(needed):
        ancestor = _blocking_ancestor(path)
        if ancestor is not None:
            covered.setdefault(ancestor, []).append(path)
    for ancestor, paths in covered.items():
        staged = []
        for path in paths:
            stage = tempfile.mkdtemp(prefix="trace-sandbox-stage-")
            _mount(path, stage, None, MS_BIND | MS_REC)
            staged.append((path, stage))
        _mount("tmpfs", ancestor, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=1m")
        for path, stage in staged:
            os.makedirs(path, exist_ok=True)
            _mount(stage, path, None, MS_MOVE)
            os.rmdir(stage)


def _enter_namespaces(mode, expose):
    """Enter new network, PID and mount namespaces; return the isolation features obtained."""
    if mode == "off":
        return []
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWNS
    if uid != 0:
        flags |= CLONE_NEWUSER
    try:
        _libc_call("unshare", flags)
        if expose:
            _expose_interpreter()
        if uid != 0:
            # Map our own ids so that files created in the working directory keep their owner.
            with open("/proc/self/setgroups", "w") as f:
                f.write("deny")
            with open("/proc/self/uid_map", "w") as f:
                f.write(f"{uid} {uid} 1")
            with open("/proc/self/gid_map", "w") as f:
                f.write(f"{gid} {gid} 1")
    except OSError as error:
        if mode == "require":
            sys.stderr.write(f"sandbox: cannot create namespaces ({error}) and namespaces='require'\n")
            sys.exit(125)
        return []
    return ["network-namespace", "pid-namespace", "mount-namespace"] + (
        ["user-namespace"] if uid != 0 else []
    )


def _processes_of(uid):
    """Number of live processes whose real uid is ``uid`` (RLIMIT_NPROC counts them all)."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        count += int(line.split()[1]) == uid
                        break
        except OSError:
            continue
    return count


def _set_limits(limits, uid):
    cpu = limits["cpu_seconds"]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    for name, value in (
        ("RLIMIT_AS", limits["memory_bytes"]),
        ("RLIMIT_FSIZE", limits["max_file_bytes"]),
        ("RLIMIT_NOFILE", limits["max_open_files"]),
        ("RLIMIT_CORE", 0),
    ):
        resource.setrlimit(getattr(resource, name), (value, value))
    nproc = _processes_of(uid) + limits["max_processes"]
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


def _drop_privileges(uid, gid):
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if os.getuid() == 0 or os.geteuid() == 0:
        raise RuntimeError("sandbox: failed to drop root privileges")


def _install_guard(workdir):
    """Audit hook: no socket of any kind, no file modification outside ``workdir``.

    Audit hooks cannot be removed once added. They see every socket and file operation made through
    Python's own APIs; native code (ctypes, C extensions, subprocesses) is not seen, which is why the
    kernel-level layers (namespaces, rlimits, unprivileged user) exist.
    """
    root = os.path.realpath(workdir)

    def inside(path):
        if isinstance(path, int):
            return True
        resolved = os.path.realpath(os.fsdecode(path))
        return resolved == root or resolved.startswith(root + os.sep) or resolved == os.devnull

    def deny(what):
        raise PermissionError(f"sandbox: {what} is not permitted")

    def hook(event, args):
        if event.startswith("socket."):
            deny("network access")
        if event == "open":
            path, mode, flags = args
            writing = (mode is not None and any(c in mode for c in "wax+")) or bool(flags & WRITE_FLAGS)
            if path is not None and writing and not inside(path):
                deny(f"writing {path!r} outside the working directory")
        elif event in PATH_EVENTS and not inside(args[0]):
            deny(f"{event} on {args[0]!r} outside the working directory")
        elif event in TWO_PATH_EVENTS and not (inside(args[0]) and inside(args[1])):
            deny(f"{event} outside the working directory")
        elif event == "os.symlink" and not inside(args[1]):
            deny(f"creating a link at {args[1]!r} outside the working directory")

    sys.addaudithook(hook)


def _run_cell(source, index, namespace):
    """Run one cell like a notebook: print the repr of a trailing expression. Return False on error."""
    filename = f"<cell {index}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    try:
        tree = ast.parse(source, filename, "exec")
        tail = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            tail = ast.Expression(tree.body.pop().value)
        exec(compile(tree, filename, "exec"), namespace)
        if tail is not None:
            value = eval(compile(tail, filename, "eval"), namespace)
            if value is not None:
                print(repr(value))
        return True
    except SystemExit:
        raise
    except BaseException as error:  # the model's code may raise anything; report it like Python would
        report = traceback.TracebackException.from_exception(error)
        report.stack = traceback.StackSummary.from_list(
            [frame for frame in report.stack if frame.filename != __file__]
        )
        sys.stderr.write("".join(report.format()))
        return False
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def _run_cells(request):
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    random.seed(request["seed"])
    devnull = os.open(os.devnull, os.O_WRONLY)
    saved = os.dup(1), os.dup(2)
    ok = True
    for index, cell in enumerate(request["cells"]):
        quiet = index < request["replay"]
        os.dup2(devnull if quiet else saved[0], 1)
        os.dup2(devnull if quiet else saved[1], 2)
        ok = _run_cell(cell, index, namespace)
    return 0 if ok else 1


def _grandchild(request, report_fd, isolation):
    limits = request["limits"]
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    drop = request["drop_to"]
    _set_limits(limits, drop[0] if drop else os.getuid())
    if drop:
        _drop_privileges(*drop)
        isolation.append("unprivileged-user")
    os.chdir(request["workdir"])
    sys.dont_write_bytecode = True
    _install_guard(request["workdir"])
    isolation += ["rlimits", "audit-hook"]
    os.write(report_fd, json.dumps({"isolation": isolation}).encode())
    os.close(report_fd)
    return _run_cells(request)


def main():
    request = json.loads(sys.stdin.buffer.read())
    report_fd = request["report_fd"]
    isolation = _enter_namespaces(request["namespaces"], expose=request["drop_to"] is not None)
    child = os.fork()
    if child:  # B: wait for C
        os.close(report_fd)
        return _exit_code(os.waitpid(child, 0)[1])
    # C: reaper, PID 1 of the new namespace when namespaces are on
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    worker = os.fork()
    if worker == 0:  # G
        try:
            code = _grandchild(request, report_fd, isolation)
        except SystemExit as stop:
            if isinstance(stop.code, str):
                sys.stderr.write(stop.code + "\n")
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    os.close(report_fd)
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == worker:
            return _exit_code(status)


if __name__ == "__main__":
    sys.exit(main())
