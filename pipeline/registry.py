"""Which checkpoint each policy has after each round.

Round r trains from `latest(policy_id, before_round=r)` (normally round r-1's checkpoint); round -1
is the base model (`base(...)`). Each entry is one small JSON file,
`<store>/checkpoints/registry/round=<r>/<policy_id>.json`, written atomically: two policies of a
round registered by parallel processes never overwrite each other, and re-running a round
replaces its entry. (Dagster rejects an asset partition that depends on its own previous
partition, so rounds read their parent checkpoint here rather than through the asset graph.)
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Mapping

from pipeline.errors import DataError
from pipeline.store import atomic_write_text

__all__ = ["BASE_ROUND", "CheckpointRecord", "PolicyRegistry"]

BASE_ROUND = -1
_POLICY_ID = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass(frozen=True)
class CheckpointRecord:
    """One registered checkpoint."""

    round: int
    """Round whose training produced it (-1 = the base model)."""
    policy_id: str
    """Policy it belongs to."""
    path: str
    """Checkpoint folder (an HF model directory)."""
    parent: str | None
    """Checkpoint it was trained from (None for the base)."""
    data_hash: str | None
    """Hash of the training-view rows it was trained on (None for the base)."""
    created: str
    """UTC time of registration (ISO 8601)."""
    metrics: Mapping[str, float] = field(default_factory=dict)
    """Training metrics worth keeping beside the entry."""


class PolicyRegistry:
    """Checkpoint entries per (round, policy_id) under `<store_dir>/checkpoints/registry/`."""

    def __init__(self, store_dir: str | Path):
        self.store_dir = Path(store_dir)
        self.root = self.store_dir / "checkpoints" / "registry"

    def _entry(self, round_: int, policy_id: str) -> Path:
        return self.root / f"round={int(round_)}" / f"{policy_id}.json"

    def register(
        self,
        round_: int,
        policy_id: str,
        path: str | Path,
        parent: str | Path | None = None,
        data_hash: str | None = None,
        metrics: Mapping[str, float] | None = None,
    ) -> CheckpointRecord:
        """Record that `policy_id` has the checkpoint `path` after round `round_` (replacing an
        earlier entry of the same round and policy)."""
        if not _POLICY_ID.match(policy_id or ""):
            raise ValueError(f"policy_id must match {_POLICY_ID.pattern}, got {policy_id!r}")
        if int(round_) < BASE_ROUND:
            raise ValueError(f"round must be >= {BASE_ROUND}, got {round_}")
        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(f"cannot register {policy_id!r} round {round_}: no checkpoint folder at {path}")
        record = CheckpointRecord(
            round=int(round_),
            policy_id=policy_id,
            path=str(path.resolve()),
            parent=None if parent is None else str(Path(parent).resolve()),
            data_hash=data_hash,
            created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            metrics={k: float(v) for k, v in (metrics or {}).items()},
        )
        body = {f.name: getattr(record, f.name) for f in fields(record)}
        atomic_write_text(self._entry(round_, policy_id), json.dumps(body, indent=2, sort_keys=True))
        return record

    def base(self, policy_id: str, path: str | Path) -> CheckpointRecord:
        """Register the initial model of `policy_id` (round -1)."""
        return self.register(BASE_ROUND, policy_id, path)

    def get(self, round_: int, policy_id: str) -> CheckpointRecord | None:
        """The entry of (round, policy), or None."""
        entry = self._entry(round_, policy_id)
        if not entry.exists():
            return None
        try:
            return CheckpointRecord(**json.loads(entry.read_text()))
        except (json.JSONDecodeError, TypeError) as err:
            raise DataError(f"registry entry {entry} is unreadable: {err}") from err

    def records(self, policy_id: str | None = None) -> list[CheckpointRecord]:
        """Every entry (of one policy, if given), by round then policy."""
        out = []
        for entry in self.root.glob("round=*/*.json"):
            pid = entry.stem
            if policy_id is not None and pid != policy_id:
                continue
            rec = self.get(int(entry.parent.name.split("=", 1)[1]), pid)
            if rec is not None:
                out.append(rec)
        return sorted(out, key=lambda r: (r.round, r.policy_id))

    def latest_record(self, policy_id: str, before_round: int) -> CheckpointRecord | None:
        """The entry of `policy_id` with the highest round < `before_round`, or None."""
        earlier = [r for r in self.records(policy_id) if r.round < before_round]
        return earlier[-1] if earlier else None

    def latest(self, policy_id: str, before_round: int) -> Path | None:
        """The checkpoint round `before_round` of `policy_id` starts from (the latest earlier
        round's, the base model's for round 0), or None when nothing is registered. A registered
        folder that has disappeared is an error, not a silent fall-back to an older round."""
        rec = self.latest_record(policy_id, before_round)
        if rec is None:
            return None
        path = Path(rec.path)
        if not path.is_dir():
            raise FileNotFoundError(f"registry: checkpoint of {policy_id!r} round {rec.round} is missing at {path}")
        return path
