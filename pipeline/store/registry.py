"""Which checkpoint each policy has after each round.

Round r trains from `latest(policy_id, before_round=r)` (normally round r-1's checkpoint); round -1
is the base model (`base(...)`). Each entry is one small JSON file,
`<store>/checkpoints/registry/round=<r>/<policy_id>.json`, written atomically: two policies of a
round registered by parallel processes never overwrite each other, and re-running a round
replaces its entry. (Dagster rejects an asset partition that depends on its own previous
partition, so rounds read their parent checkpoint here rather than through the asset graph.)

On a URL store (`s3://bucket/run`, `memory://run`, ...) the entries are objects at the same keys
under the URL, and the URL is the registry of record. Registering round r's checkpoint uploads
its folder to `<url>/checkpoints/round=<r>/<policy_id>/` (files first, `maxit_checkpoint.json`
last), then writes the entry (one object) pointing at that URL; the entry is what makes the
checkpoint exist. Records are returned with `path` = the checkpoint's folder in the store's local
working copy (`pipeline.store.working_copy`), which `get` and `latest` fetch from the URL when it
is missing or another version (the engines and the trainer load local folders). The base model
(round -1) is not uploaded: its entry keeps the local folder it was registered with.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Mapping

from pipeline.errors import DataError
from pipeline.store.atomic import atomic_write_text
from pipeline.store.lease import verify as verify_lease
from pipeline.store.paths import BASE_ROUND, checkpoint_dir, filesystem, is_url
from pipeline.store.url import canonical_url, fetch_dir, upload_dir, working_copy, write_bytes

__all__ = ["BASE_ROUND", "CheckpointRecord", "PolicyRegistry"]

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
    """Checkpoint entries per (round, policy_id) under `<store_dir>/checkpoints/registry/`
    (`store_dir` a folder, or a URL: see the module's doc)."""

    def __init__(self, store_dir: str | Path, local: str | Path | None = None):
        self.url = canonical_url(str(store_dir)) if is_url(store_dir) else None
        if self.url is not None:
            self.fs, base = filesystem(self.url)
            self.remote_root = f"{base.rstrip('/')}/checkpoints/registry"
            # the working copy: where checkpoints are fetched to and trained into
            self.store_dir = Path(local) if local is not None else working_copy(self.url)
        else:
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
        stored_path = str(path.resolve())
        if self.url is not None:
            verify_lease(self.url)  # a writer whose lease was taken over stops here
        if self.url is not None and int(round_) != BASE_ROUND:
            # the folder first (its marker last), then the entry: an entry never points at a half-upload
            stored_path = str(checkpoint_dir(self.url, round_, policy_id))
            upload_dir(path, stored_path)
        record = CheckpointRecord(
            round=int(round_),
            policy_id=policy_id,
            path=stored_path,
            parent=None if parent is None else self._stored(parent),
            data_hash=data_hash,
            created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            metrics={k: float(v) for k, v in (metrics or {}).items()},
        )
        body = {f.name: getattr(record, f.name) for f in fields(record)}
        text = json.dumps(body, indent=2, sort_keys=True)
        if self.url is not None:
            write_bytes(self._remote_url(round_, policy_id), text.encode())  # one object, one upload
            return self._local_view(record)
        atomic_write_text(self._entry(round_, policy_id), text)
        return record

    # -- a URL store -------------------------------------------------------------------------
    def _remote_entry(self, round_: int, policy_id: str) -> str:
        return f"{self.remote_root}/round={int(round_)}/{policy_id}.json"

    def _remote_url(self, round_: int, policy_id: str) -> str:
        return f"{self.url}/checkpoints/registry/round={int(round_)}/{policy_id}.json"

    def _stored(self, path: str | Path) -> str:
        """How an entry names a folder: on a URL store, a folder of the working copy's
        checkpoints by its URL (the same place in the store of record), anything else by its
        absolute local path."""
        if is_url(path):
            return str(path)
        path = Path(path).resolve()
        if self.url is not None:
            checkpoints = (self.store_dir / "checkpoints").resolve()
            if path.is_relative_to(checkpoints):
                return f"{self.url}/checkpoints/{path.relative_to(checkpoints).as_posix()}"
        return str(path)

    def _local(self, stored: str | None) -> str | None:
        """The working-copy folder of a checkpoint an entry names by its URL."""
        if stored is None or self.url is None or not stored.startswith(self.url + "/checkpoints/"):
            return stored
        return str(self.store_dir / "checkpoints" / stored[len(self.url) + len("/checkpoints/") :])

    def _local_view(self, record: CheckpointRecord) -> CheckpointRecord:
        from dataclasses import replace

        return replace(record, path=self._local(record.path), parent=self._local(record.parent))

    def _fetch(self, record: CheckpointRecord) -> CheckpointRecord:
        """On a URL store: make sure the working copy holds the record's checkpoint (downloaded
        when missing or another version: its marker file differs from the URL's)."""
        if self.url is None or record.round == BASE_ROUND:
            return record
        fetch_dir(str(checkpoint_dir(self.url, record.round, record.policy_id)), record.path)
        return record

    def _read(self, round_: int, policy_id: str) -> CheckpointRecord | None:
        if self.url is not None:
            entry = self._remote_entry(round_, policy_id)
            try:
                text = self.fs.cat_file(entry).decode()
            except FileNotFoundError:
                return None
        else:
            entry = self._entry(round_, policy_id)
            if not entry.exists():
                return None
            text = entry.read_text()
        try:
            record = CheckpointRecord(**json.loads(text))
        except (json.JSONDecodeError, TypeError) as err:
            raise DataError(f"registry entry {entry} is unreadable: {err}") from err
        return self._local_view(record) if self.url is not None else record

    def _entries(self) -> list[tuple[int, str]]:
        """(round, policy_id) of every entry."""
        if self.url is not None:
            self.fs.invalidate_cache(self.remote_root)  # another machine may have registered since
            names = self.fs.glob(f"{self.remote_root}/round=*/*.json") if self.fs.exists(self.remote_root) else []
            pairs = [(n.rsplit("/", 2)[-2], n.rsplit("/", 1)[-1][: -len(".json")]) for n in names]
        else:
            pairs = [(e.parent.name, e.stem) for e in self.root.glob("round=*/*.json")]
        return [(int(folder.split("=", 1)[1]), pid) for folder, pid in pairs]

    def base(self, policy_id: str, path: str | Path) -> CheckpointRecord:
        """Register the initial model of `policy_id` (round -1)."""
        return self.register(BASE_ROUND, policy_id, path)

    def get(self, round_: int, policy_id: str) -> CheckpointRecord | None:
        """The entry of (round, policy), or None (on a URL store, its checkpoint fetched to the
        working copy)."""
        record = self._read(round_, policy_id)
        return None if record is None else self._fetch(record)

    def records(self, policy_id: str | None = None) -> list[CheckpointRecord]:
        """Every entry (of one policy, if given), by round then policy (nothing is fetched)."""
        out = []
        for r, pid in self._entries():
            if policy_id is not None and pid != policy_id:
                continue
            rec = self._read(r, pid)
            if rec is not None:
                out.append(rec)
        return sorted(out, key=lambda r: (r.round, r.policy_id))

    def round_of(self, policy_id: str, path: str | Path) -> int | None:
        """The latest round whose entry of `policy_id` names the checkpoint `path` (a local folder
        of the working copy or of the store), or None when no entry does."""
        stored = self._stored(path)  # entries of a URL store are read as working-copy folders: compare as stored
        rounds = [rec.round for rec in self.records(policy_id) if self._stored(rec.path) == stored]
        return rounds[-1] if rounds else None

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
        path = Path(self._fetch(rec).path)
        if not path.is_dir():
            raise FileNotFoundError(f"registry: checkpoint of {policy_id!r} round {rec.round} is missing at {path}")
        return path
