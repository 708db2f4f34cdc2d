"""simulations.memory: the malloc settings the simulator's entry points ask for."""

import ctypes
import platform

import pytest

from simulations import memory


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_glibc_takes_both_settings():
    assert memory.keep_freed_memory() is True


def test_without_mallopt_it_does_nothing(monkeypatch):
    def no_library(name):
        raise OSError("no C library here")

    monkeypatch.setattr(ctypes, "CDLL", no_library)
    assert memory.keep_freed_memory() is False
