"""What a training run needs around its loop: checkpoints, several ranks, metrics, output folders, threads.

``checkpoint`` (exact resume), ``distributed`` (``torchrun``: one allocation over every rank's pool),
``metrics_log`` (``metrics.jsonl``, TensorBoard, W&B), ``files`` (run locks, one-line disk errors) and
``threads`` (torch and OpenMP thread counts set deliberately).
"""
