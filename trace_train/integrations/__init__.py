"""Adapters that run TRACE inside other training engines. Each lives in its own sub-package, imports its
engine only inside it, and is never imported by the rest of ``trace_train``."""
