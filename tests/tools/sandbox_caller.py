"""Run a scenario as the sandbox's caller, root or an ordinary user, in a forked-off interpreter.

The tests run as root (here and in CI) or as an ordinary user (a newcomer's ``make test``); the
sandbox's normal caller on a cluster is an ordinary user. Run by an ordinary user, ``uid=1000`` means
that user (whatever its uid): the script enters a user namespace mapping only its own ids (for the
mount namespace that holds the home), drops that namespace's capabilities and runs the scenario as an
ordinary process of that user; ``uid=0`` is skipped (a root caller needs a root test process). ``run_as_caller(scenario, uid=1000)`` starts this file as a script, which (as root) enters a
private mount namespace, mounts a tmpfs "home" owned by ``uid`` (files there stand for the caller's own
files: outside ``/tmp``, so the sandbox sees them, read-only), makes the interpreter reachable for
``uid`` the way the sandbox does for ``nobody``, optionally makes the kernel refuse ``unshare(2)`` with
a seccomp filter (a host without namespaces), drops to ``uid`` and runs ``scenario``. The scenario sees
``HOME`` (that directory), ``CALLER_PID`` and a ``result`` dict, which comes back as JSON.
"""

import json
import os
import subprocess
import sys

UNSHARE = {"x86_64": 272, "aarch64": 97}
HOME_PARENTS = ("/mnt", "/media", "/srv", "/opt")


def run_as_caller(scenario: str, *, uid: int, deny_unshare: bool = False, timeout: float = 120,
                  python: str = sys.executable) -> dict:
    """Run ``scenario`` as ``uid`` with the interpreter ``python`` and return its ``result``
    (``{"skip": why}`` when impossible here)."""
    if os.geteuid() != 0:
        if uid == 0:
            return {"skip": "a root caller needs a root test process (run the tests as root to check it)"}
        uid = os.geteuid()  # an ordinary user's test run: the caller is that user
    request = json.dumps({"scenario": scenario, "uid": uid, "deny_unshare": deny_unshare})
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))
    done = subprocess.run([python, __file__], input=request, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": path})
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise AssertionError(f"the caller failed (exit {done.returncode}):\n{done.stdout}\n{done.stderr}")
    return json.loads(lines[-1])


def _home_parent():
    needed = [os.path.realpath(p) for p in sys.path + [sys.prefix, os.getcwd()] if p]
    for parent in HOME_PARENTS:
        if os.path.isdir(parent) and not any(p == parent or p.startswith(parent + "/") for p in needed):
            return parent
    return None


def _become_caller(uid: int, deny_unshare: bool) -> str:
    from trace_train.tools import _sandbox_child as child

    parent = _home_parent()
    if parent is None:
        raise OSError(0, f"none of {HOME_PARENTS} is free to hold the caller's home")
    ordinary, gid = os.geteuid() != 0, os.getgid()  # (unmapped ids read as 65534 until mapped)
    if ordinary:  # a user namespace mapping only our own ids, for the mount namespace of the home
        child._libc_call("unshare", child.CLONE_NEWUSER | child.CLONE_NEWNS)
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    else:
        child._libc_call("unshare", child.CLONE_NEWNS)
    child._mount(None, "/", None, child.MS_REC | child.MS_PRIVATE)
    child._mount("tmpfs", parent, "tmpfs", child.MS_NOSUID | child.MS_NODEV, "mode=755,size=16m")
    home = os.path.join(parent, "caller")
    os.mkdir(home, 0o755)
    os.chown(home, uid, gid if ordinary else uid)
    if ordinary:  # the namespace's capabilities go: from here on an ordinary process of that user
        child._drop_capabilities()
    elif uid != 0:
        child._expose_interpreter()
    if deny_unshare:
        machine = os.uname().machine
        if machine not in UNSHARE:
            raise OSError(0, f"no unshare(2) number known for {machine}")
        child.apply_seccomp(child.seccomp_filter([UNSHARE[machine]]))
    if uid != 0 and not ordinary:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    os.chdir(home)
    os.environ["HOME"] = home
    return home


def main():
    request = json.loads(sys.stdin.read())
    try:
        home = _become_caller(request["uid"], request["deny_unshare"])
    except OSError as error:
        print(json.dumps({"skip": f"cannot set up the caller: {error}"}))
        return
    result = {}
    exec(compile(request["scenario"], "<scenario>", "exec"),
         {"HOME": home, "CALLER_PID": os.getpid(), "result": result})
    print(json.dumps(result))


if __name__ == "__main__":
    main()
