#!/usr/bin/env bash
# TRACE's math recipe (recipe_math_qwen3_8b.yaml) under verl's own entry point, in verl's recipe style:
# every setting on the command line can be overridden by appending `key=value` arguments.
# Needs: one node of 8 GPUs >= 80 GB (or set NNODES / N_GPUS), the plugin's venv plus verl's GPU stack
#   pip install -e ".[verl]" "verl[vllm]>=0.9.1,<0.10"
# and, on EVERY node of a multi-node Ray cluster, the same install (the trace plugin is imported by each
# node's Ray workers: agent-loop workers, the step coordinator actor, the Python tool), the data files
# at the same path (or on shared storage) and the model weights in the local Hugging Face cache.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
DATA=${DATA:-$ROOT/data/trace_math}
MODEL=${MODEL:-Qwen/Qwen3-8B}
NNODES=${NNODES:-1}
N_GPUS=${N_GPUS:-8}
CKPT=${CKPT:-$ROOT/runs/verl_math_qwen3_8b}

[ -f "$DATA/train.parquet" ] || python -m trace_train.integrations.verl.prepare_math --out "$DATA"

python -m verl.trainer.main_ppo \
    --config-path="$ROOT/trace_train/integrations/verl" --config-name=recipe_math_qwen3_8b \
    data.train_files="$DATA/train.parquet" data.val_files="$DATA/test.parquet" \
    actor_rollout_ref.model.path="$MODEL" \
    trainer.nnodes="$NNODES" trainer.n_gpus_per_node="$N_GPUS" \
    trainer.default_local_dir="$CKPT" \
    trainer.logger='[console,tensorboard]' \
    "$@"
