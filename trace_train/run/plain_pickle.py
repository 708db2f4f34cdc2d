"""A checkpoint's pickled state that ``torch.load(weights_only=True)`` cannot hold: pipelined expansion's
pending step (``trace_theory.pipelined.Pending``: the step's record, the starts still to grow and the
engine's trees with their environment snapshots, ``trace_train.rollout.pipeline.Carried``).

Written with :mod:`pickle`, read with an unpickler that rebuilds plain data only: containers, NumPy
arrays, and instances of data classes (dataclasses, enums, named tuples, exceptions, and the engine's
:class:`~trace_train.rollout.env_calls.OpeningFailed`) from modules this process has already imported
(the run's own: ``trace_theory``, ``trace_train``, the task's environment). No module is imported and no
function is called on a file's say: a file that asks for anything else (``os.system``, a class of a module
not loaded) is refused with a :class:`~.checkpoint.CheckpointError` naming the file and the global,
before any of it runs. A snapshot that cannot be pickled fails the write in one line naming its type.
"""

from __future__ import annotations

import dataclasses
import enum
import io
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["dumps", "load", "PickleRefused"]

_BUILTINS = {"set", "frozenset", "complex", "slice", "range", "bytearray"}
_NUMPY = {("numpy._core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "_reconstruct"),
          ("numpy._core.multiarray", "scalar"), ("numpy.core.multiarray", "scalar"),
          ("numpy._core.numeric", "_frombuffer"), ("numpy.core.numeric", "_frombuffer"),
          ("numpy", "ndarray"), ("numpy", "dtype")}
_NAMED = {("trace_train.rollout.env_calls", "OpeningFailed")}


class PickleRefused(pickle.UnpicklingError):
    """A file asked for a global that is not plain data."""


def _plain_class(obj: Any) -> bool:
    if not isinstance(obj, type):
        return False
    return (dataclasses.is_dataclass(obj) or issubclass(obj, (enum.Enum, BaseException, np.dtype))
            or (issubclass(obj, tuple) and hasattr(obj, "_fields")))


def _enum_member(cls: Any, name: Any):
    """What ``builtins.getattr`` may do in a pending file: name a member of an enum the file was allowed to
    load. Some Python versions (3.11.2, Debian 12's) pickle an enum member as ``getattr(cls, name)``; any
    other use of ``getattr`` is refused."""
    if isinstance(cls, type) and issubclass(cls, enum.Enum) and isinstance(name, str) and name in cls.__members__:
        return cls[name]
    raise PickleRefused(f"builtins.getattr on {getattr(cls, '__name__', type(cls).__name__)}.{name!r} "
                        "(only an enum's member is allowed)")


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if module == "builtins" and name in _BUILTINS:
            return super().find_class(module, name)
        if module == "builtins" and name == "getattr":
            return _enum_member
        if (module, name) in _NUMPY or (module, name) in _NAMED or module == "numpy.dtypes":
            return super().find_class(module, name)
        loaded = sys.modules.get(module)
        obj = getattr(loaded, name, None) if loaded is not None and "." not in name else None
        if _plain_class(obj):
            return obj
        raise PickleRefused(f"{module}.{name}")


def dumps(obj: Any, what: str) -> bytes:
    """``obj`` pickled; a ValueError naming ``what`` and the reason when part of it cannot be."""
    try:
        return pickle.dumps(obj, protocol=4)
    except (pickle.PicklingError, TypeError, AttributeError) as err:
        raise ValueError(f"{what} cannot be saved: {str(err).splitlines()[0][:200]} (environment snapshots "
                         "must be picklable plain data)") from None


def load(file: Path) -> Any:
    """What :func:`dumps` wrote to ``file``, rebuilt as plain data only (the module docstring); raises
    :class:`PickleRefused` (the global asked for) or another ``UnpicklingError`` / ``EOFError``."""
    return _Unpickler(io.BytesIO(Path(file).read_bytes())).load()
