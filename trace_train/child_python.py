"""Python child processes that nothing of the caller's can enter: not its working directory, its
``PYTHONPATH``, its ``PYTHONHOME``/``PYTHONSTARTUP`` nor its user site-packages.

``python -m pkg.mod`` puts the working directory first on ``sys.path`` (and ``python -c`` puts ``''``
there), so a ``math_verify.py`` that another user left in the directory where root starts the trainer is
imported, as root, by such a child. Every interpreter this package starts therefore runs isolated
(``-I``: ``-E -P -s``) and finds this package by an explicit path: the directory the parent imported
``trace_train`` from (``PACKAGE_ROOT``), put first on the child's ``sys.path``. That directory is the
parent's own code, so it adds nothing the parent does not already trust.

Launchers that start further interpreters themselves (``torch.distributed.run``, ``multiprocessing``'s
spawn) do not pass ``-I`` on; their children get :func:`isolated_environment` instead, the same
isolation written as environment variables (``PYTHONSAFEPATH``, ``PYTHONNOUSERSITE``, ``PYTHONPATH`` set
to ``PACKAGE_ROOT`` only).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
from pathlib import Path

PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])
"""The directory holding the ``trace_train`` package this process imported (a checkout or site-packages)."""

_RUN_MODULE = ("import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); "
               "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)")
_RUN_PATH = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__')"
_CALLER_VARIABLES = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "PYTHONINSPECT",
                     "PYTHONEXECUTABLE", "PYTHONPLATLIBDIR")


def module_command(module: str, *args: str) -> list[str]:
    """The argv of ``python -m module args`` run isolated (``-I``), with :data:`PACKAGE_ROOT` first on its path."""
    return [sys.executable, "-I", "-c", _RUN_MODULE, PACKAGE_ROOT, module, *args]


def script_command(path: str, *args: str) -> list[str]:
    """The argv of ``python path args`` run isolated (``-I``): the script's own directory is not on its path."""
    return [sys.executable, "-I", "-c", _RUN_PATH, os.path.abspath(path), *args]


def code_command(code: str, *args: str) -> list[str]:
    """The argv of ``python -c code args`` run isolated (``-I``), with :data:`PACKAGE_ROOT` first on its path."""
    return [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {PACKAGE_ROOT!r})\n{code}", *args]


def isolated_environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default ``os.environ``) for interpreters started by a launcher that does not pass ``-I``:
    the caller's ``PYTHON*`` search settings removed, ``PYTHONSAFEPATH=1`` (no working directory or
    script directory on ``sys.path``), ``PYTHONNOUSERSITE=1`` and ``PYTHONPATH`` = :data:`PACKAGE_ROOT`."""
    clean = {key: value for key, value in (os.environ if env is None else env).items()
             if key not in _CALLER_VARIABLES}
    return {**clean, "PYTHONSAFEPATH": "1", "PYTHONNOUSERSITE": "1", "PYTHONPATH": PACKAGE_ROOT}


@contextlib.contextmanager
def spawn_pool(processes: int):
    """A ``multiprocessing`` spawn pool whose workers start under :func:`isolated_environment` (spawn
    passes ``-I`` on only when this process has it). A worker then takes this process's ``sys.path``
    (``multiprocessing``'s own preparation step), so it imports what this process would, no more."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(isolated_environment(saved))
    try:
        pool = multiprocessing.get_context("spawn").Pool(processes)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    with pool:
        yield pool
