"""trace_train: TRACE on real LLM agents (torch, transformers, vLLM).

Generation back ends, tool environments, the tree rollout engine, the success predictor, the
tree-aware policy update and the training loop. Every allocation decision is made by ``trace_theory``.
"""
