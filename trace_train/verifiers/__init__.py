"""Verifiers: final-answer extraction and terminal rewards for the math and multi-hop QA environments.

- ``answers``: the documented answer formats (``<answer>...</answer>`` tag, ``\\boxed{...}``).
- ``math``: math answer checking with ``math-verify``, with a timeout.
- ``qa``: SQuAD-style normalisation, exact match, token F1 and exact match at F1 >= 0.3.

BFCL is checked by the official checker, wrapped in ``trace_train.tools.bfcl``.
"""
