"""What a training run needs around its loop: checkpoints, several ranks, metrics, output folders, threads.

``checkpoint`` (exact resume), ``distributed`` (``torchrun``: one allocation over every rank's pool),
``metrics_log`` (``metrics.jsonl``, TensorBoard, W&B), ``files`` (run locks, one-line disk errors),
``threads`` (torch and OpenMP thread counts set deliberately) and ``heap`` (the objects a run holds for its
whole life kept out of Python's full garbage collections).
"""
