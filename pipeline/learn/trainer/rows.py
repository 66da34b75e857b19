"""The rows a run trains on, and how they are batched.

`select_policy_rows` takes one policy's rows of a training view (rows too long for the model
dropped with a warning, the sampling temperature and the round checked, the rows hashed);
`collate` batches view rows (prompts left-padded, completions right-padded, so every completion
ends its row and the forward keeps only the last C+1 logits); `select_rows` takes some rows of a
batch back out; `trainable_rows` says which rows' loss can be nonzero at all (the others need no
forward pass, `TrainConfig.skip_zero_rows`).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import torch

from pipeline.config.loss import LossConfig
from pipeline.errors import ConfigError, DataError
from pipeline.learn.views import check_view, view_hash

__all__ = [
    "collate",
    "select_rows",
    "trainable_rows",
    "padding_fraction",
    "PolicyRows",
    "select_policy_rows",
    "view_temperature",
    "table_trainable",
    "table_lengths",
]

log = logging.getLogger(__name__)


def collate(rows: Sequence[Mapping[str, Any]], pad_token_id: int = 0) -> dict[str, Any]:
    """Batch view rows: prompts left-padded, completions right-padded, so `prompt_ids +
    completion_ids` of every row is contiguous and the completion ends each row."""
    b = len(rows)
    p_len = max(len(r["train_prompt_ids"]) for r in rows)
    c_len = max(len(r["completion_ids"]) for r in rows)
    prompt_ids = torch.full((b, p_len), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((b, p_len), dtype=torch.long)
    completion_ids = torch.full((b, c_len), pad_token_id, dtype=torch.long)
    completion_mask = torch.zeros((b, c_len), dtype=torch.float32)
    sampling_logprobs = torch.zeros((b, c_len), dtype=torch.float32)
    for i, r in enumerate(rows):
        p, c = r["train_prompt_ids"], r["completion_ids"]
        if len(r["sampling_logprobs"]) != len(c):
            raise DataError(f"step_id {r.get('step_id')!r}: 'completion_ids' and 'sampling_logprobs' differ in length")
        prompt_ids[i, p_len - len(p) :] = torch.as_tensor(p, dtype=torch.long)
        prompt_mask[i, p_len - len(p) :] = 1
        completion_ids[i, : len(c)] = torch.as_tensor(c, dtype=torch.long)
        completion_mask[i, : len(c)] = 1.0
        sampling_logprobs[i, : len(c)] = torch.as_tensor(r["sampling_logprobs"], dtype=torch.float32)
    reward = [r.get("reward") for r in rows]
    extra = {}
    if rows and "old_logprobs" in rows[0]:
        old_logp = torch.zeros((b, c_len), dtype=torch.float32)
        for i, r in enumerate(rows):
            old_logp[i, : len(r["old_logprobs"])] = torch.as_tensor(r["old_logprobs"], dtype=torch.float32)
        extra["old_logp"] = old_logp
    return {
        **extra,
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "sampling_logprobs": sampling_logprobs,
        "advantages": torch.tensor([float(r["advantage"]) for r in rows], dtype=torch.float32),
        "sample_weight": torch.tensor([float(r["sample_weight"]) for r in rows], dtype=torch.float32),
        "reward": torch.tensor([math.nan if x is None else float(x) for x in reward], dtype=torch.float32),
        "strategy": [r["strategy"] for r in rows],
        "agent": [r["agent_id"] for r in rows],
        "step_id": [r["step_id"] for r in rows],
    }


_PROMPT_FIELDS = ("prompt_ids", "prompt_mask")


_COMPLETION_FIELDS = ("completion_ids", "completion_mask", "sampling_logprobs", "old_logp")


def select_rows(batch: Mapping[str, Any], index: Sequence[int]) -> dict[str, Any]:
    """The rows `index` of a `collate`d batch, as `collate` batches those rows alone: every
    per-row field taken at them, and the padding no kept row needs trimmed (the prompts' left
    columns, the completions' right columns)."""
    index = [int(i) for i in index]
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor):
            out[key] = value[torch.as_tensor(index, dtype=torch.long, device=value.device)]
        else:
            out[key] = [value[i] for i in index]
    p_len = int(out["prompt_mask"].sum(1).max()) if index else 0
    c_len = int(out["completion_mask"].sum(1).max()) if index else 0
    for key in _PROMPT_FIELDS:
        if key in out:
            out[key] = out[key][:, out[key].shape[1] - p_len :]
    for key in _COMPLETION_FIELDS:
        if key in out:
            out[key] = out[key][:, :c_len]
    return out


def _is_nan(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def trainable_rows(
    advantage: Sequence[float], sample_weight: Sequence[float], reward: Sequence[float | None], strategy: Sequence[str], loss: LossConfig
) -> list[bool]:
    """Per row, whether its loss under `loss` can be nonzero (False: the loss and its gradient are
    exactly 0 whatever the policy, so the row need not be forwarded; it still counts in its
    minibatch's denominator). "ppo" / "is" / "exit": False when the weighted advantage A w is 0 (A
    after `negative_weight`: with 0, every negative row), unless the KL term (beta > 0) or the NLL
    of `sft_strategies` trains the row. "rs": False below the reward threshold (or without a
    reward), and at weight 0 without a KL term."""
    out = []
    for a, w, r, st in zip(advantage, sample_weight, reward, strategy):
        a, w = float(a), float(w)
        if loss.kind == "rs":
            passed = not _is_nan(r) and float(r) >= loss.rs_threshold
            out.append(passed and (w != 0.0 or loss.beta > 0))
        elif loss.beta > 0 or st in loss.sft_strategies:
            out.append(True)
        else:
            a = a * loss.negative_weight if a < 0 else a
            out.append(a * w != 0.0)  # NaN stays trained (and shows in the loss)
    return out


def table_trainable(table: pa.Table, loss: LossConfig) -> list[bool]:
    """`trainable_rows` of every row of a view table."""
    reward = table.column("reward").to_pylist() if "reward" in table.column_names else [None] * table.num_rows
    return trainable_rows(
        table.column("advantage").to_pylist(), table.column("sample_weight").to_pylist(), reward, table.column("strategy").to_pylist(), loss
    )


def table_lengths(table: pa.Table) -> list[tuple[int, int]]:
    """(prompt tokens, completion tokens) of every row of a view table."""
    return list(
        zip(pc.list_value_length(table.column("train_prompt_ids")).to_pylist(), pc.list_value_length(table.column("completion_ids")).to_pylist())
    )


def padding_fraction(lengths: Sequence[tuple[int, int]], order: Sequence[int], micro_batch_size: int) -> float:
    """Share of padding in the micro-batches of `micro_batch_size` rows taken in `order` from rows
    of (prompt, completion) `lengths`, batched as `collate` pads them (prompts to the longest
    prompt, completions to the longest completion)."""
    real = padded = 0
    for start in range(0, len(order), micro_batch_size):
        rows = [lengths[i] for i in order[start : start + micro_batch_size]]
        real += sum(p + c for p, c in rows)
        padded += len(rows) * (max(p for p, _ in rows) + max(c for _, c in rows))
    return 1.0 - real / padded if padded else 0.0


def view_temperature(view) -> float | None:
    """The sampling temperature of a view's rows (its `temperature` column), None when the view
    has no such column (e.g. the ground-truth baseline, whose rows were never sampled). Rows
    sampled at different temperatures are an error: one run trains at one temperature."""
    table = view if isinstance(view, pa.Table) else check_view(view)
    if "temperature" not in table.column_names or table.num_rows == 0:
        return None
    values = pc.unique(table.column("temperature")).to_pylist()
    if len(values) > 1:
        raise DataError(f"the view's rows were sampled at several temperatures {sorted(values)} (column 'temperature'); train them separately")
    return float(values[0])


def _check_temperature(table: pa.Table, temperature: float) -> None:
    """The stored logprobs are log q at the sampling temperature; p_train must be taken at the same
    one, or every importance ratio is off."""
    sampled = view_temperature(table)
    if sampled is not None and not math.isclose(sampled, temperature, rel_tol=1e-9):
        raise ConfigError(
            f"the view's rows were sampled at temperature {sampled} (column 'temperature') but training runs at "
            f"{temperature} (TrainConfig.temperature, `maxit train --temperature`); they must be equal"
        )


def _policy_rows(view, policy_id: str, max_length: int) -> tuple[pa.Table, int]:
    table = check_view(view)
    table = table.filter(pc.equal(table.column("policy_id"), policy_id))
    lengths = pc.add(pc.list_value_length(table.column("train_prompt_ids")), pc.list_value_length(table.column("completion_ids")))
    too_long = pc.greater(lengths, max_length)
    n_long = int(pc.sum(too_long).as_py() or 0)
    if n_long:
        ids = table.filter(too_long).column("step_id").to_pylist()
        log.warning("policy %s: dropped %d row(s) longer than %d tokens (step_id %s)", policy_id, n_long, max_length, ids[:10])
        table = table.filter(pc.invert(too_long))
    return table, n_long


def _round_of(table: pa.Table, round_: int | None) -> int | None:
    if round_ is not None:
        return int(round_)
    if "round" in table.column_names and table.num_rows:
        rounds = pc.unique(table.column("round")).to_pylist()
        if len(rounds) == 1:
            return int(rounds[0])
        raise DataError(f"training view holds rows of several rounds {sorted(rounds)}; pass round_ explicitly")
    return None


@dataclass(frozen=True)
class PolicyRows:
    """The rows one run trains on (`select_policy_rows`)."""

    table: pa.Table
    """The policy's rows of the view that fit in the max length, in view order."""
    n_dropped_too_long: int
    """Rows of the policy dropped because prompt + completion exceed the max length."""
    round: int | None
    """Round of the rows (see `CheckpointMeta.round`)."""
    data_hash: str
    """`pipeline.learn.views.view_hash` of `table`."""


def select_policy_rows(view, policy_id: str, *, max_length: int, temperature: float, round_: int | None = None) -> PolicyRows:
    """The rows of `policy_id` in `view` (pyarrow or Polars, `training_view` schema, checked)
    whose prompt + completion fit in `max_length` tokens (the others dropped with a warning),
    after checking they were sampled at `temperature` (else ConfigError) and finding their round
    (`round_` when given, else the view's one `round`; several are a DataError)."""
    table, n_long = _policy_rows(view, policy_id, max_length)
    _check_temperature(table, temperature)
    return PolicyRows(table=table, n_dropped_too_long=n_long, round=_round_of(table, round_), data_hash=view_hash(table))
