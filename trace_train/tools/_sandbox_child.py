"""Child side of the Python sandbox: run as a script by ``sandbox.py`` (its helpers are importable).

The parent (``sandbox.py``) starts this script (with ``-s -P`` and a minimal environment) in a new
session and writes one JSON object to its stdin:
``{"cells": [str, ...], "replay": int, "workdir": str, "limits": {...}, "drop_to": [uid, gid] | null,
"namespaces": "auto" | "require" | "off", "seed": int, "report_fd": int}``.

Process tree (everything below runs before any model-written code):

- B, this script: reads the request, then (unless namespaces are off) calls ``unshare(2)`` for new
  network, PID, IPC and mount namespaces, plus a user namespace that maps the caller's own uid and gid when
  the caller is not root. In the private mount namespace it builds a new root (``_private_root``: a
  read-only tmpfs holding the system directories and the interpreter's own, bound read-only, a minimal
  read-only ``/dev`` (``DEVICES``, no terminal), fresh size-limited tmpfs file systems on ``/tmp``,
  ``/var/tmp``, ``/dev/shm`` and the working directory: the only writable places, private to this run)
  and pivots into it, keeping the host's root at ``OLD_ROOT`` for C. Nothing else of the host is
  reachable: not ``/home``, ``/root`` (but for a pyenv Python, bound alone under traversable parents),
  data directories or the checkout. Then B forks C and exits with C's code.
- C: PID 1 of the new PID namespace (and a child subreaper, for when there is none). Mounts a ``/proc``
  of the new PID namespace, detaches the host's root (``OLD_ROOT``), forks G, moves itself out of the process group that the
  caller kills at the wall-clock limit, reaps every orphan until G exits, then kills whatever is left
  (orphaned descendants become its children) and exits with G's exit code (128 + signal number when G
  died from a signal). At the wall-clock deadline (an interval timer) it kills every descendant and
  exits, so code that left the caller's process group or session dies too. With a PID namespace the
  kernel also kills every process left in it when C exits.
- G: sets the resource limits (soft = hard), becomes the sandbox user when started as root, drops every
  capability (the user namespace gave B all of them inside it), sets ``no_new_privs``, applies a
  Landlock domain (writes only under the working directory and the private temporary directories, no
  signals or ptrace to processes outside the run, no TCP) where the kernel has Landlock, and a seccomp
  filter (no ``socket(2)``, ``socketpair(2)``, ``ptrace(2)``, ``process_vm_*``, io_uring, nor any other
  call that makes a socket or unbounded memory; ENOSYS past the reviewed ceiling), changes into the working
  directory, installs the audit-hook guard, writes the isolation report to ``report_fd`` and only then
  runs the cells. Cells before index ``replay`` are replayed with stdout and stderr sent to /dev/null;
  the last cell runs with output on the real pipes. ``sys.exit`` ends the cell that called it only.
  After the last cell returns, ``finished`` is written to ``report_fd`` (absent when the code ended the
  interpreter itself, e.g. with ``os._exit``).
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
import struct
import sys
import tempfile
import time
import traceback

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP = 36, 38, 22
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 4096, 8192, 16384, 1 << 18
AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY = -100, 0x8000, 1
SYS_MOUNT_SETATTR, SYS_LANDLOCK_CREATE, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT = 442, 444, 445, 446
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}.get(os.uname().machine, -1)
MNT_DETACH = 2
PRIVATE_TMP = ("/tmp", "/var/tmp", "/dev/shm")
DEVICES = ("null", "zero", "full", "random", "urandom")  # all of /dev the code sees (with namespaces)
# System calls refused with EPERM by the seccomp filter, per machine: socket (every family, which also
# keeps the host's pathname Unix sockets out of reach), ptrace, process_vm_readv/writev, io_uring;
# SysV IPC (shm*, sem*, msg*) and POSIX message queues (mq_*), so no segment or queue is shared with
# another call or the caller's processes even without an IPC namespace; the kernel keyrings (add_key,
# request_key, keyctl: the caller's session keyring holds Kerberos/AFS tokens); every call that makes
# memory outside RLIMIT_AS and the size-capped tmpfs or a socket: memfd_create, memfd_secret,
# socketpair (its buffers were 300-400 MiB of kernel memory per process), accept/accept4 (sockets
# from an inherited listener), userfaultfd, bpf (maps), perf_event_open (ring buffers), pidfd_getfd
# (another process's descriptors), and the new mount API (open_tree, move_mount, fsopen, fsconfig,
# fsmount, fspick, open_tree_attr: a tmpfs of one's own). Every call numbered above
# SECCOMP_REVIEWED_UP_TO, the last number whose call was reviewed (Linux 6.18), returns ENOSYS, as on
# an older kernel (the C library then falls back on an older call): a call a later kernel adds is
# unreachable until it is reviewed and the ceiling raised.
SECCOMP_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
SECCOMP_REVIEWED_UP_TO = 469
_NEWER_CALLS = (438, 447, 428, 429, 430, 431, 432, 433, 467)  # the same number on both machines
SECCOMP_DENIED = {"x86_64": (41, 101, 310, 311, 425, 426, 427,
                             29, 30, 31, 67, 64, 65, 66, 220, 68, 69, 70, 71,
                             240, 241, 242, 243, 244, 245, 248, 249, 250, 319,
                             53, 43, 288, 323, 321, 298, *_NEWER_CALLS),
                  "aarch64": (198, 117, 270, 271, 425, 426, 427,
                              194, 195, 196, 197, 190, 191, 192, 193, 186, 187, 188, 189,
                              180, 181, 182, 183, 184, 185, 217, 218, 219, 279,
                              199, 202, 242, 282, 280, 241, *_NEWER_CALLS)}
# ioctl(2) requests refused on any descriptor: TIOCSTI (push input into a terminal) and TIOCLINUX.
SECCOMP_IOCTL = {"x86_64": 16, "aarch64": 29}
DENIED_IOCTLS = (0x5412, 0x541C)
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
# Audit events that modify the path in their first argument; the last argument is the dir_fd, if any.
PATH_EVENTS = {
    "os.remove": 1, "os.rmdir": 1, "os.mkdir": 2, "os.chmod": 2, "os.chown": 3, "os.truncate": None,
    "os.utime": 3, "os.chflags": None, "os.lchflags": None, "os.mkfifo": 2, "os.mknod": 3,
}
TWO_PATH_EVENTS = {"os.rename", "os.link"}  # (src, dst, src_dir_fd, dst_dir_fd)


def _exit_code(status):
    """Exit code of a waited-for child: its own code, or 128 + signal number when a signal killed it."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


_LIBC = ctypes.CDLL(None, use_errno=True)


def _libc_call(name, *args):
    result = getattr(_LIBC, name)(*args)
    if result < 0 or (result != 0 and name != "syscall"):
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))
    return result


def _encode(value):
    return None if value is None else os.fsencode(value)


def _mount(source, target, fstype, flags, data=None):
    encoded = [_encode(value) for value in (source, target, fstype)]
    _libc_call("mount", *encoded, ctypes.c_ulong(flags), _encode(data))


# --------------------------------------------------------------------------------------------------
# B: namespaces and the private mount tree


def _blocking_ancestor(path):
    """The top-most ancestor directory of ``path`` that others may not traverse, or None."""
    parts = os.path.realpath(path).split(os.sep)[1:-1]
    for depth in range(len(parts)):
        ancestor = os.sep + os.path.join(*parts[: depth + 1])
        if not os.stat(ancestor).st_mode & 0o001:
            return ancestor
    return None


def _interpreter_dirs():
    """Real paths of the directories the interpreter needs: ``sys.path``, its prefixes, its executable's."""
    needed = {os.path.realpath(p) for p in sys.path + [sys.prefix, sys.base_prefix] if os.path.isdir(p)}
    needed.add(os.path.dirname(os.path.realpath(sys.executable)))
    return needed


def _expose_interpreter():
    """Make ``sys.path`` reachable for an unprivileged user, in this process's own mount namespace."""
    needed = _interpreter_dirs()
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


def _read_only(path="/"):
    """Make every mount at and below ``path`` read-only: ``mount_setattr(AT_RECURSIVE, RDONLY)``."""
    attr = struct.pack("QQQQ", MOUNT_ATTR_RDONLY, 0, 0, 0)  # struct mount_attr, MOUNT_ATTR_SIZE_VER0
    _libc_call("syscall", ctypes.c_long(SYS_MOUNT_SETATTR), ctypes.c_int(AT_FDCWD), os.fsencode(path),
               ctypes.c_uint(AT_RECURSIVE), attr, ctypes.c_size_t(len(attr)))


def _interpreter_under_private_tmp():
    """The outermost interpreter directories (``sys.path``, prefixes, the executable's directory) that
    lie strictly below one of ``PRIVATE_TMP``: a ``.venv`` or checkout under ``/tmp``, which the private
    tmpfs would otherwise hide. A temporary directory itself is never listed (that would expose it)."""
    needed = _interpreter_dirs()
    tmp = [os.path.realpath(p) for p in PRIVATE_TMP if os.path.isdir(p) and not os.path.islink(p)]
    below = sorted(p for p in needed if any(p.startswith(t + os.sep) for t in tmp))
    outermost = []
    for path in below:
        if not outermost or not path.startswith(outermost[-1] + os.sep):
            outermost.append(path)
    return outermost


def _make_traversable_dirs(path):
    """``mkdir -p path`` with every created directory mode 755, whatever the umask."""
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        _make_traversable_dirs(parent)
    if not os.path.isdir(path):
        os.mkdir(path)
        os.chmod(path, 0o755)


def _tmpfs_bounds(size):
    """tmpfs options bounding bytes (``size``) and inodes (one per 16 KiB of ``size``, at least 64)."""
    return f"size={size},nr_inodes={max(64, size // 16384)}"


SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
"""What the new root shows of the host besides the interpreter: programs, libraries and configuration."""
OLD_ROOT = "/.oldroot"
"""Where the host's root stays, in the new root, until C has mounted its ``/proc``; then it is detached."""
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
"""This ``trace_train`` package (it ships data files): never shown, even inside a shown site-packages."""


def _is_beneath(path, tops):
    return any(path == top or path.startswith(top.rstrip(os.sep) + os.sep) for top in tops)


def _checkout_root():
    """The source checkout this package was imported from (holds ``pyproject.toml`` or ``.git``), or None."""
    root = os.path.dirname(PACKAGE_DIR)
    return root if any(os.path.exists(os.path.join(root, name)) for name in ("pyproject.toml", ".git")) else None


def _shown_interpreter_dirs():
    """The outermost interpreter directories to bind into the new root: ``_interpreter_dirs`` less those
    below a system directory (bound already) and less any that would show the checkout whole."""
    checkout = _checkout_root()
    system = [os.path.realpath(path) for path in SYSTEM_DIRS if os.path.isdir(path)]
    needed = sorted(path for path in _interpreter_dirs()
                    if not _is_beneath(path, system) and not (checkout and _is_beneath(checkout, [path])))
    outermost = []
    for path in needed:
        if not outermost or not _is_beneath(path, [outermost[-1]]):
            outermost.append(path)
    return outermost


def _bind_read_only(source, target):
    _mount(source, target, None, MS_BIND | MS_REC)
    _read_only(target)


def _recreate_links(root, shown):
    """Symbolic links on the way to an interpreter directory as the interpreter names it (``sys.path``,
    prefixes, executable, unresolved), made again in the new root where they lie outside what is bound:
    ``/tmp/env -> /opt/env`` makes ``sys.prefix`` ``/tmp/env``."""
    named = [os.path.abspath(p) for p in sys.path + [sys.prefix, sys.base_prefix, sys.executable] if p]
    for path in named:
        parts = path.split(os.sep)[1:]
        for depth in range(1, len(parts) + 1):
            prefix = os.sep + os.path.join(*parts[:depth])
            if _is_beneath(prefix, shown) or not os.path.lexists(prefix):
                break
            if os.path.islink(prefix):
                if not os.path.lexists(root + prefix):
                    _make_traversable_dirs(os.path.dirname(root + prefix))
                    os.symlink(os.readlink(prefix), root + prefix)
                break  # what lies beyond is reached through the link


def _private_root(workdir, owner, size):
    """Build a new root file system holding only what the interpreter needs, and pivot into it.

    A read-only tmpfs holds: the system directories (``SYSTEM_DIRS``, bound read-only, or the same
    symbolic links), the interpreter's own directories (``sys.path``, prefixes, executable: bound
    read-only at their real paths, parents made traversable, so a ``/root/.pyenv`` Python serves the
    unprivileged sandbox user), a minimal ``/dev``, an empty ``/proc`` (C mounts its own), fresh
    size-limited tmpfs file systems on ``PRIVATE_TMP`` and the working directory. Nothing else: no
    ``/home``, ``/root``, data directories, Hugging Face cache or checkout; this package's own directory
    (it ships data files) is covered by an empty tmpfs where a bound site-packages would show it. The
    host's root stays at ``OLD_ROOT`` until C detaches it.
    """
    root = workdir  # any directory serves as the mount point of the new root; the host's stays empty
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=1m,nr_inodes=4096")
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            os.symlink(os.readlink(path), root + path)
        elif os.path.isdir(path):
            os.mkdir(root + path, 0o755)
            _bind_read_only(path, root + path)
    _private_dev_at(root)
    for path in ("/proc", OLD_ROOT):
        os.mkdir(root + path, 0o755)
    for path in PRIVATE_TMP:
        if os.path.isdir(path) and not os.path.islink(path):
            _make_traversable_dirs(root + path)
            _mount("tmpfs", root + path, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,{_tmpfs_bounds(size)}")
    shown = _shown_interpreter_dirs()
    _recreate_links(root, shown)
    for path in shown:
        _make_traversable_dirs(root + path)
        _bind_read_only(path, root + path)
    if os.path.isdir(root + PACKAGE_DIR):
        _mount("tmpfs", root + PACKAGE_DIR, "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY, "mode=755,size=4k,nr_inodes=4")
    _make_traversable_dirs(root + workdir)
    _mount("tmpfs", root + workdir, "tmpfs", MS_NOSUID | MS_NODEV,
           f"mode=700,{_tmpfs_bounds(size)},uid={owner[0]},gid={owner[1]}")
    attr = struct.pack("QQQQ", MOUNT_ATTR_RDONLY, 0, 0, 0)
    _libc_call("syscall", ctypes.c_long(SYS_MOUNT_SETATTR), ctypes.c_int(AT_FDCWD), os.fsencode(root),
               ctypes.c_uint(0), attr, ctypes.c_size_t(len(attr)))
    _libc_call("syscall", ctypes.c_long(SYS_PIVOT_ROOT), os.fsencode(root), os.fsencode(root + OLD_ROOT))
    os.chdir("/")


def _private_dev_at(root):
    """A minimal read-only ``/dev`` at ``root + "/dev"``: the ``DEVICES`` bound from the host's,
    ``fd``/``stdin``/``stdout``/``stderr`` links and an empty ``shm`` (a private tmpfs is mounted there
    next). No terminal (``/dev/tty``, ``/dev/pts``, ``/dev/ptmx``) and no other device of the host."""
    _make_traversable_dirs(root + "/dev")
    _mount("tmpfs", root + "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=64k,nr_inodes=64")
    for name in DEVICES:
        with open(f"{root}/dev/{name}", "x"):
            pass
        _mount(f"/dev/{name}", f"{root}/dev/{name}", None, MS_BIND)
    for index, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{index}", f"{root}/dev/{name}")
    os.symlink("/proc/self/fd", f"{root}/dev/fd")
    os.mkdir(f"{root}/dev/shm")
    _read_only(root + "/dev")


def _leave_old_root(isolation):
    """C, after mounting its ``/proc``: detach the host's root (kept until then because the kernel lets a
    user namespace mount a ``/proc`` only while a full one is visible). Without a private ``/proc`` the
    host's is bound instead (its processes then show, as the missing layer already says)."""
    if "private-root" not in isolation:
        return
    if "private-proc" not in isolation:
        _mount(OLD_ROOT + "/proc", "/proc", None, MS_BIND | MS_REC)
    _libc_call("umount2", os.fsencode(OLD_ROOT), ctypes.c_int(MNT_DETACH))


def _enter_namespaces(request):
    """Enter new user (non-root), network, PID and mount namespaces; return the layers obtained."""
    if request["namespaces"] == "off":
        return []
    uid, gid = os.getuid(), os.getgid()
    owner = request["drop_to"] or (uid, gid)
    flags = CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWNS | (CLONE_NEWUSER if uid != 0 else 0)
    try:
        _libc_call("unshare", flags)
    except OSError as error:
        return _degraded(request, f"unshare: {error.strerror}", [])
    layers = ["user-namespace"] if uid != 0 else []
    layers += ["network-namespace", "pid-namespace", "ipc-namespace", "mount-namespace"]
    try:
        if uid != 0:  # map our own ids, so that files keep their owner and nothing else is mapped
            maps = (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1"))
            for name, text in maps:
                with open(f"/proc/self/{name}", "w") as f:
                    f.write(text)
        _mount(None, "/", None, MS_REC | MS_PRIVATE)
        _private_root(request["workdir"], owner, request["limits"]["scratch_bytes"])
    except OSError as error:
        return _degraded(request, f"private mounts: {error.strerror}", layers)
    return layers + ["read-only-filesystem", "private-tmp", "private-root"]


def _degraded(request, reason, layers):
    if request["namespaces"] == "require":
        sys.stderr.write(f"sandbox: cannot isolate the code ({reason}) and namespaces='require'\n")
        sys.exit(125)
    return layers + [f"missing: {reason}"]


# --------------------------------------------------------------------------------------------------
# C: the reaper


def _children_of(pid):
    """Pids whose parent is ``pid`` (from /proc)."""
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    if int(f.read().rsplit(b")", 1)[1].split()[1]) == pid:
                        children.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return children


def _kill_descendants():
    """SIGKILL every child until none is left (as subreaper, orphaned descendants become children)."""
    while True:
        children = _children_of(os.getpid())
        for child in children:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            reaped, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if not reaped and not children:
            time.sleep(0.001)


def _deadline(signum, frame):
    _kill_descendants()
    os._exit(128 + signal.SIGKILL)


def _reaper(request, report_fd, isolation):
    _LIBC.prctl(PR_SET_CHILD_SUBREAPER, 1)
    if "pid-namespace" in isolation:
        try:
            _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            isolation.append("private-proc")
        except OSError as error:
            isolation.append(_degraded(request, f"/proc of the PID namespace: {error.strerror}", [])[0])
    try:
        _leave_old_root(isolation)
    except OSError as error:
        isolation.remove("private-root")
        isolation.extend(_degraded(request, f"leaving the host's root: {error.strerror}", []))
    own_count = _own_user_namespace_pipes(request)
    worker = os.fork()
    if worker == 0:
        _worker(request, report_fd, isolation, own_count)
    _map_worker_ids(worker, request, own_count)
    # The wall clock, enforced inside the run too: code that left the caller's process group (setsid)
    # is not reached by the caller's kill, so at the deadline this process kills every descendant
    # and exits; with a PID namespace the kernel then kills whatever is left in it.
    signal.signal(signal.SIGALRM, _deadline)
    signal.setitimer(signal.ITIMER_REAL, request["limits"]["wall_seconds"])
    # Leave the process group that the caller kills at the wall-clock limit, so as to outlive the
    # worker and kill what it left behind (in another session, say) even without a PID namespace.
    os.setpgid(0, 0)
    os.close(report_fd)
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == worker:
            break
    _kill_descendants()
    return _exit_code(status)


# --------------------------------------------------------------------------------------------------
# G: limits, privileges, kernel filters, audit hook, then the cells


def _own_user_namespace_pipes(request):
    """C, root caller: two pipes for G to enter a user namespace of its own whose id maps C writes (G, once
    inside, may no longer). None when the code does not run as ``sandbox_uid`` or namespaces are off."""
    if not request["drop_to"] or request["namespaces"] == "off":
        return None
    return os.pipe(), os.pipe()


def _enter_own_user_namespace(pipes):
    """G, root caller: ``unshare(CLONE_NEWUSER)``, then wait for C to map ``sandbox_uid``/``gid`` and root.

    RLIMIT_NPROC counts the processes of a (user namespace, uid) pair (Linux >= 5.14), so in a namespace of
    its own the sandbox user's limit counts this run's processes only: not the machine's other ``nobody``
    processes, nor concurrent sandbox calls. Done before any limit is set (the namespace takes the
    caller's limit as its ceiling). False when the kernel refuses (the count is then system-wide)."""
    if pipes is None:
        return False
    (ready_read, ready_write), (mapped_read, mapped_write) = pipes
    os.close(ready_read)
    os.close(mapped_write)
    try:
        _libc_call("unshare", CLONE_NEWUSER)
        entered = True
    except OSError:
        entered = False
    os.write(ready_write, b"1" if entered else b"0")
    os.close(ready_write)
    done = os.read(mapped_read, 1) == b"1"
    os.close(mapped_read)
    return entered and done


def _map_worker_ids(worker, request, pipes):
    """C: write G's id maps once G is in its own user namespace (C holds CAP_SETUID/SETGID outside it)."""
    if pipes is None:
        return
    (ready_read, ready_write), (mapped_read, mapped_write) = pipes
    os.close(ready_write)
    os.close(mapped_read)
    done = False
    if os.read(ready_read, 1) == b"1":
        uid, gid = request["drop_to"]
        try:
            # root too (unprivileged there: G holds no capability once it is sandbox_uid), as the kernel
            # refuses writes to files whose owner is not mapped (the private /tmp and /dev/null are root's)
            for name, text in (("uid_map", f"0 0 1\n{uid} {uid} 1"), ("gid_map", f"0 0 1\n{gid} {gid} 1")):
                with open(f"/proc/{worker}/{name}", "w") as f:
                    f.write(text)
            done = True
        except OSError:
            pass
    os.close(ready_read)
    os.write(mapped_write, b"1" if done else b"0")
    os.close(mapped_write)


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


def _set_limits(limits, processes):
    cpu = limits["cpu_seconds"]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    for name, value in (
        ("RLIMIT_AS", limits["memory_bytes"]),
        ("RLIMIT_FSIZE", limits["max_file_bytes"]),
        ("RLIMIT_NOFILE", limits["max_open_files"]),
        ("RLIMIT_CORE", 0),
    ):
        resource.setrlimit(getattr(resource, name), (value, value))
    nproc = processes + limits["max_processes"]
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


def _drop_privileges(uid, gid):
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if os.getuid() == 0 or os.geteuid() == 0:
        raise RuntimeError("sandbox: failed to drop root privileges")


def _drop_capabilities():
    """Clear the permitted, effective and inheritable capability sets (capset, version 3)."""
    header = struct.pack("Ii", 0x20080522, 0)
    _libc_call("capset", header, bytes(24))
    _libc_call("prctl", PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def seccomp_filter(denied, machine=None):
    """A classic-BPF seccomp program: EPERM for the system calls ``denied`` and for foreign ABIs, ENOSYS
    for calls numbered above ``SECCOMP_REVIEWED_UP_TO``.

    Returns None on machines without a table in ``SECCOMP_ARCH``.
    """
    machine = machine or os.uname().machine
    if machine not in SECCOMP_ARCH:
        return None
    eperm, enosys, allow = 0x00050000 | 1, 0x00050000 | 38, 0x7FFF0000
    load, jeq, jge, jgt, ret = 0x20, 0x15, 0x35, 0x25, 0x06
    program = [(load, 0, 0, 4), (jeq, 1, 0, SECCOMP_ARCH[machine]), (ret, 0, 0, eperm), (load, 0, 0, 0)]
    if machine == "x86_64":  # the x32 ABI numbers its calls from 0x40000000
        program += [(jge, 0, 1, 0x40000000), (ret, 0, 0, eperm)]
    program += [(jgt, 0, 1, SECCOMP_REVIEWED_UP_TO), (ret, 0, 0, enosys)]  # calls of later kernels
    for number in denied:
        program += [(jeq, 0, 1, number), (ret, 0, 0, eperm)]
    # ioctl: refuse the requests in DENIED_IOCTLS (the low 32 bits of args[1], at offset 24)
    program += [(jeq, 0, 1 + 2 * len(DENIED_IOCTLS), SECCOMP_IOCTL[machine]), (load, 0, 0, 24)]
    for request in DENIED_IOCTLS:
        program += [(jeq, 0, 1, request), (ret, 0, 0, eperm)]
    program.append((ret, 0, 0, allow))
    return b"".join(struct.pack("HBBI", *instruction) for instruction in program)


def apply_seccomp(program):
    """Install ``program`` (from :func:`seccomp_filter`) on this process and its future children."""
    _libc_call("prctl", PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    filters = ctypes.create_string_buffer(program)
    fprog = struct.pack("HxxxxxxQ", len(program) // 8, ctypes.addressof(filters))
    _libc_call("prctl", PR_SET_SECCOMP, 2, fprog, 0, 0)


def _landlock(writable):
    """Landlock: writes only beneath ``writable``; no signals, ptrace or TCP beyond this run. ABI >= 6."""
    abi = _LIBC.syscall(ctypes.c_long(SYS_LANDLOCK_CREATE), None, ctypes.c_size_t(0), ctypes.c_uint(1))
    if abi < 6:
        return False
    write_access = (1 << 1) | sum(1 << bit for bit in range(4, 15))  # write, remove, make *, refer, truncate
    file_access = (1 << 1) | (1 << 14)  # write and truncate: the rights a rule on a file may carry
    ruleset = struct.pack("QQQ", write_access, 0b11, 0b11)  # fs; bind/connect TCP; abstract socket + signal
    fd = _libc_call("syscall", ctypes.c_long(SYS_LANDLOCK_CREATE), ruleset, ctypes.c_size_t(len(ruleset)),
                    ctypes.c_uint(0))
    try:
        for path in writable:
            target = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                access = write_access if os.path.isdir(path) else file_access
                rule = struct.pack("=Qi", access, target)
                _libc_call("syscall", ctypes.c_long(SYS_LANDLOCK_ADD_RULE), ctypes.c_int(fd), ctypes.c_int(1),
                           rule, ctypes.c_uint(0))
            finally:
                os.close(target)
        _libc_call("prctl", PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        _libc_call("syscall", ctypes.c_long(SYS_LANDLOCK_RESTRICT), ctypes.c_int(fd), ctypes.c_uint(0))
    finally:
        os.close(fd)
    return True


def _private_tmp(isolation):
    return [path for path in PRIVATE_TMP if os.path.isdir(path)] if "private-tmp" in isolation else []


def _kernel_filters(request, isolation):
    """Capabilities, no_new_privs, Landlock and seccomp, in that order; append what was obtained."""
    if "user-namespace" in isolation:
        _drop_capabilities()
        isolation.append("no-capabilities")
    try:
        if _landlock([request["workdir"], os.devnull, *_private_tmp(isolation)]):
            isolation.append("landlock")
    except OSError:
        pass
    program = seccomp_filter(SECCOMP_DENIED.get(os.uname().machine, ()))
    try:
        if program is None:
            raise OSError(0, f"no seccomp table for {os.uname().machine}")
        apply_seccomp(program)
        isolation.append("seccomp")
    except OSError as error:
        isolation.extend(_degraded(request, f"seccomp: {error.strerror}", []))


def _resolve(path, dir_fd=None):
    """The real path an audited call acts on: fds and ``dir_fd``-relative paths resolved via /proc."""
    if isinstance(path, int):
        return os.readlink(f"/proc/self/fd/{path}")
    path = os.fsdecode(path)
    if dir_fd is not None and not os.path.isabs(path):
        path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
    return os.path.realpath(path)


def install_guard(workdir, *private, read_only=()):
    """Audit hook: no sockets, no sqlite3, no file modification (or directory opening) outside
    ``workdir`` and the ``private`` temporary directories, nor beneath the ``read_only`` directories
    (the interpreter's, bound back inside a private temporary directory).

    Audit hooks cannot be removed once added. They see the socket and file operations made through
    Python's own APIs; native code (ctypes, C extensions, subprocesses) is not seen, which is why the
    kernel-level layers exist. ``os.open`` does not report its ``dir_fd``, so opening a directory
    outside the working directory is refused: no such descriptor can then be obtained from Python.
    """
    roots = [os.path.realpath(path) for path in (workdir, *private)]
    excluded = [os.path.realpath(path) for path in read_only]

    def beneath(path, tops):
        return any(path == top or path.startswith(top + os.sep) for top in tops)

    def inside(path, dir_fd=None):
        try:
            resolved = _resolve(path, dir_fd)
        except OSError:
            return False
        return resolved == os.devnull or (beneath(resolved, roots) and not beneath(resolved, excluded))

    def deny(what):
        raise PermissionError(f"sandbox: {what} is not permitted")

    def hook(event, args):
        if event.startswith("socket."):
            deny("network access")
        if event.startswith("sqlite3.connect"):
            deny("sqlite3")
        if event == "open":
            path, mode, flags = args
            if path is None or isinstance(path, int):
                return
            writing = (mode is not None and any(c in mode for c in "wax+")) or bool(flags & WRITE_FLAGS)
            if writing and not inside(path):
                deny(f"writing {path!r} outside the working directory")
            if mode is None and not inside(path) and os.path.isdir(path):  # os.open, whose dir_fd is unseen
                deny(f"opening the directory {path!r} outside the working directory")
        elif event in PATH_EVENTS:
            at = PATH_EVENTS[event]
            if not inside(args[0], args[at] if at is not None and len(args) > at else None):
                deny(f"{event} on {args[0]!r} outside the working directory")
        elif event in TWO_PATH_EVENTS:
            if not (inside(args[0], args[2]) and inside(args[1], args[3])):
                deny(f"{event} outside the working directory")
        elif event == "os.symlink" and not inside(args[1], args[2]):
            deny(f"creating a link at {args[1]!r} outside the working directory")

    sys.addaudithook(hook)


def _run_cell(source, index, namespace):
    """Run one cell like a notebook: print the repr of a trailing expression. Return False on error.

    ``sys.exit(code)`` ends this cell only: ``None`` and 0 count as success, anything else (256 too) as
    an error, with a string code printed to stderr as Python would.
    """
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
    except SystemExit as stop:
        if stop.code is not None and not isinstance(stop.code, int):
            sys.stderr.write(f"{stop.code}\n")
        return stop.code is None or stop.code == 0
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


def _worker(request, report_fd, isolation, own_count=None):
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        drop = request["drop_to"]
        own = drop and _enter_own_user_namespace(own_count)
        processes = 0 if own else request["processes"] if drop else _processes_of(os.getuid())
        _set_limits(request["limits"], processes)
        if drop:
            _drop_privileges(*drop)
            isolation.append("unprivileged-user")
        if own:
            _drop_capabilities()  # uid 0 is not mapped in G's namespace, so setuid kept them there
            isolation.append("own-process-count")
        os.chdir(request["workdir"])
        _kernel_filters(request, isolation)
        sys.dont_write_bytecode = True
        private = _private_tmp(isolation)
        install_guard(request["workdir"], *private,
                      read_only=_interpreter_under_private_tmp() if private else ())
        isolation += ["rlimits", "audit-hook"]
        os.write(report_fd, json.dumps({"isolation": isolation}).encode() + b"\n")
        os.set_inheritable(report_fd, False)
        code = _run_cells(request)
        os.write(report_fd, b"finished\n")
    except SystemExit as stop:  # namespaces='require' and a layer failed
        code = stop.code if isinstance(stop.code, int) else 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main():
    request = json.loads(sys.stdin.buffer.read())
    report_fd = request["report_fd"]
    # The sandbox user's processes system-wide, counted before a private /proc hides them.
    request["processes"] = _processes_of(request["drop_to"][0]) if request["drop_to"] else 0
    isolation = _enter_namespaces(request)
    child = os.fork()
    if child:  # B: wait for C
        os.close(report_fd)
        return _exit_code(os.waitpid(child, 0)[1])
    try:
        code = _reaper(request, report_fd, isolation)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
