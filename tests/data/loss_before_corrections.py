"""Writes tests/data/loss_before_corrections.json: the loss and its gradient of each loss kind
on the fixed batch of tests/test_corrections.py (`batch`), computed by the `pipeline` package on
the path. The stored file was made by the loss code of commit 1cf919b, the one before the
staleness corrections landed (a9e6886), so that `correction="none"` is checked against the loss
as it was, not against the code that now computes both:

    git archive 1cf919b | tar -x -C /tmp/before
    PYTHONPATH=/tmp/before python tests/data/loss_before_corrections.py 1cf919b > tests/data/loss_before_corrections.json

Floats are stored as `float.hex`, so the comparison is bit for bit."""

from __future__ import annotations

import json
import sys

import torch

from pipeline.config.loss import LossConfig
from pipeline.learn.loss import LossBatch, compute_loss

LOG_W = [[0.2, 0.2, 0.2], [0.9, 0.1, 0.2], [-0.3, -0.3, -0.3], [1.0, 0.6, 5.0], [-1.0, -0.6, -0.8]]
LENGTHS = [3, 3, 3, 2, 3]
ADV = [1.0, -0.5, 2.0, 1.5, -1.0]
WEIGHT = [1.0, 1.0, 1.0, 2.0, 1.0]
LOGQ = -1.0
KINDS = ("rs", "ppo", "is", "exit")


def batch(old: bool) -> LossBatch:
    """tests/test_corrections.py's `batch(old=old)`: log q = -1, log p_theta = log p_old = -1 + log w."""
    old_logp = torch.tensor([[LOGQ + x for x in row] for row in LOG_W], dtype=torch.float64)
    mask = torch.tensor([[1.0 if t < n else 0.0 for t in range(3)] for n in LENGTHS], dtype=torch.float64)
    return LossBatch(
        logp=old_logp.clone().requires_grad_(True), logq=torch.full((5, 3), LOGQ, dtype=torch.float64), mask=mask,
        advantage=torch.tensor(ADV, dtype=torch.float64), sample_weight=torch.tensor(WEIGHT, dtype=torch.float64),
        reward=torch.tensor([1.0] * 5, dtype=torch.float64), strategy=["iid"] * 5, agent=["solver"] * 5,
        old_logp=old_logp if old else None,
    )


def values(kind: str, old: bool, config: LossConfig | None = None) -> dict:
    b = batch(old)
    out = compute_loss(b, config or LossConfig(kind=kind))
    out.loss.backward()
    return {
        "loss": out.loss.item().hex(),
        "grad": [[b.logp.grad[i, t].item().hex() for t in range(3)] for i in range(5)],
        "n_clipped_tokens": int(out.diagnostics.overall.n_clipped_tokens),
    }


def main() -> None:
    commit = sys.argv[1] if len(sys.argv) > 1 else "unknown"
    table = {kind: {"without_p_old": values(kind, False), "with_p_old": values(kind, True)} for kind in KINDS}
    print(json.dumps({"commit": commit, "losses": table}, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
