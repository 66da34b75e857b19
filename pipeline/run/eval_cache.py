"""The starting model's evaluation (round -1), computed once per model, task and evaluation and
reused by every run that would compute the same rows.

A run's round -1 evaluates the starting checkpoints on the held-out problems, which depend on
neither the run's seed nor its training settings (the evaluation has its own fixed seed), so runs
of several seeds, presets or learning rates on one model and task would each spend the same
minutes on the same rows. `base_evaluation_key` names everything the rows can depend on: the
starting checkpoints' bytes, the workflow and its options, the task (and the bytes of a task or
prompt file), the evaluation settings and sampling temperature, the engine and its options, the
hardware's bf16, the versions of torch, transformers and vLLM, and the source of maxit itself (any
change to the code is a new key). Anything not named is what a run trains with, which round -1
never sees. The rows are kept as `<cache>/evaluations/<key>.parquet` (`pipeline.store.cache_root`),
written atomically; `maxit run --no-base-eval-cache` computes afresh and leaves the cache alone.
"""

from __future__ import annotations

import hashlib
import json
import logging
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping

import polars as pl

from pipeline import store as st
from schemas import EVALUATION, validate

__all__ = ["base_evaluation_key", "cache_path", "load", "save", "directory_digest"]

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
"""The checkout (or installed tree) holding `pipeline/` and `schemas/`, whose source `code_digest` hashes."""


def directory_digest(path: str | Path) -> str:
    """sha256 over a checkpoint directory's files (their relative names and bytes, in name order);
    a single file is hashed alone."""
    path = Path(path)
    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        h.update(str(f.relative_to(path) if path.is_dir() else f.name).encode() + b"\0")
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
    return h.hexdigest()


@lru_cache(maxsize=1)
def code_digest() -> str:
    """sha256 over maxit's own source (`pipeline/`, `schemas/`): any change to the code is a new key."""
    h = hashlib.sha256()
    for package in ("pipeline", "schemas"):
        if not (ROOT / package).is_dir():  # a digest of nothing would let every change reuse stale rows
            raise RuntimeError(f"eval cache: no {package}/ under {ROOT} to hash")
        for f in sorted((ROOT / package).rglob("*.py")):
            h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def base_evaluation_key(config, checkpoints: Mapping[str, Path], evaluation, engine_options: Mapping[str, Any]) -> str:
    """The cache key of a run's round -1 evaluation: `config` (a `RunConfig`), the starting
    `checkpoints` (policy_id -> directory), the `EvalConfig` it runs with and its engine pool's
    options."""
    from pipeline.engines.config import cpu_has_bf16

    files = {name: getattr(config, name) for name in ("task_file", "prompt_file")}
    lora = getattr(config.train, "lora", None)
    parts = {
        "checkpoints": {pid: directory_digest(path) for pid, path in sorted(checkpoints.items())},
        "workflow": config.workflow,
        "workflow_options": st.jsonable(dict(config.workflow_options)),
        "task": config.task,
        "files": {name: directory_digest(path) if path else None for name, path in files.items()},
        "max_loop_num": config.max_loop_num,
        "shared_policy": config.shared_policy,
        "evaluation": st.jsonable(evaluation),
        "engine": config.engine,
        "engine_options": st.jsonable(dict(engine_options)),
        "lora_rank": int(lora.r) if lora is not None else None,
        "cpu_bf16": cpu_has_bf16(),
        "versions": {name: _version(name) for name in ("torch", "transformers", "vllm")},
        "code": code_digest(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def cache_path(key: str, cache_dir: str | Path | None = None) -> Path:
    return (Path(cache_dir) if cache_dir is not None else st.cache_root()) / "evaluations" / f"{key}.parquet"


def load(key: str, cache_dir: str | Path | None = None) -> pl.DataFrame | None:
    """The cached round -1 rows of `key`, or None (none kept, or a file that does not read as the
    `evaluation` table: it is named in the log and computed afresh)."""
    path = cache_path(key, cache_dir)
    if not path.is_file():
        return None
    try:
        return validate(pl.read_parquet(path), EVALUATION)
    except Exception as exc:  # a damaged cache entry costs a recomputation, never a wrong baseline
        log.warning("round -1 evaluation cache %s does not read (%s): evaluating afresh", path, exc)
        return None


def save(key: str, frame: pl.DataFrame, cache_dir: str | Path | None = None) -> Path | None:
    """Keep `frame` as `key`'s rows (atomically); a cache that cannot be written (read-only, full)
    is named in the log and the run goes on: the rows are in the run's store either way."""
    path = cache_path(key, cache_dir)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return st.write_table(frame, path, EVALUATION)
    except OSError as exc:
        log.warning("round -1 evaluation not kept in the cache %s: %s", path, exc)
        return None
