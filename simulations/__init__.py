"""simulations: Bernoulli rollout trees and tree MDPs in NumPy, where every success probability is known.

It checks the theory of ``trace_theory`` by measurement and compares allocation policies at equal budget,
calling the very functions the trainer calls.
"""
