"""The sample weights of a training view beyond each row's own: the stratified weights that give
each strategy its share of a policy's rows (`ViewConfig.strategy_weights`), and the balance that
gives each label class (the Verifier's verdicts) the same total weight.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import pyarrow as pa

from pipeline.errors import ConfigError, DataError
from pipeline.learn.view_filters import step_ids_of

__all__ = ["stratified_weights", "balance_weights"]


def stratified_weights(table: pa.Table, weight: np.ndarray, keep: np.ndarray, sampled: np.ndarray, strategy_weights: Mapping[str, float]) -> np.ndarray:
    """Scale the kept rows' weights by w_s * N / n_s per policy (see `ViewConfig.strategy_weights`):
    n_s and N count the `sampled` rows (what the policy's strategies sampled for it to train),
    whether or not the advantage and reward filters then kept them."""
    strat = np.asarray(table.column("strategy").to_pylist(), dtype=object)
    policy = np.asarray(table.column("policy_id").to_pylist(), dtype=object)
    missing = sorted(set(strat[sampled]) - set(strategy_weights))
    if missing:
        raise ConfigError(f"strategy_weights has no weight for strategy {missing} (step_id {step_ids_of(table, sampled & np.isin(strat, missing))})")
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
