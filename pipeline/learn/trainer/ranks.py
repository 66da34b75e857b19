"""Training one policy on several processes (torch.distributed ranks, launched by torchrun:
`pipeline.learn.trainer.process`), so that the update equals one process's.

Every rank holds the whole model (FSDP: a shard of it) and reads the same rows in the same
order as one process would (`RankMicroBatches`): each minibatch is cut into the micro-batches one
process would run, and those are dealt out to the ranks in turn; a rank left without one of a
minibatch's micro-batches runs a stand-in (`StandInRows`), whose loss is 0. What one process
counts over a minibatch is summed over the ranks (`all_sum`): the loss's denominator (tokens or
rows), so each rank's loss is its share of the one mean, and the gradients, summed over the ranks
before the optimizer step (`sum_gradients`; FSDP's reduce-scatter does it there). The diagnostics
and the bookkeeping of a run are gathered to every rank at the end (`gather`), and rank 0 alone
writes the checkpoint and the result (`is_main`).
"""

from __future__ import annotations

import math
import os
from typing import Any, Iterator, Mapping, Sequence

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, Sampler

__all__ = [
    "world",
    "is_main",
    "init_ranks",
    "close_ranks",
    "all_sum",
    "all_max",
    "gather",
    "sum_gradients",
    "RankMicroBatches",
    "StandInRows",
    "EpochLoader",
    "rank_accumulation",
]


def world() -> tuple[int, int]:
    """(this process's rank, the number of ranks); (0, 1) outside a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def is_main() -> bool:
    """Whether this process writes what a run leaves behind (rank 0, or the only process)."""
    return world()[0] == 0


def init_ranks() -> int:
    """Join the process group torchrun described in the environment (WORLD_SIZE > 1), once: NCCL
    on a CUDA GPU (this rank's LOCAL_RANK device), gloo on a CPU. Returns the number of ranks."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1 or dist.is_initialized():
        return world()[1]
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl")
    else:
        dist.init_process_group("gloo")
    return dist.get_world_size()


def close_ranks() -> None:
    """Leave the process group (after the last collective)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def _reduce(value: float, op) -> float:
    if world()[1] == 1:
        return value
    t = torch.tensor([float(value)], dtype=torch.float64, device=_device())
    dist.all_reduce(t, op=op)
    return float(t.item())


def all_sum(value: float) -> float:
    """`value` summed over the ranks (float64, so counts stay exact)."""
    return _reduce(value, dist.ReduceOp.SUM)


def all_max(value: float) -> float:
    """The largest of `value` over the ranks (the wall time of a run is its slowest rank's)."""
    return _reduce(value, dist.ReduceOp.MAX)


def gather(obj: Any) -> list[Any]:
    """Every rank's `obj` (picklable), in rank order, on every rank."""
    if world()[1] == 1:
        return [obj]
    out: list[Any] = [None] * world()[1]
    dist.all_gather_object(out, obj)
    return out


def sum_gradients(params: Sequence[torch.nn.Parameter]) -> None:
    """Sum the gradients of `params` over the ranks, in place, as one flat tensor (one collective;
    a parameter without a gradient on this rank counts as zeros). Each rank's gradient is its share
    of the minibatch's loss, so the sum is the gradient one process computes over all of it."""
    if world()[1] == 1 or not params:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1).to(torch.float32) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for p, g in zip(params, grads):
        n = g.numel()
        p.grad = flat[offset : offset + n].view_as(g).to(g.dtype)
        offset += n


def rank_accumulation(grad_accum_steps: int, ranks: int) -> int:
    """Micro-batches each rank runs per optimizer step when one process runs `grad_accum_steps`."""
    return math.ceil(grad_accum_steps / ranks)


class RankMicroBatches(Sampler[list[int]]):
    """This rank's micro-batches (lists of row indices): `order` (a sampler giving the row order
    one process trains in) cut into minibatches of `minibatch_size` rows and each into micro-batches
    of `micro_batch_size` rows, exactly as one process cuts them; the micro-batches of each
    minibatch are dealt to the ranks in turn, and every rank gets `rank_accumulation` slots per
    minibatch: a slot with no micro-batch left is a stand-in (the index `n_rows` + a row of the
    minibatch, see `StandInRows`). `set_epoch` reaches `order`."""

    def __init__(self, order: Sampler[int], n_rows: int, minibatch_size: int, micro_batch_size: int, rank: int, ranks: int):
        self.order, self.n_rows = order, int(n_rows)
        self.minibatch_size, self.micro_batch_size = int(minibatch_size), int(micro_batch_size)
        self.rank, self.ranks = int(rank), int(ranks)
        self.slots = rank_accumulation(math.ceil(self.minibatch_size / self.micro_batch_size), self.ranks)

    def __iter__(self) -> Iterator[list[int]]:
        order = list(self.order)
        for start in range(0, len(order), self.minibatch_size):
            rows = order[start : start + self.minibatch_size]
            micro = [rows[i : i + self.micro_batch_size] for i in range(0, len(rows), self.micro_batch_size)]
            for slot in range(self.slots):
                k = slot * self.ranks + self.rank
                yield micro[k] if k < len(micro) else [self.n_rows + rows[0]]

    def __len__(self) -> int:
        return math.ceil(self.n_rows / self.minibatch_size) * self.slots

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.order, "set_epoch"):
            self.order.set_epoch(epoch)


class StandInRows(Dataset):
    """`rows` (a dataset of view rows) and, past its end, stand-ins: index `len(rows)` + i is row i
    marked `stand_in`, which a micro-batch forwards (FSDP) or not, and whose loss counts 0."""

    def __init__(self, rows):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> Mapping[str, Any]:
        n = len(self.rows)
        return self.rows[index] if index < n else {**self.rows[index - n], "stand_in": True}


class EpochLoader(DataLoader):
    """A DataLoader whose `set_epoch` (which the Trainer calls each epoch) reaches its batch sampler."""

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.batch_sampler, "set_epoch"):
            self.batch_sampler.set_epoch(epoch)
