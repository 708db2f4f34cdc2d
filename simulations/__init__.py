"""simulations: a NumPy rollout-tree simulator that checks the TRACE theory and compares allocators.

Every allocation, forest, value target, advantage and metric comes from ``trace_theory``; this package
only simulates the worlds (:mod:`.model`, :mod:`.mdp`), the predictors (:mod:`.predictors`) and the
rollout engine (:mod:`.runner`), and runs the experiments (:mod:`.experiments`, ``trace-sim``).
"""
