"""Benchmark scripts: each is ``python -m trace_train.bench.<name>`` and prints or writes its measured table.

Timings live here, never in pass/fail tests. See the README's "What we measured" for each script's
conditions and latest numbers.
"""
