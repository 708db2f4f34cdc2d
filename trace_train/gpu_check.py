"""``python -m trace_train.gpu_check``: the GPU check, kept at its old name (it lives in
:mod:`trace_train.bench.gpu_check`)."""

from .bench.gpu_check import TOLERANCE, main  # noqa: F401

__all__ = ["main", "TOLERANCE"]

if __name__ == "__main__":
    raise SystemExit(main())
