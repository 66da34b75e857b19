"""Where a store keeps things: round tables, checkpoints, the project's cache; local folders or
URLs of an fsspec filesystem."""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.errors import ConfigError

__all__ = [
    "BASE_ROUND",
    "LOCAL_PROTOCOLS",
    "is_url",
    "filesystem",
    "protocols",
    "join",
    "exists",
    "round_dir",
    "table_path",
    "checkpoint_dir",
    "cache_root",
    "check_writable",
]

BASE_ROUND = -1
"""The round of the starting checkpoints: their registry entries and their evaluation."""

LOCAL_PROTOCOLS = ("file", "local")
"""fsspec's names of the local filesystem."""


def is_url(path: str | Path) -> bool:
    """True for a URL of an fsspec filesystem (`scheme://...`); local paths are not URLs."""
    return isinstance(path, str) and "://" in path


def filesystem(url: str, flag: str | None = None):
    """(fsspec filesystem, path inside it) of `url`. An unknown scheme, or one whose package is
    not installed (s3fs for s3://, gcsfs for gs://), is a `ConfigError` naming `flag` and the URL."""
    import fsspec
    from fsspec.registry import known_implementations, registry

    scheme = url.split("://", 1)[0]
    label = f"{flag} {url}" if flag else url
    if not scheme or (scheme not in known_implementations and scheme not in registry):
        raise ConfigError(f"{label}: unknown filesystem scheme {scheme!r} (e.g. file, memory, s3, gs)")
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as err:
        raise ConfigError(f"{label}: the {scheme!r} filesystem needs a package that is not installed ({err})") from None


def protocols(fs) -> tuple[str, ...]:
    """The names an fsspec filesystem answers to."""
    return fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)


def join(base: str | Path, *parts: str) -> str | Path:
    """`base` joined with `parts`: a Path for a local folder, a URL string for a URL."""
    if is_url(base):
        return "/".join([str(base).rstrip("/"), *parts])
    return Path(base).joinpath(*parts)


def exists(path: str | Path) -> bool:
    """Whether a table or folder exists, locally or on the URL's filesystem."""
    if is_url(path):
        fs, p = filesystem(path)
        return fs.exists(p)
    return Path(path).exists()


def round_dir(store: str | Path, round_: int) -> Path:
    """`<store>/round=<r>` (a URL string when the store is a URL)."""
    return join(store, f"round={int(round_)}")


def table_path(store: str | Path, round_: int, table: str) -> Path:
    """`<store>/round=<r>/<table>.parquet` (a URL string when the store is a URL)."""
    return join(round_dir(store, round_), f"{table}.parquet")


def checkpoint_dir(store: str | Path, round_: int, policy_id: str) -> Path:
    """The folder of the checkpoint trained for `policy_id` in `round_`."""
    return join(store, "checkpoints", f"round={int(round_)}", policy_id)


def cache_root() -> Path:
    """The project's cache, one per user whatever the working directory: $MAXIT_CACHE_DIR, else
    $XDG_CACHE_HOME/maxit, else ~/.cache/maxit (the XDG base directory rule). Built models,
    URL stores' working copies and cached evaluations live here."""
    explicit = os.environ.get("MAXIT_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg and Path(xdg).expanduser().is_absolute() else Path.home() / ".cache"
    return (base / "maxit").resolve()


def check_writable(path: str | Path, flag: str, kind: str = "file") -> Path:
    """Check, before any work, that `path` can be written, without writing anything. `kind`:
    "file" (a table or report written atomically beside it), "folder" (a store: entries are
    added inside it) or "atomic folder" (a checkpoint: built beside it and renamed into place).
    `path` must not be the other kind of entry, and the folder the new entries go in (or its
    nearest existing ancestor, when it is still to be created) must be a writable folder.
    Raises `ConfigError` naming `flag` and the path."""
    path = Path(path)
    if kind not in ("file", "folder", "atomic folder"):
        raise ValueError(f"kind must be 'file', 'folder' or 'atomic folder', got {kind!r}")
    if kind == "file" and path.is_dir():
        raise ConfigError(f"{flag} {path}: is a folder; give the path of a file")
    if kind != "file" and path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {path}: is an existing file, not a folder")
    parent = path if kind == "folder" and path.exists() else path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{flag} {path}: cannot be created, {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {path}: cannot be written, folder {parent} is not writable")
    return path
