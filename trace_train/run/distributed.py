"""Several processes under ``torchrun``: one generation engine per rank, one policy, one allocation.

The layout, following verl and TRL's multi-process GRPO:

* **Data.** Each rank draws its own slice of the candidate pool (``PromptSampler`` shards by rank).
* **Allocation over the global pool.** :class:`GlobalRootAllocator` gathers every rank's predictions,
  runs the policy's root allocation once over the pools joined in interleaved order (every rank's first
  prompt, then every rank's second, ...: a rule that takes the first prompts, or breaks ties by pool
  order, then spreads them over the ranks) and keeps its own slice; every rank computes the same answer
  from the same data (allocation is deterministic). DAPO's rounds run on each rank within its share of
  the one budget (:meth:`GlobalRootAllocator.dynamic_share`). Prefix allocation stays on
  the rank that owns the prompt: its budget is m_i N, local by construction.
* **Policy.** The model is sharded with PyTorch FSDP (``fully_shard`` on every decoder layer, then the
  whole model); gradients are averaged across ranks by FSDP, and :func:`global_normaliser` makes the
  token-mean loss a mean over the *global* batch.
* **Resume.** A checkpoint holds the full fp32 weights and optimiser state (gathered to rank 0, one
  tensor at a time); a resuming rank maps the files and copies only the rows its shards hold
  (:func:`shard_like`), so no rank reads, or holds, the whole optimiser state.
* **Weight sync.** After each update every rank streams the full weights into its own generation engine,
  one parameter gathered at a time (:func:`iter_full_tensors`), so no rank holds a second full copy.

The same code runs on CPUs with the gloo back end, which is how it is tested (2 processes).
"""

from __future__ import annotations

import atexit
import datetime
import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

__all__ = ["DistInfo", "init_distributed", "GlobalRootAllocator", "allocate_interleaved", "interleaved_order",
           "rank_share", "shard_policy", "full_state_dict",
           "checkpoint_state_dict", "iter_full_tensors",
           "full_optimizer_state_dict", "load_full_optimizer_state_dict", "load_full_weights", "shard_like",
           "gather_objects",
           "global_normaliser", "max_over_ranks", "merge_metrics"]


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: str = "cpu"

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


_joined: list = []
"""The process group :func:`init_distributed` made (at most one), for :func:`leave_distributed`."""


def init_distributed(device: str = "auto", timeout_s: float | None = None) -> DistInfo:
    """Join the process group torchrun set up (NCCL on GPUs, gloo on CPUs); a single process otherwise.
    ``timeout_s``: the longest wait of one collective (``distributed.timeout_s``; None: torch's default)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    use_cuda = torch.cuda.is_available() if device == "auto" else device.startswith("cuda")
    if world == 1:
        return DistInfo(device="cuda" if use_cuda else "cpu")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        # CPU tensors (object collectives, scalars) go through gloo and CUDA tensors through NCCL: an
        # NCCL-only group refuses a CPU tensor, so the first multi-GPU update would raise
        timeout = None if timeout_s is None else datetime.timedelta(seconds=float(timeout_s))
        dist.init_process_group(_backend(use_cuda), timeout=timeout)
        _joined.append(dist.group.WORLD)
        atexit.register(_leave_process_group)
    if use_cuda:
        torch.cuda.set_device(local)
    return DistInfo(dist.get_rank(), dist.get_world_size(), local, f"cuda:{local}" if use_cuda else "cpu")


def _leave_process_group() -> None:
    """Destroy the process group at exit, while the interpreter is still whole. Left to interpreter
    finalisation, gloo's worker threads can outlive the objects they hold and the process aborts after
    its work is done ("terminate called without an active exception", SIGABRT; seen on 2 CPU ranks in 3
    torchrun jobs of this round's four test-suite runs), which torchrun reports as a failed job."""
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - at exit, a group a failure already broke: nothing left to do
            pass


def leave_distributed() -> None:
    """End a job that every rank finished: wait for the others, then destroy the process group
    :func:`init_distributed` joined while the interpreter is whole (a group someone else made, such as the
    one in-process vLLM makes for itself, is left alone). Only after a success (a failed rank's peer may be
    inside another collective, and a barrier would wait there for the timeout; the exit hook destroys
    without one). Without the barrier the last rank to leave aborted about once in 10 two-rank CPU jobs
    ("terminate called without an active exception", SIGABRT, after its work was done), which torchrun
    reports as a failed job."""
    if dist.is_initialized() and _joined and _joined[-1] is dist.group.WORLD:
        _joined.clear()
        dist.barrier()
        dist.destroy_process_group()


def _backend(use_cuda: bool) -> str:
    """The process group's back end for each device type (``cpu:gloo,cuda:nccl`` on GPUs)."""
    return "cpu:gloo,cuda:nccl" if use_cuda else "gloo"


def _scalar(value, dtype: torch.dtype, info: DistInfo) -> torch.Tensor:
    """A one-element tensor on the rank's own device, as every collective of the group expects."""
    return torch.tensor([value], dtype=dtype, device=info.device)


def interleaved_order(sizes: list[int]) -> np.ndarray:
    """Positions in the rank-order concatenation of pools of ``sizes``, taken in interleaved order: every
    rank's first prompt, then every rank's second, and so on (``[0, 3, 1, 4, 2, 5]`` for sizes 3 and 3).

    An allocation rule that takes the first prompts of its pool (uniform groups, ties of the water-filling)
    then takes them from every rank in turn, not all from rank 0."""
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    pairs = [(i, r) for r, n in enumerate(sizes) for i in range(n)]
    pairs.sort()
    return np.asarray([starts[r] + i for i, r in pairs], dtype=np.int64)


def allocate_interleaved(policy, parts: list[tuple], budget: int, *, rng, rank: int) -> np.ndarray:
    """Rank ``rank``'s root counts of one allocation of ``budget`` over every rank's pool.

    ``parts[r]`` is rank r's ``(v, concentration or None, cost or None)``. The pools are joined in the
    :func:`interleaved_order` (so that ties and uniform rules spread the prompts over the ranks), the
    policy allocates once over the joined pool, and the counts are mapped back to each rank's own
    prompts. Every rank computes the same answer from the same data."""
    sizes = [len(p[0]) for p in parts]
    order = interleaved_order(sizes)

    def joined(k):
        if any(p[k] is None for p in parts):
            return None
        return np.concatenate([np.asarray(p[k], dtype=float) for p in parts])[order]

    v_all, kappa_all, cost_all = joined(0), joined(1), joined(2)
    priced = {} if cost_all is None else {"cost": cost_all}
    m_interleaved = np.asarray(policy.allocate_roots(v_all, budget, rng=rng, concentration=kappa_all, **priced))
    m_all = np.empty_like(m_interleaved)
    m_all[order] = m_interleaved
    start = sum(sizes[:rank])
    return m_all[start:start + sizes[rank]]


def rank_share(total: int, world_size: int, rank: int, unit: int = 1) -> int:
    """Rank ``rank``'s part of ``total`` dealt out in whole ``unit`` s (a group), the remainder's units
    to the lowest ranks and what is left below one unit to rank 0: the parts add up to ``total``."""
    units, rest = divmod(int(total), int(unit))
    mine = (units // world_size + (rank < units % world_size)) * unit
    return mine + (rest if rank == 0 else 0)


class GlobalRootAllocator:
    """A root allocator for the step driver (``trace_theory.step.run_step``'s ``root_allocator`` hook,
    passed through ``RolloutEngine``) that allocates the budget over every rank's pool together
    (:func:`allocate_interleaved`), and splits a dynamic-sampling (DAPO) budget over the ranks
    (:meth:`dynamic_share`), so that the job spends one budget whatever the number of processes."""

    def __init__(self, info: DistInfo):
        self.info = info

    def __call__(self, policy, v, budget, *, rng, concentration, cost=None):
        mine = (np.asarray(v), None if concentration is None else np.asarray(concentration),
                None if cost is None else np.asarray(cost), int(budget))
        parts = [None] * self.info.world_size
        dist.all_gather_object(parts, mine)
        # One budget for the job: with ``rollout.token_budget`` each rank sizes M from its own running
        # tokens-per-rollout estimate, so the ranks' budgets may differ; every rank allocates their mean.
        agreed = sum(p[3] for p in parts) // len(parts)
        return allocate_interleaved(policy, [p[:3] for p in parts], agreed, rng=rng, rank=self.info.rank)

    def dynamic_share(self, policy, budget):
        """(policy, budget) for this rank's DAPO rounds (or Pilot-Commit's pilot and commits): the job's budget (``budget``'s total, the ranks'
        mean under ``rollout.token_budget``) and its target of mixed groups, dealt out over the ranks in
        whole groups (:func:`rank_share`). DAPO never calls the root allocator, so without this every
        rank would spend the whole budget."""
        from trace_theory import RolloutBudget

        totals = [None] * self.info.world_size
        dist.all_gather_object(totals, int(policy.split(budget)[0]))
        total = sum(totals) // len(totals)
        world, rank, g = self.info.world_size, self.info.rank, policy.group_size
        budget = RolloutBudget(rank_share(total, world, rank, g), 0)
        if not policy.dynamic_sampling:  # Pilot-Commit: each rank pilots and commits within its share
            return policy, budget
        target = rank_share(policy.dynamic_target(total), world, rank)
        return policy.replace(dapo_target=max(target, 1)), budget


def shard_policy(model: torch.nn.Module, *, compute_dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """FSDP2: shard every decoder layer, then the rest of the model (in place; returns the model).

    The sharded parameters are the fp32 master weights (AdamW's state is fp32 too); forward and backward
    run in ``compute_dtype`` and gradients are reduced across ranks in fp32
    (``MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=float32)``), as large trainers do.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    layers = getattr(getattr(model, "model", model), "layers", None)
    for layer in layers if layers is not None else []:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def reshard_after_forward(model: torch.nn.Module) -> None:
    """Free what FSDP2 left gathered after a forward with no backward to come (the frozen reference).

    FSDP2 does not reshard its *root* module after the forward (it expects the backward to need the
    parameters at once), so after the sharded reference's forward its root's unsharded parameters stay on
    every rank: the embedding, the output layer and the final norm, P_root x ``model.dtype`` bytes
    (2.3 GiB for Qwen3-8B in bf16, 2.9 GiB for 14B) for the rest of the update. ``reshard()`` frees them;
    a module that FSDP did not shard is left alone (``trace_train.bench.memory_plan``'s "reference root" row)."""
    reshard = getattr(model, "reshard", None)
    if callable(reshard):
        reshard()


def iter_full_tensors(model: torch.nn.Module, info: DistInfo, dtype: torch.dtype | None = None):
    """``(name, unsharded tensor)`` of every entry of the model's state dict, one at a time, Hugging Face names.

    Under FSDP each parameter's shards are cast to ``dtype`` (the generator's) on their rank and then
    gathered (a collective: every rank must consume the stream in the same order, to the end); a tied
    parameter is gathered once. The caller's peak is one full parameter in ``dtype``: a generation engine
    that loads the stream as it comes (vLLM) never holds a second copy of the model. One process: the
    model's own tensors, cast."""
    from torch.distributed.tensor import DTensor

    done: dict[int, torch.Tensor] = {}  # tied parameters: gathered once, while both names are pending
    entries = list(model.state_dict(keep_vars=True).items())
    uses: dict[int, int] = {}
    for _, t in entries:
        uses[id(t)] = uses.get(id(t), 0) + 1
    with torch.no_grad():
        for name, t in entries:
            key = id(t)
            if key not in done:
                part = t.detach()
                if dtype is not None and part.is_floating_point():
                    part = part.to(dtype)
                done[key] = part.full_tensor() if isinstance(part, DTensor) else part
            full = done[key]
            uses[key] -= 1
            if not uses[key]:
                del done[key]
            yield name, full


def full_state_dict(model: torch.nn.Module, info: DistInfo,
                    dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Unsharded weights on every rank (what a generation engine loads), with Hugging Face names.

    Under FSDP each parameter is cast to ``dtype`` (the generator's) on its shards and then gathered
    (:func:`iter_full_tensors`), so the result is one full copy in ``dtype``, never a full fp32 copy.
    One process: the model's own tensors (the generator casts them as it loads)."""
    if not info.enabled:
        return model.state_dict()
    return dict(iter_full_tensors(model, info, dtype))


def checkpoint_state_dict(model: torch.nn.Module, info: DistInfo) -> dict[str, torch.Tensor]:
    """The full fp32 master weights for a checkpoint or an export: one process, its ``state_dict()``;
    under FSDP gathered to rank 0's CPU one tensor at a time (a collective; the other ranks get ``{}``)."""
    if not info.enabled:
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def full_optimizer_state_dict(model: torch.nn.Module, optimizer: torch.optim.Optimizer, info: DistInfo) -> dict:
    """The optimizer's whole state (every rank's shard of AdamW's moments, gathered; parameter names as
    keys, on CPU), so that a checkpoint written by rank 0 resumes every rank. A collective under FSDP."""
    if not info.enabled:
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def shard_like(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``full`` laid out as ``like`` (a parameter's DTensor): the slice of the global
    tensor that ``like``'s placements give this rank, copied to its device. Only that slice is read, so a
    memory-mapped ``full`` (``torch.load(mmap=True)``) pages in this rank's bytes alone, where torch's
    full-state-dict loading copies every whole tensor to every rank's device first. A plain ``like`` (not
    sharded) gets all of ``full``."""
    from torch.distributed.tensor import DTensor

    if not isinstance(like, DTensor):
        return full.detach().to(like.device)
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if tuple(full.shape) != tuple(like.shape):
        raise ValueError(f"a tensor of shape {tuple(full.shape)} cannot fill a parameter of shape {tuple(like.shape)}")
    shape, offset = compute_local_shape_and_global_offset(like.shape, like.device_mesh, like.placements)
    piece = full.detach()[tuple(slice(o, o + n) for o, n in zip(offset, shape))]
    local = piece.to(like.device, copy=True).contiguous()
    return DTensor.from_local(local, like.device_mesh, like.placements, run_check=False, shape=like.shape,
                              stride=like.stride())


def load_full_weights(model: torch.nn.Module, state: dict[str, torch.Tensor], info: DistInfo) -> None:
    """Load :func:`checkpoint_state_dict`'s output: one process, ``load_state_dict``; under FSDP every
    parameter (and persistent buffer) copies its own shard's rows of the full tensor (:func:`shard_like`).
    A ValueError names the keys the state lacks."""
    if not info.enabled:
        model.load_state_dict(state)
        return
    from torch.distributed.tensor import DTensor

    tensors = dict(model.named_parameters())
    persistent = {k for k in model.state_dict() if k not in tensors}
    tensors.update((k, b) for k, b in model.named_buffers() if k in persistent)
    missing = sorted(set(tensors) - set(state))
    if missing:
        raise ValueError(f"the checkpoint's weights lack {len(missing)} of the model's tensors: {missing[:3]}")
    with torch.no_grad():
        for name, target in tensors.items():
            value = shard_like(state[name], target)
            local = target.to_local() if isinstance(target, DTensor) else target
            local.copy_(value.to_local() if isinstance(value, DTensor) else value)


def load_full_optimizer_state_dict(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict,
                                   info: DistInfo) -> None:
    """Load :func:`full_optimizer_state_dict`'s output; under FSDP each rank builds its own shard of every
    moment (:func:`shard_like`, reading only those rows) and loads that sharded state."""
    if not info.enabled:
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    params = dict(model.named_parameters())
    unknown = sorted(set(state["state"]) - set(params))
    if unknown:
        raise ValueError(f"the checkpoint's optimizer state names parameters this model lacks: {unknown[:3]}")
    sharded = {"param_groups": state["param_groups"],
               "state": {name: {k: (v.detach().cpu().clone() if v.dim() == 0 else shard_like(v, params[name]))
                                if isinstance(v, torch.Tensor) else v for k, v in moments.items()}
                         for name, moments in state["state"].items()}}
    set_optimizer_state_dict(model, optimizer, optim_state_dict=sharded,
                             options=StateDictOptions(full_state_dict=False))


def gather_objects(obj, info: DistInfo) -> list:
    """Every rank's ``obj``, in rank order, on every rank (``[obj]`` in one process)."""
    if not info.enabled:
        return [obj]
    parts: list = [None] * info.world_size
    dist.all_gather_object(parts, obj)
    return parts


def global_normaliser(local: float, info: DistInfo) -> float:
    """The sum of ``local`` over ranks (the global token weight that the loss is divided by)."""
    if not info.enabled:
        return float(local)
    t = _scalar(float(local), torch.float64, info)
    dist.all_reduce(t)
    return float(t.item())


def max_over_ranks(value: int, info: DistInfo) -> int:
    """The largest ``value`` over ranks (so that all ranks run the same number of passes)."""
    if not info.enabled:
        return int(value)
    t = _scalar(int(value), torch.long, info)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def merge_metrics(values: dict[str, float], weight: float, info: DistInfo, *, sums: tuple[str, ...] = ()) -> dict[str, float]:
    """Combine every rank's metrics: keys in ``sums`` are added, the rest averaged with weight ``weight``
    (ranks without a finite value for a key are left out). Ranks may report different keys."""
    if not info.enabled:
        return values
    parts: list = [None] * info.world_size
    dist.all_gather_object(parts, (values, float(weight)))
    keys = sorted({k for part, _ in parts for k in part})
    out = {}
    for k in keys:
        pairs = [(float(part[k]), w) for part, w in parts if k in part and np.isfinite(part[k])]
        if k in sums:
            out[k] = sum(v for v, _ in pairs)
        elif pairs and sum(w for _, w in pairs) > 0:
            out[k] = sum(v * w for v, w in pairs) / sum(w for _, w in pairs)
        else:
            out[k] = float("nan")
    return out
