"""The order rows reach the optimizer: every minibatch keeps the rows the Trainer's seeded shuffle
gave it, reordered inside it by length (`MinibatchSortedSampler`, less padding) and, on request,
whole prompt groups kept together (`GroupShuffleSampler`, `TrainConfig.group_minibatches`).
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any, Sequence

import pyarrow as pa
from torch.utils.data import Sampler

__all__ = ["MinibatchSortedSampler", "GroupShuffleSampler", "prompt_groups", "row_sort_keys", "prefix_groups"]


class MinibatchSortedSampler(Sampler[int]):
    """The rows in `inner`'s order (the Trainer's seeded shuffle), cut into minibatches of
    `minibatch_size` rows, each reordered by `keys[row]` (ascending, stable) before the
    DataLoader cuts it into micro-batches. Every minibatch holds the rows it held under `inner`,
    so the optimizer steps (their rows, denominators and gradients) are the same; rows of similar
    length share a micro-batch, so less of it is padding. `set_epoch` reaches `inner`."""

    def __init__(self, inner: Sampler[int], keys: Sequence[Any], minibatch_size: int):
        self.inner = inner
        self.keys = list(keys)
        self.minibatch_size = int(minibatch_size)

    def __iter__(self):
        order = list(self.inner)
        for start in range(0, len(order), self.minibatch_size):
            yield from sorted(order[start : start + self.minibatch_size], key=self.keys.__getitem__)

    def __len__(self) -> int:
        return len(self.inner)

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.inner, "set_epoch"):
            self.inner.set_epoch(epoch)


class GroupShuffleSampler(Sampler[int]):
    """Every epoch, the groups of rows (`groups[row]`, one id per group) in a seeded random order,
    the rows of each group side by side (shuffled among themselves), so that minibatches cut from
    the order hold whole groups where the sizes allow (a group of 4 rows, minibatches of 8: two
    groups each). Each epoch (`set_epoch`, or each new iteration) draws another order from `seed`."""

    def __init__(self, groups: Sequence[Any], seed: int):
        self.members: dict[Any, list[int]] = {}
        for row, g in enumerate(groups):
            self.members.setdefault(g, []).append(row)
        self.n = len(groups)
        self.seed = seed
        self.epoch = 0

    def __iter__(self):
        rng = random.Random(f"{self.seed}:{self.epoch}")
        self.epoch += 1
        keys = list(self.members)
        rng.shuffle(keys)
        for key in keys:
            rows = list(self.members[key])
            rng.shuffle(rows)
            yield from rows

    def __len__(self) -> int:
        return self.n

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


def prompt_groups(table: pa.Table) -> list[int]:
    """A group id per row of `table`: rows with the same turn and the same training prompt (the
    samples of one problem, tree siblings of one node) share one. Rows whose prompts differ (later
    turns of different trajectories, each Verifier call) are groups of one."""
    keys = [(t, tuple(p)) for t, p in zip(table.column("turn").to_pylist(), table.column("train_prompt_ids").to_pylist())]
    ids: dict[tuple, int] = {}
    return [ids.setdefault(k, len(ids)) for k in keys]


def row_sort_keys(
    lengths: Sequence[tuple[int, int]], trainable: Sequence[bool] | None = None, groups: Sequence[int] | None = None
) -> list[tuple]:
    """The `MinibatchSortedSampler` key of each row: the rows to train first (those
    `trainable_rows` leaves out gather in the last micro-batches), then by `groups` (rows whose
    prompts begin alike side by side, so a micro-batch shares their prefix: `prefix_groups`), then
    the longest (prompt + completion) first, ties by completion length."""
    trainable = [True] * len(lengths) if trainable is None else trainable
    groups = [0] * len(lengths) if groups is None else groups
    return [(not t, g, -(p + c), -c) for (p, c), t, g in zip(lengths, trainable, groups)]


def prefix_groups(table: pa.Table, tokens: int) -> list[int]:
    """A group id per row of `table`: rows whose training prompts begin with the same `tokens`
    tokens share one (the largest group first), so sorting by it puts a task's rows that share a
    system prompt and worked examples into the same micro-batches (an agent's rows apart from
    another agent's). Prompts of `tokens` tokens or fewer, which can share no such prefix, are one
    group."""
    heads = [tuple(p[:tokens]) if len(p) > tokens else () for p in table.column("train_prompt_ids").to_pylist()]
    sizes = Counter(heads)
    rank = {h: i for i, h in enumerate(sorted(sizes, key=lambda h: (-sizes[h], h)))}
    return [rank[h] for h in heads]
