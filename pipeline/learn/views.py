"""Training views: the context swap of expert iteration (docs/ALGORITHMS.md#the-context-swap).

A row of the advantages table holds a completion sampled under `sampling_messages`. Its training
row keeps the completion token ids and their sampling logprobs verbatim (never re-tokenized, never
recomputed) and rebuilds only the context: `strategy.training_messages(sampling_messages, turn,
agent_id)`, rendered with the same chat template (`encode_prompt`). Where the strategy leaves the
messages unchanged, the stored `prompt_ids` are reused as they are (no re-render).

A row enters the view when it is active, has a reward, its strategy trains that (turn, agent),
its sample weight is > 0 and (by default) its advantage is not zero. Rows whose training prompt +
completion exceed `ViewConfig.max_length` are dropped and counted in `ViewStats`, never truncated.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from typing import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.config import ViewConfig
from pipeline.errors import ConfigError, DataError
from pipeline.models.chat import encode_prompt
from schemas import ADVANTAGES, TRAINING_VIEW, TableSchema, to_arrow, validate

__all__ = [
    "ViewConfig",
    "ViewStats",
    "build_training_view",
    "view_hash",
    "to_dataset",
    "check_view",
    "balance_weights",
    "relabel_verdicts",
    "check_verdict_training",
    "verifier_replay",
    "with_verifier_replay",
    "REPLAY_STRATEGY",
]

log = logging.getLogger(__name__)

STATS_METADATA_KEY = b"maxit.view_stats"

INPUT_COLUMNS = (
    "step_id",
    "round",
    "strategy",
    "agent_id",
    "policy_id",
    "turn",
    "active",
    "sampling_messages",
    "prompt_ids",
    "completion_ids",
    "completion_logprobs",
    "reward",
    "advantage",
    "sample_weight",
    "temperature",
)
VIEW_INPUT = TableSchema(
    "advantages (training-view input)",
    pa.schema([ADVANTAGES.schema.field(c) for c in INPUT_COLUMNS]),
    row_id="step_id",
    unique=("step_id",),
)


@dataclass(frozen=True)
class ViewStats:
    """What happened to the input rows (each input row is counted under exactly one reason)."""

    n_input: int = 0
    """Rows of the advantages table given."""
    n_rows: int = 0
    """Rows in the view."""
    n_inactive: int = 0
    """Dropped: inactive."""
    n_null_reward: int = 0
    """Dropped: no reward."""
    n_other_policy: int = 0
    """Dropped: policy not in `ViewConfig.policy_ids`."""
    n_not_trainable: int = 0
    """Dropped: the strategy does not train this (turn, agent) (e.g. feedback's skipped first attempt)."""
    n_zero_weight: int = 0
    """Dropped: sample_weight <= 0."""
    n_zero_advantage: int = 0
    """Dropped: zero advantage (with `drop_zero_advantage`)."""
    n_below_min_reward: int = 0
    """Dropped: reward below `min_reward`."""
    n_too_long: int = 0
    """Dropped: training prompt + completion longer than `max_length` (never truncated)."""
    n_context_swapped: int = 0
    """Rows of the view whose training prompt differs from the sampling prompt."""
    n_rerendered: int = 0
    """Rows whose training context was rendered anew (the others reuse `prompt_ids`)."""
    n_relabeled: int = 0
    """Verifier rows trained on the right verdict instead of their wrong one (`relabel_verdicts`)."""
    by_strategy: Mapping[str, int] = field(default_factory=dict)
    """Rows of the view per strategy."""


def _check_reward_is_local(table: pa.Table) -> None:
    if "local_reward" not in table.column_names:
        raise DataError("the 'rs' view needs the 'local_reward' column (each row's own correctness)")
    reward = table.column("reward").to_numpy(zero_copy_only=False).astype(np.float64)
    local = table.column("local_reward").to_numpy(zero_copy_only=False).astype(np.float64)
    differ = ~np.isnan(reward) & (reward != local)  # null rewards are dropped anyway
    if differ.any():
        raise ConfigError(
            f"the 'rs' loss keeps rows whose own action was right, but 'reward' differs from 'local_reward' in "
            f"{int(differ.sum())} row(s) (step_id {_ids(table, differ)}): the advantages were computed with a global term "
            "mixed in; recompute them with --alpha 0 --local-weight 1 (maxit advantages)"
        )


def _stratified_weights(table: pa.Table, weight: np.ndarray, keep: np.ndarray, sampled: np.ndarray, strategy_weights: Mapping[str, float]) -> np.ndarray:
    """Scale the kept rows' weights by w_s * N / n_s per policy (see `ViewConfig.strategy_weights`):
    n_s and N count the `sampled` rows (what the policy's strategies sampled for it to train),
    whether or not the advantage and reward filters then kept them."""
    strat = np.asarray(table.column("strategy").to_pylist(), dtype=object)
    policy = np.asarray(table.column("policy_id").to_pylist(), dtype=object)
    missing = sorted(set(strat[sampled]) - set(strategy_weights))
    if missing:
        raise ConfigError(f"strategy_weights has no weight for strategy {missing} (step_id {_ids(table, sampled & np.isin(strat, missing))})")
    out = weight.copy()
    for pid in sorted(set(policy[keep])):
        counted = sampled & (policy == pid)
        present = sorted(set(strat[counted]))
        total_w = sum(strategy_weights[s] for s in present)
        n_all = int(counted.sum())
        for s in present:
            idx = keep & (policy == pid) & (strat == s)
            out[idx] *= strategy_weights[s] / total_w * n_all / int((counted & (strat == s)).sum())
    return out


def _ids(table: pa.Table, mask: np.ndarray, limit: int = 10) -> str:
    ids = [table.column("step_id")[int(i)].as_py() for i in np.flatnonzero(mask)[:limit]]
    more = f" and {int(mask.sum()) - limit} more" if int(mask.sum()) > limit else ""
    return ", ".join(repr(i) for i in ids) + more


def _check_lengths(table: pa.Table, ids_col: str, lp_col: str) -> None:
    """Token ids and their logprobs must pair up; NaN logprobs are unusable."""
    n_ids = pc.list_value_length(table.column(ids_col)).to_numpy(zero_copy_only=False)
    n_lp = pc.list_value_length(table.column(lp_col)).to_numpy(zero_copy_only=False)
    bad = n_ids != n_lp
    if bad.any():
        raise DataError(f"{ids_col!r} and {lp_col!r} differ in length in {int(bad.sum())} row(s) (step_id {_ids(table, bad)})")
    empty = n_ids == 0
    if empty.any():
        raise DataError(f"{ids_col!r} is empty in {int(empty.sum())} row(s) (step_id {_ids(table, empty)})")
    flat = pc.list_flatten(table.column(lp_col)).to_numpy(zero_copy_only=False).astype(np.float64)
    if flat.size and not np.isfinite(flat).all():
        owner = np.repeat(np.arange(table.num_rows), n_lp)
        bad_rows = np.zeros(table.num_rows, dtype=bool)
        bad_rows[owner[~np.isfinite(flat)]] = True
        raise DataError(f"{lp_col!r} holds NaN/inf in {int(bad_rows.sum())} row(s) (step_id {_ids(table, bad_rows)})")


def _check_finite(table: pa.Table, col: str) -> None:
    """NaN or infinite values are an error naming the rows (a null, where allowed, is not NaN)."""
    column = table.column(col)
    v = column.to_numpy(zero_copy_only=False).astype(np.float64)
    null = np.asarray(column.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    bad = ~np.isfinite(v) & ~null
    if bad.any():
        raise DataError(f"{col!r} is NaN or infinite in {int(bad.sum())} row(s) (step_id {_ids(table, bad)})")


def build_training_view(
    advantages, strategies: Mapping[str, object], tokenizer, config: ViewConfig = ViewConfig()
) -> tuple[pa.Table, ViewStats]:
    """The training view of an advantages table (pyarrow or Polars) and what was dropped.

    `strategies` maps a strategy id (the `strategy` column) to its Strategy object. The view has
    the `training_view` schema, rows in input order; its `ViewStats` are also kept in the schema
    metadata (key `maxit.view_stats`)."""
    table, n_relabeled = _view_input(advantages, strategies, config)
    keep, sampled, counts = _rows_to_keep(table, strategies, config)
    contexts = _training_contexts(table, keep, strategies, tokenizer, config)
    keep &= ~contexts.too_long
    weight = table.column("sample_weight").to_numpy(zero_copy_only=False).astype(np.float64)
    if config.strategy_weights is not None:
        weight = _stratified_weights(table, weight, keep, sampled, config.strategy_weights)
    kept = table.filter(pa.array(keep))
    view = _view_table(kept, contexts, weight[keep])
    if config.balance_verdicts:
        view, info = balance_weights(view, kept.column("verdict").to_pylist())
        log.info("verifier verdict balance: %s", {str(k): f"{n} rows x {sc:.3f}" for k, (n, sc) in info.items()})
    by_strategy: dict[str, int] = {}
    for s in view.column("strategy").to_pylist():
        by_strategy[s] = by_strategy.get(s, 0) + 1
    stats = ViewStats(
        n_input=table.num_rows,
        n_rows=view.num_rows,
        n_too_long=int(contexts.too_long.sum()),
        n_context_swapped=int(sum(contexts.swapped)),
        n_rerendered=contexts.n_rerendered,
        n_relabeled=n_relabeled,
        by_strategy=by_strategy,
        **counts,
    )
    meta = {STATS_METADATA_KEY: json.dumps(asdict(stats)).encode()}
    view = view.replace_schema_metadata(meta)
    validate(view, TRAINING_VIEW)
    log.info("training view: %s", stats)
    return view, stats


def _view_input(advantages, strategies: Mapping[str, object], config: ViewConfig) -> tuple[pa.Table, int]:
    """The advantages table checked (schema, the columns `config` needs, token ids against their
    logprobs, finite values, a strategy object for every strategy id) and cut to the columns the
    view reads, the Verifier's verdicts relabelled under `relabel_verdicts`; and how many were."""
    table = to_arrow(advantages)
    validate(table, VIEW_INPUT)
    use_verdict = config.balance_verdicts or config.relabel_verdicts
    if use_verdict and "verdict" not in table.column_names:
        what = "balance_verdicts" if config.balance_verdicts else "relabel_verdicts"
        raise DataError(f"{what} needs the 'verdict' column (the Verifier's parsed verdicts, written by the rollouts)")
    if config.reward_is_local:
        _check_reward_is_local(table)
    columns = list(INPUT_COLUMNS) + (["verdict"] if use_verdict else [])
    table = table.select(columns).combine_chunks()
    _check_lengths(table, "completion_ids", "completion_logprobs")
    n_relabeled = 0
    if config.relabel_verdicts:
        table, n_relabeled = relabel_verdicts(table)
    for col in ("advantage", "sample_weight", "reward"):
        _check_finite(table, col)
    strat_col = table.column("strategy").to_pylist()
    unknown = sorted(set(strat_col) - set(strategies))
    if unknown:
        bad = np.array([s in unknown for s in strat_col])
        raise ConfigError(f"no strategy object for strategy id(s) {unknown} (step_id {_ids(table, bad)}); known: {sorted(strategies)}")
    return table, n_relabeled


def _rows_to_keep(table: pa.Table, strategies: Mapping[str, object], config: ViewConfig) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """(the rows that enter the view before the length check, the rows the stratified weights
    count as sampled, the `ViewStats` count of each reason a row was dropped)."""
    n = table.num_rows
    strat_col = table.column("strategy").to_pylist()
    active = table.column("active").to_numpy(zero_copy_only=False).astype(bool)
    has_reward = ~np.asarray(table.column("reward").is_null().to_numpy(zero_copy_only=False), dtype=bool)
    turns = table.column("turn").to_numpy(zero_copy_only=False)
    agents = table.column("agent_id").to_pylist()
    policies = table.column("policy_id").to_pylist()
    weight = table.column("sample_weight").to_numpy(zero_copy_only=False)
    adv = table.column("advantage").to_numpy(zero_copy_only=False)

    in_policy = np.ones(n, dtype=bool) if config.policy_ids is None else np.array([p in config.policy_ids for p in policies], dtype=bool)
    trainable = np.array(
        [s not in config.drop_strategies and bool(strategies[s].trainable(int(t), a)) for s, t, a in zip(strat_col, turns, agents)], dtype=bool
    )
    nonzero = np.abs(adv) > config.zero_advantage_tol if config.drop_zero_advantage else np.ones(n, dtype=bool)

    # each dropped row is counted under the first reason that applies, in this order
    reasons = [
        ("n_inactive", active),
        ("n_null_reward", has_reward),
        ("n_other_policy", in_policy),
        ("n_not_trainable", trainable),
        ("n_zero_weight", weight > 0),
        ("n_zero_advantage", nonzero),
    ]
    if config.min_reward is not None:
        rewards = table.column("reward").to_numpy(zero_copy_only=False).astype(float)
        reasons.append(("n_below_min_reward", np.nan_to_num(rewards, nan=-np.inf) >= config.min_reward))
    keep = np.ones(n, dtype=bool)
    counts: dict[str, int] = {}
    sampled = keep
    for name, ok in reasons:
        counts[name] = int((keep & ~ok).sum())
        keep &= ok
        if name == "n_zero_weight":
            # the stratified weights' n_s counts what a strategy sampled for a policy to train,
            # before the advantage and reward filters (degenerate groups must not shift the mix)
            sampled = keep.copy()
    return keep, sampled, counts


@dataclass(frozen=True)
class _Contexts:
    """The training contexts of the kept rows (`_training_contexts`)."""

    train_prompts: list[list[int]]
    """Training prompt ids of each kept row that fits `max_length`, in table order."""
    swapped: list[bool]
    """Per such row: its training prompt differs from the sampling prompt."""
    n_rerendered: int
    """Rows whose training context was rendered anew."""
    too_long: np.ndarray
    """Per input row: dropped because training prompt + completion exceed `max_length`."""


def _training_contexts(table: pa.Table, keep: np.ndarray, strategies: Mapping[str, object], tokenizer, config: ViewConfig) -> _Contexts:
    """The context swap: each kept row's training context rebuilt through its strategy (the
    stored `prompt_ids` reused where the messages are unchanged), rows then too long dropped."""
    strat_col = table.column("strategy").to_pylist()
    turns = table.column("turn").to_numpy(zero_copy_only=False)
    agents = table.column("agent_id").to_pylist()
    messages_col = table.column("sampling_messages")
    prompt_col = table.column("prompt_ids")
    step_ids = table.column("step_id").to_pylist()
    n_completion = pc.list_value_length(table.column("completion_ids")).to_numpy(zero_copy_only=False)
    train_prompts: list[list[int]] = []
    swapped: list[bool] = []
    n_rerendered = 0
    too_long = np.zeros(table.num_rows, dtype=bool)
    for i in np.flatnonzero(keep):
        i, step_id = int(i), step_ids[int(i)]
        sampling = messages_col[i].as_py()
        try:
            training = strategies[strat_col[i]].training_messages(sampling, int(turns[i]), agents[i])
        except DataError as err:
            raise DataError(f"training context of step_id {step_id!r} (strategy {strat_col[i]!r}): {err}") from None
        stored = prompt_col[i].as_py()
        ids, rerendered = _training_prompt(training, sampling, stored, tokenizer, config, step_id)
        n_rerendered += rerendered
        if config.max_length is not None and len(ids) + int(n_completion[i]) > config.max_length:
            too_long[i] = True
            continue
        train_prompts.append(ids)
        swapped.append(ids != stored)
    if too_long.any():
        log.warning(
            "training view: dropped %d row(s) longer than max_length=%d (step_id %s)",
            int(too_long.sum()), config.max_length, _ids(table, too_long),
        )
    return _Contexts(train_prompts=train_prompts, swapped=swapped, n_rerendered=n_rerendered, too_long=too_long)


def _training_prompt(training, sampling, stored: list[int], tokenizer, config: ViewConfig, step_id) -> tuple[list[int], bool]:
    """(the prompt ids of the `training` messages, whether they were rendered anew): the stored
    sampling prompt when the messages are the sampling ones (checked by rendering them under
    `check_identity_render`), else the messages rendered with the chat template."""
    if [(m["role"], m["content"]) for m in training] != [(m["role"], m["content"]) for m in sampling]:
        return encode_prompt(tokenizer, training), True
    if config.check_identity_render and encode_prompt(tokenizer, training) != stored:
        raise DataError(
            f"re-rendering the sampling messages of step_id {step_id!r} gives "
            f"prompt ids that differ from 'prompt_ids': the tokenizer or chat template is not the sampling one"
        )
    return stored, False


def _view_table(kept: pa.Table, contexts: _Contexts, weight: np.ndarray) -> pa.Table:
    """The view's columns of the `kept` rows, their training prompts and sample weights."""
    view = pa.table(
        {
            "step_id": kept.column("step_id"),
            "policy_id": kept.column("policy_id"),
            "agent_id": kept.column("agent_id"),
            "strategy": kept.column("strategy"),
            "train_prompt_ids": pa.array(contexts.train_prompts, type=pa.list_(pa.int32())),
            "completion_ids": kept.column("completion_ids").cast(pa.list_(pa.int32())),
            "sampling_logprobs": kept.column("completion_logprobs").cast(pa.list_(pa.float32())),
            "advantage": kept.column("advantage"),
            "sample_weight": pa.array(weight, type=pa.float64()),
            "reward": kept.column("reward"),
            "context_swapped": pa.array(contexts.swapped, type=pa.bool_()),
            "round": kept.column("round"),
            "turn": kept.column("turn"),
            "temperature": kept.column("temperature"),
        }
    )
    return view.cast(TRAINING_VIEW.schema)


def check_verdict_training(task, config: ViewConfig) -> None:
    """Refuse `relabel_verdicts` / `verifier_replay` for a task whose Verifier answers the problem
    itself (`task.verdict_reads_solution`, verdict style "compare"): both train the Verifier on
    another row's reply for the right verdict, a yes/no reply such a Verifier never writes (for it
    the reply is an answer of that problem)."""
    if not getattr(task, "verdict_reads_solution", False):
        return
    for flag, on in (("--relabel-verdicts", config.relabel_verdicts), ("--verifier-replay", config.verifier_replay)):
        if on:
            raise ConfigError(f"{flag} trains the Verifier on yes/no replies, but this task's Verifier answers the problem itself "
                              "and its verdict is read by comparing answers (prompt verdict style 'compare'); drop the flag or use a yes/no verdict style")


def relabel_verdicts(table: pa.Table) -> tuple[pa.Table, int]:
    """`table` with every row whose parsable verdict was wrong (reward 0; math: the Verifier's)
    turned into a row of the right verdict: completion ids and logprobs of the most common
    completion among the same agent's rows whose verdict of that kind was right, reward 1, verdict flipped. A kind no row got right
    this round has no completion to take and its wrong rows stay as they are. Returns the table
    and the number of rows relabelled (see `ViewConfig.relabel_verdicts`)."""
    agents = table.column("agent_id").to_pylist()
    verdicts = table.column("verdict").to_pylist()
    rewards = table.column("reward").to_pylist()
    completions = table.column("completion_ids").to_pylist()
    logprobs = table.column("completion_logprobs").to_pylist()
    # per agent that gives verdicts (the rows with a parsed verdict), per verdict
    counts: dict[tuple[str, bool], dict[tuple, int]] = {}
    first: dict[tuple, int] = {}
    for i, (a, v, r) in enumerate(zip(agents, verdicts, rewards)):
        if v is not None and r is not None and r >= 1.0:
            key = tuple(completions[i])
            kind = counts.setdefault((a, v), {})
            kind[key] = kind.get(key, 0) + 1
            first.setdefault(key, i)
    canonical = {k: first[max(c, key=lambda t: (c[t], -first[t]))] for k, c in counts.items() if c}
    changed = [
        i for i, (a, v, r) in enumerate(zip(agents, verdicts, rewards))
        if v is not None and r is not None and r < 1.0 and (a, not v) in canonical
    ]
    if not changed:
        return table, 0
    for i in changed:
        src = canonical[(agents[i], not verdicts[i])]
        completions[i], logprobs[i] = completions[src], logprobs[src]
        verdicts[i], rewards[i] = not verdicts[i], 1.0
    for name, values in (("completion_ids", completions), ("completion_logprobs", logprobs), ("verdict", verdicts), ("reward", rewards)):
        idx = table.schema.get_field_index(name)
        table = table.set_column(idx, table.schema.field(idx), pa.array(values, type=table.schema.field(idx).type))
    return table, len(changed)


def balance_weights(view: pa.Table, labels) -> tuple[pa.Table, dict]:
    """Scale `sample_weight` so that every class of `labels` carries the same total weight.

    `labels` holds one label per view row (e.g. the Verifier's verdict, yes/no); rows labelled
    None keep their weight. The labelled rows' total weight is unchanged: a class with total
    weight W_c among K classes is scaled by (sum_c W_c / K) / W_c. Returns the new view and
    {label: (rows, scale)} for logging. With one class (or none) nothing changes."""
    labels = list(labels)
    if len(labels) != view.num_rows:
        raise DataError(f"balance_weights: {len(labels)} labels for {view.num_rows} view rows")
    weight = view.column("sample_weight").to_numpy(zero_copy_only=False).astype(np.float64)
    classes: dict = {}
    for i, lab in enumerate(labels):
        if lab is not None:
            classes.setdefault(lab, []).append(i)
    totals = {lab: float(weight[idx].sum()) for lab, idx in classes.items()}
    live = {lab: t for lab, t in totals.items() if t > 0}
    info = {lab: (len(classes[lab]), 1.0) for lab in classes}
    if len(live) < 2:
        return view, info
    target = sum(live.values()) / len(live)
    new = weight.copy()
    for lab, t in live.items():
        scale = target / t
        new[classes[lab]] *= scale
        info[lab] = (len(classes[lab]), scale)
    col = view.schema.get_field_index("sample_weight")
    view = view.set_column(col, view.schema.field(col), pa.array(new, type=pa.float64()))
    return view, info


def check_view(view) -> pa.Table:
    """Validate a training view (schema, and ids/logprobs lengths per row); return it as Arrow."""
    table = to_arrow(view)
    validate(table, TRAINING_VIEW)
    _check_lengths(table.combine_chunks(), "completion_ids", "sampling_logprobs")
    for col in ("advantage", "sample_weight"):
        _check_finite(table, col)
    lengths = pc.list_value_length(table.column("train_prompt_ids")).to_numpy(zero_copy_only=False)
    if (lengths == 0).any():
        raise DataError(f"'train_prompt_ids' is empty in step_id {_ids(table, lengths == 0)}")
    return table


def to_dataset(view):
    """A `datasets.Dataset` over the view's Arrow table (no copy through Python objects)."""
    from datasets import Dataset
    from datasets.table import InMemoryTable

    table = to_arrow(view)
    return Dataset(InMemoryTable(table.replace_schema_metadata(None)))


def view_hash(view) -> str:
    """A content hash of a view's rows (its `training_view` columns, rows ordered by step_id),
    independent of row order, chunking and extra columns: the `data hash` of a checkpoint."""
    import hashlib

    table = to_arrow(view).select([f.name for f in TRAINING_VIEW.schema]).combine_chunks()
    table = table.take(pc.sort_indices(table, sort_keys=[("step_id", "ascending")]))
    h = hashlib.blake2b(digest_size=16)
    h.update(str(table.num_rows).encode())
    for f in TRAINING_VIEW.schema:
        col = table.column(f.name)
        h.update(f.name.encode() + b"\x00")
        if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
            h.update(pc.list_value_length(col).to_numpy(zero_copy_only=False).astype(np.int64).tobytes())
            dtype = np.int64 if pa.types.is_integer(col.type.value_type) else np.float64
            h.update(pc.list_flatten(col).to_numpy(zero_copy_only=False).astype(dtype).tobytes())
        elif pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            h.update("\x00".join(col.to_pylist()).encode())
        else:
            h.update(np.asarray(col.is_null().to_numpy(zero_copy_only=False), dtype=bool).tobytes())
            h.update(col.cast(pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False).tobytes())
    return h.hexdigest()


REPLAY_STRATEGY = "replay"
"""Strategy id of the Verifier's replay rows in a training view (trained by their NLL)."""


def verifier_replay(tables, strategies: Mapping[str, object], tokenizer, config: ViewConfig = ViewConfig()) -> tuple[pa.Table, int]:
    """The Verifier's hindsight-labelled replay as training-view rows (see `ViewConfig.verifier_replay`).

    `tables`: advantages tables (pyarrow or Polars), newest first (this round's, then earlier
    rounds'). Every active Verifier call with a parsed verdict and a known local reward (was its
    verdict right?) becomes a row of the right verdict: its own completion where it was right,
    else the most common right completion of the other verdict (`relabel_verdicts`); one row per
    (policy, training prompt), the newest; "yes" and "no" rows balanced to equal total weight.
    The rows keep their step id (unique across rounds: it carries the round), round, turn and
    temperature, and get reward 1, advantage 1 and strategy `REPLAY_STRATEGY`. Returns (rows,
    number relabelled)."""
    columns = list(INPUT_COLUMNS) + ["verdict", "local_reward"]
    parts = []
    for t in tables:
        t = to_arrow(t)
        missing = [c for c in ("verdict", "local_reward") if c not in t.column_names]
        if missing:
            raise DataError(f"verifier_replay needs the {missing} column(s) of the advantages table")
        parts.append(t.select(columns).cast(pa.schema([t.schema.field(c) for c in columns])))
    if not parts:
        return TRAINING_VIEW.schema.empty_table(), 0
    table = pa.concat_tables(parts, promote_options="permissive").combine_chunks()
    verdict = table.column("verdict")
    local = table.column("local_reward")
    keep = pc.and_(
        pc.and_(pc.is_valid(verdict), pc.is_valid(local)),
        pc.fill_null(table.column("active"), False),
    )
    table = table.filter(keep)
    # the reward of a replay row is its verdict's own correctness, whatever the run mixed in
    table = table.set_column(table.schema.get_field_index("reward"), "reward", pc.cast(table.column("local_reward"), pa.float64()))
    table, n_relabeled = relabel_verdicts(table)
    right = pc.greater_equal(table.column("reward"), 1.0)
    table = table.filter(right)  # a verdict kind never right in the window has no completion to learn
    n = table.num_rows
    table = table.set_column(table.schema.get_field_index("advantage"), "advantage", pa.array(np.ones(n), pa.float64()))
    table = table.set_column(table.schema.get_field_index("sample_weight"), "sample_weight", pa.array(np.ones(n), pa.float64()))
    view, _ = build_training_view(
        table.drop_columns(["local_reward"]),
        strategies,
        tokenizer,
        ViewConfig(max_length=config.max_length, drop_zero_advantage=False, policy_ids=config.policy_ids),
    )
    verdict_of = dict(zip(table.column("step_id").to_pylist(), table.column("verdict").to_pylist()))
    # one row per (policy, training prompt): the first, i.e. the newest round's
    seen: set = set()
    first = []
    for i, (pid, ids) in enumerate(zip(view.column("policy_id").to_pylist(), view.column("train_prompt_ids").to_pylist())):
        key = (pid, tuple(ids))
        if key not in seen:
            seen.add(key)
            first.append(i)
    view = view.take(pa.array(first, pa.int64()))
    view = view.set_column(view.schema.get_field_index("strategy"), view.schema.field("strategy"), pa.array([REPLAY_STRATEGY] * view.num_rows, pa.string()))
    out = []
    for pid in sorted(set(view.column("policy_id").to_pylist())):
        part = view.filter(pc.equal(view.column("policy_id"), pid))
        part, _ = balance_weights(part, [verdict_of[s] for s in part.column("step_id").to_pylist()])
        out.append(part)
    view = pa.concat_tables(out) if out else view
    return view.replace_schema_metadata(None).cast(TRAINING_VIEW.schema), n_relabeled


def with_verifier_replay(view: pa.Table, replay: pa.Table, verifier_id: str) -> pa.Table:
    """`view` with its own Verifier rows replaced by the replay rows (same schema, metadata kept)."""
    meta = view.schema.metadata
    own = view.filter(pc.not_equal(view.column("agent_id"), verifier_id))
    out = pa.concat_tables([own.replace_schema_metadata(None), replay.cast(own.schema.remove_metadata())])
    out = out.replace_schema_metadata(meta)
    validate(out, TRAINING_VIEW)
    return out
