"""trace_train: TRACE on real LLM agents (generation back ends, environments, tree rollouts).

Importing the package is cheap; torch, transformers and vLLM are imported by the modules that need them.
"""
