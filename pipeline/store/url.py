"""Stores at URLs of fsspec filesystems (`s3://bucket/run`, `gs://bucket/run`, `memory://run`;
`file://` is the local filesystem).

A table is one object written in one upload (`write_bytes`: atomic on s3 and gs, whose PUT or
completed multipart upload is seen whole or not at all, and on fsspec's memory filesystem, which
commits a file on close; there is no rename to make it so elsewhere). Checkpoints are uploaded
file by file with their marker file last (`upload_dir`) and read through a local cache copy
(`local_copy`), since the engines and the trainer load local folders. `UrlStore` keeps a URL
store's local working copy in step with it."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import re
import shutil
from collections.abc import Mapping
from pathlib import Path

from pipeline.errors import ConfigError, DataError
from pipeline.store.atomic import atomic_dir, atomic_write, atomic_write_bytes, atomic_write_text
from pipeline.store.lease import verify as verify_lease
from pipeline.store.paths import LOCAL_PROTOCOLS, cache_root, check_writable, filesystem, is_url, protocols

__all__ = ["write_bytes", "upload_dir", "local_copy", "fetch_dir", "canonical_url", "working_copy", "check_store_url", "UrlStore", "SYNC_MANIFEST", "SYNC_LOCK", "url_of_working_copy"]


def write_bytes(url: str, body: bytes) -> str:
    """`body` as the object (file) at `url`, all or nothing: one `open(..., "wb")` whose close
    commits it (one PUT or completed multipart upload on s3/gs, a file committed on close on
    fsspec's memory filesystem); on the local filesystem (`file://`) a temporary sibling, fsync
    and rename."""
    fs, p = filesystem(url)
    if any(proto in LOCAL_PROTOCOLS for proto in protocols(fs)):
        atomic_write_bytes(p, body)
        return url
    parent = p.rsplit("/", 1)[0]
    if parent:
        fs.makedirs(parent, exist_ok=True)
    with fs.open(p, "wb") as fh:
        fh.write(body)
    return url


def upload_dir(local: str | Path, url: str, marker: str = "maxit_checkpoint.json") -> str:
    """Copy the folder `local` to `url` file by file, `marker` (the checkpoint's own record) last,
    so a reader that finds the marker finds every other file. An object store has no folder
    rename: an interrupted upload leaves files without the marker, which `local_copy` refuses.
    A folder already at `url` (an earlier upload) is deleted first, its marker before its other
    files, so no reader sees the old marker beside new files.
    A local `url` (a path, or a `file://` URL) is written with `atomic_dir` instead."""
    local = Path(local)
    fs, base = filesystem(url) if is_url(url) else (None, str(url))
    if fs is None or any(p in LOCAL_PROTOCOLS for p in protocols(fs)):
        with atomic_dir(base) as tmp:
            shutil.copytree(local, tmp, dirs_exist_ok=True)
        return str(url)
    base = base.rstrip("/")
    if fs.exists(base):  # an earlier upload: it stops being a checkpoint (marker first), then goes
        if fs.exists(f"{base}/{marker}"):
            fs.rm(f"{base}/{marker}")
        fs.rm(base, recursive=True)
    files = sorted(p for p in local.rglob("*") if p.is_file())
    files.sort(key=lambda p: p.name == marker)  # the marker last
    for f in files:
        target = f"{base}/{f.relative_to(local).as_posix()}"
        parent = target.rsplit("/", 1)[0]
        fs.makedirs(parent, exist_ok=True)
        with open(f, "rb") as src, fs.open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)
    return url


def local_copy(url: str | Path, cache: str | Path, marker: str | None = "maxit_checkpoint.json") -> Path:
    """A local folder holding the folder at `url` (the engines and the trainer load local
    folders): `url` itself when it is local, else a copy under `cache` (one folder per URL, made
    atomically, reused while its marker file matches the URL's). With `marker`, a folder without
    it (an upload still under way or interrupted) is a `DataError`."""
    if not is_url(url):
        return Path(url)
    target = Path(cache) / hashlib.blake2b(str(url).encode(), digest_size=8).hexdigest()
    return fetch_dir(str(url), target, marker)


def fetch_dir(url: str, target: str | Path, marker: str | None = "maxit_checkpoint.json") -> Path:
    """Download the folder at `url` to the local folder `target`, atomically (`atomic_dir`), and
    return `target`. A `target` that already holds it is kept: with `marker`, when its marker file
    has the same bytes as the URL's (a checkpoint records its creation time there); without, when
    it exists. With `marker`, a folder at `url` without it (an upload still under way or
    interrupted) is a `DataError`."""
    fs, base = filesystem(str(url))
    base = base.rstrip("/")
    target = Path(target)
    if marker is not None:
        try:
            remote_marker = fs.cat_file(f"{base}/{marker}")
        except FileNotFoundError:
            raise DataError(f"{url}: no {marker}: not a complete checkpoint (an upload still under way or interrupted?)") from None
        local_marker = target / marker
        if local_marker.is_file() and local_marker.read_bytes() == remote_marker:
            return target
    elif target.is_dir():
        return target
    with atomic_dir(target) as tmp:
        for f in fs.find(base):
            rel = f[len(base) :].lstrip("/")
            dest = tmp / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            with fs.open(f, "rb") as src, open(dest, "wb") as dst:
                shutil.copyfileobj(src, dst)
        if marker is not None and (tmp / marker).read_bytes() != remote_marker:
            raise DataError(f"{url}: the checkpoint changed while it was downloaded (re-uploaded by another run?); try again")
    return target


# -- a URL store and its local working copy ---------------------------------------------------
#
# `maxit run --store s3://bucket/run` keeps the URL as the store of record and works in a local
# folder (the engines and the trainer load local model folders; the Dagster instance is local):
# each stage writes its tables locally as on a local store, then `UrlStore.push` uploads every
# table that changed, one object per table, the round's `evaluation` table (its completion
# marker) last; checkpoints and registry entries go through `PolicyRegistry` (files first,
# `maxit_checkpoint.json` last, the entry after it). `UrlStore.pull` makes the working copy hold
# what the URL holds, so a run resumed on a fresh machine (an empty working copy) finds its
# complete rounds there; checkpoints are fetched when a round needs them. The writer lock of a
# working copy (`pipeline.store.lock`) also takes the writer's lease at the URL where the
# filesystem has conditional puts (`pipeline.store.lease`), and `push` stops once it is lost.

SYNC_MANIFEST = ".maxit-sync.json"
"""In a working copy: what was last uploaded or downloaded, per file (local size and mtime, the
object's fingerprint), so unchanged tables are neither uploaded nor downloaded again."""
SYNC_LOCK = ".maxit-sync.lock"
"""In a working copy: held (flock, exclusive) by each `UrlStore.pull`, `push` and `remove` for
its whole read-compare-write of the manifest. The processes and threads of one run (the sampler's
threads, the trainer lane's process, step processes) pull and push the same working copy; without
it one's manifest write dropped another's entries, and a pull could then take a table written
here and not yet uploaded for an old one."""

def canonical_url(url: str) -> str:
    """`url` with its scheme, one form per store (no trailing slash, `file://` paths absolute)."""
    scheme, rest = str(url).split("://", 1)
    rest = rest.rstrip("/")
    if scheme in LOCAL_PROTOCOLS:
        rest = str(Path("/" + rest.lstrip("/")).resolve())
    return f"{scheme}://{rest}"


def working_copy(url: str) -> Path:
    """The local working copy of the URL store `url`: `<cache>/stores/<scheme>-<name>-<hash>`,
    one folder per store (the hash of the canonical URL; the name for people)."""
    url = canonical_url(url)
    scheme, rest = url.split("://", 1)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", rest.strip("/"))[-40:].strip("_.") or "root"
    digest = hashlib.blake2b(url.encode(), digest_size=6).hexdigest()
    return cache_root() / "stores" / f"{scheme}-{name}-{digest}"


def check_store_url(url: str, flag: str = "--store") -> None:
    """Before any work: the URL store can be used, without writing anything. Its scheme must be
    known and its package installed (`filesystem`), its bucket must exist (object stores:
    s3fs, gcsfs, adlfs name it `split_path`), the filesystem must answer, and the store must not
    be a file. Every failure is a `ConfigError` naming `flag` and the URL."""
    fs, path = filesystem(url, flag)
    label = f"{flag} {url}"
    try:
        split = getattr(fs, "split_path", None)
        if split is not None:
            bucket = split(path)[0]
            if not bucket:
                raise ConfigError(f"{label}: no bucket in the URL (give scheme://bucket/folder)")
            if not fs.exists(bucket):
                raise ConfigError(f"{label}: bucket {bucket!r} does not exist (or these credentials cannot see it)")
        if "memory" in protocols(fs) and path.strip("/") == "":
            raise ConfigError(f"{label}: give a folder (memory://name), not the filesystem's root")
        if fs.exists(path) and not fs.isdir(path):
            raise ConfigError(f"{label}: is an existing file, not a folder")
    except ConfigError:
        raise
    except Exception as err:  # network, credentials, permissions: the filesystem's own error
        reason = " ".join(str(err).split()) or type(err).__name__
        raise ConfigError(f"{label}: cannot be reached ({type(err).__name__}: {reason})") from None
    if any(p in LOCAL_PROTOCOLS for p in protocols(fs)):
        check_writable(path, flag, "folder")


def _fingerprint(info: Mapping) -> str:
    """What identifies one version of an object in a listing: its size and whichever of the
    filesystem's version fields it reports (ETag, generation, modification times)."""
    import datetime as _dt

    parts = []
    for key in ("size", "ETag", "etag", "md5Hash", "generation", "mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(key)
        if value is None:
            continue
        if isinstance(value, _dt.datetime):
            value = value.timestamp()
        parts.append(f"{key}={value}")
    return ";".join(parts)


def _synced(rel: str) -> bool:
    """Whether a path relative to the store is one of the files `UrlStore` mirrors: the round
    tables (`round=<r>/<table>.parquet`, and a shard's tables below `round=<r>/shards/`), an
    overlapped round's sampling record (`round=<r>/sampling.json`) and the experiment record; not
    temporary files, checkpoints (the registry's) or logs."""
    parts = rel.split("/")
    if any(p.startswith(".") for p in parts):
        return False
    if rel == "experiment.json":
        return True
    if len(parts) == 2 and parts[0].startswith("round=") and parts[1] == "sampling.json":  # an overlapped round's sampling record
        return True
    return parts[0].startswith("round=") and parts[-1].endswith(".parquet")


_WORKING_COPIES: dict[str, str] = {}
"""Working copies of the URL stores this process has opened: resolved folder -> URL."""


def url_of_working_copy(path: str | Path) -> str | None:
    """The URL of the store whose working copy `path` is (one a `UrlStore` of this process
    uses), or None: what lets the writer lock of a working copy take the URL's lease too."""
    return _WORKING_COPIES.get(str(Path(path).resolve()))


class UrlStore:
    """A store at a URL (the store of record) with its local working copy (`working_copy`)."""

    def __init__(self, url: str, local: str | Path | None = None):
        self.url = canonical_url(url)
        self.fs, base = filesystem(self.url)
        self.base = base.rstrip("/")
        self.local = Path(local) if local is not None else working_copy(self.url)
        _WORKING_COPIES[str(self.local.resolve())] = self.url

    def __repr__(self) -> str:
        return f"UrlStore({self.url!r}, local={str(self.local)!r})"

    # -- the manifest ------------------------------------------------------------------------
    @contextlib.contextmanager
    def _sync_lock(self):
        """The working copy's sync lock (`SYNC_LOCK`), exclusive, for one pull, push or remove."""
        self.local.mkdir(parents=True, exist_ok=True)
        with open(self.local / SYNC_LOCK, "a+b") as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    def _manifest(self) -> dict:
        try:
            return json.loads((self.local / SYNC_MANIFEST).read_text())
        except (FileNotFoundError, ValueError):
            return {}

    def _save_manifest(self, manifest: dict) -> None:
        atomic_write_text(self.local / SYNC_MANIFEST, json.dumps(manifest, sort_keys=True))

    def _remote_files(self) -> dict[str, Mapping]:
        """rel path -> listing entry of every mirrored object under the URL."""
        self.fs.invalidate_cache(self.base)  # another machine may have written since this process listed it
        if not self.fs.exists(self.base):
            return {}
        out = {}
        for name, info in self.fs.find(self.base, detail=True).items():
            rel = name[len(self.base) :].lstrip("/")
            if info.get("type", "file") == "file" and _synced(rel):
                out[rel] = info
        return out

    @staticmethod
    def _stat(path: Path) -> list[int] | None:
        try:
            s = path.stat()
        except FileNotFoundError:
            return None
        return [s.st_size, s.st_mtime_ns]

    # -- down -------------------------------------------------------------------------------
    def pull(self, reconcile: bool = False) -> dict[str, int]:
        """Download to the working copy every mirrored object it lacks or whose object changed
        since it was last synced. A table written here since it was last synced (being made, or
        not yet uploaded) is newer than the URL's and is kept. With `reconcile` (a run's start,
        under the store's writer lock) the URL is the store of record: every table that differs
        from its object is downloaded, and the working copy's round tables the URL does not hold
        (left by a run that stopped before uploading them) are deleted: afterwards the working
        copy's tables are the URL's. Returns counts ("downloaded", "deleted", "kept")."""
        with self._sync_lock():
            return self._pull(reconcile)

    def _pull(self, reconcile: bool) -> dict[str, int]:
        remote = self._remote_files()
        manifest = self._manifest()
        counts = {"downloaded": 0, "deleted": 0, "kept": 0}
        for rel, info in sorted(remote.items()):
            local = self.local / rel
            fp = _fingerprint(info)
            entry = manifest.get(rel)
            stat = self._stat(local)
            if entry and entry.get("remote") == fp and entry.get("local") == stat:
                counts["kept"] += 1
                continue
            if not reconcile and stat is not None and (entry is None or entry.get("local") != stat):
                counts["kept"] += 1  # written here since its last sync: newer than the URL's
                continue
            source = f"{self.base}/{rel}"

            def download(tmp: str, source: str = source) -> None:
                with self.fs.open(source, "rb") as src, open(tmp, "wb") as dst:
                    shutil.copyfileobj(src, dst)

            atomic_write(local, download)
            manifest[rel] = {"remote": fp, "local": self._stat(local)}
            counts["downloaded"] += 1
        if reconcile and self.local.is_dir():
            for path in sorted(self.local.glob("round=*/**/*.parquet")):
                rel = path.relative_to(self.local).as_posix()
                if _synced(rel) and rel not in remote:
                    path.unlink()
                    manifest.pop(rel, None)
                    counts["deleted"] += 1
        if counts["downloaded"] or counts["deleted"]:
            self._save_manifest(manifest)
        return counts

    # -- up ---------------------------------------------------------------------------------
    def _put(self, local: Path, rel: str) -> None:
        """One object, written in one upload (a local URL: temporary sibling and rename)."""
        write_bytes(f"{self.url}/{rel}", local.read_bytes())

    def push(self, rounds: list[int] | None = None, files: list[str] = ()) -> list[str]:
        """Upload the working copy's mirrored files that changed since they were last uploaded or
        downloaded: the tables of `rounds` (every round when None) and `files` (paths relative
        to the store). Each is one object in one upload; `evaluation.parquet`, a round's
        completion marker, goes after every other table (round -1's before round r's), so a
        round the URL holds as complete has every table. Returns the uploaded paths."""
        with self._sync_lock():
            return self._push(rounds, files)

    def _push(self, rounds: list[int] | None, files) -> list[str]:
        manifest = self._manifest()
        candidates = [self.local / f for f in files]
        if self.local.is_dir():
            if rounds is None:
                candidates += sorted(self.local.glob("round=*/**/*.parquet"))
            else:
                for r in rounds:
                    candidates += sorted((self.local / f"round={int(r)}").glob("**/*.parquet"))

        def order(path: Path):
            rel = path.relative_to(self.local).as_posix()
            r = int(rel.split("/", 1)[0].split("=", 1)[1]) if rel.startswith("round=") else -2
            return (path.name == "evaluation.parquet", r, rel)

        uploaded = []
        verify_lease(self.url)  # a writer whose lease was taken over stops here
        for path in sorted(set(candidates), key=order):
            rel = path.relative_to(self.local).as_posix()
            stat = self._stat(path)
            if stat is None or not _synced(rel):
                continue
            entry = manifest.get(rel)
            if entry and entry.get("local") == stat:
                continue
            self._put(path, rel)
            manifest[rel] = {"remote": _fingerprint(self.fs.info(f"{self.base}/{rel}")), "local": stat}
            uploaded.append(rel)
        if uploaded:
            self._save_manifest(manifest)
        return uploaded

    def remove(self, rel: str) -> None:
        """Delete a folder or file of the store, at the URL and in the working copy (a round's
        shard files once they are merged)."""
        with self._sync_lock():
            self._remove(rel)

    def _remove(self, rel: str) -> None:
        target = f"{self.base}/{rel.strip('/')}"
        if self.fs.exists(target):
            self.fs.rm(target, recursive=True)
        local = self.local / rel
        if local.is_dir():
            shutil.rmtree(local, ignore_errors=True)
        elif local.exists():
            local.unlink()
        manifest = self._manifest()
        gone = [k for k in manifest if k == rel or k.startswith(rel.rstrip("/") + "/")]
        for k in gone:
            manifest.pop(k)
        if gone:
            self._save_manifest(manifest)
