"""The writer's lease of a URL store: one writer across machines, through conditional writes.

Two machines working on one `s3://bucket/run` each lock their own working copy
(`pipeline.store.lock`), so neither sees the other there. The store itself holds who writes it:
the object `<url>/.maxit-writer.lease`, a small JSON record (the holder's pid, host, command,
token, working copy, and the time its lease expires), written only by conditional puts, so two
writers cannot both believe they hold it:

- taking a free store: a put with `If-None-Match: *` (create only); of two machines racing, the
  object store lets exactly one succeed;
- renewing (the holder, every third of the lease, from a thread) and taking over an expired or
  released lease: a put with `If-Match: <the ETag read>`; a writer that lost the race, or a
  holder whose lease was taken over, gets 412 and re-reads;
- releasing: the last process of the writer rewrites the record as expired (`If-Match` again),
  so the next writer need not wait out the lease.

A holder killed however it dies (SIGKILL, a lost machine) stops renewing, and its lease expires
`seconds` later (`SECONDS_ENV`, default `DEFAULT_SECONDS`). Expiry compares the holder's
recorded deadline with the reader's clock: the machines' clocks must agree to well within a
lease (NTP does). The processes of one writer (its token) share the lease, each renewing it while
it lives. A process that finds its lease taken over stops uploading (`verify`).

Only filesystems with conditional puts have leases (`supports_leases`: S3 and the S3 APIs of
MinIO, Ceph, R2 and others through s3fs); on the others a URL store is locked in its working
copy alone, which keeps runs on one machine apart but not runs on two.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field

from pipeline.errors import MaxitError
from pipeline.store.paths import filesystem, protocols

log = logging.getLogger(__name__)

__all__ = ["LEASE_OBJECT", "SECONDS_ENV", "DEFAULT_SECONDS", "Lease", "LeaseHeld", "LeaseLost", "supports_leases", "take", "read", "verify", "lease_seconds"]

LEASE_OBJECT = ".maxit-writer.lease"
"""The lease's object, at the store's URL (a dot name: never mirrored as a table)."""

SECONDS_ENV = "MAXIT_LEASE_SECONDS"
"""Environment variable: how long a lease lasts unless renewed, in seconds."""

DEFAULT_SECONDS = 60.0


class LeaseHeld(MaxitError):
    """Another writer holds the lease; `record` is what it wrote (its holder's details)."""

    def __init__(self, url: str, record: dict | None):
        self.url, self.record = url, record
        super().__init__(f"{url}: the writer's lease is held by {record}")


class LeaseLost(MaxitError):
    """This writer's lease was taken over: it must not write the store any more."""


def lease_seconds() -> float:
    """The lease's length: `SECONDS_ENV`, else `DEFAULT_SECONDS` (a bad value is an error)."""
    raw = os.environ.get(SECONDS_ENV, "").strip()
    if not raw:
        return DEFAULT_SECONDS
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise MaxitError(f"{SECONDS_ENV}={raw!r}: give the writer's lease in seconds, a number > 0")
    return seconds


def supports_leases(url: str) -> bool:
    """Whether the URL's filesystem takes conditional puts (s3fs: `If-None-Match`, `If-Match`)."""
    return "s3" in protocols(filesystem(url)[0])


def _condition_failed(err: BaseException) -> bool:
    """Whether an error of a conditional put is the object store's "the condition did not hold"
    (412; 409 when another conditional write to the key is in flight): s3fs raises
    FileExistsError for If-None-Match and a generic OSError for If-Match."""
    if isinstance(err, FileExistsError):
        return True
    cause = getattr(err, "__cause__", None)
    response = getattr(cause, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code in ("PreconditionFailed", "ConditionalRequestConflict", "412", "409") or status in (412, 409)


def read(url: str) -> tuple[dict | None, str | None]:
    """(record, ETag) of the store's lease object, or (None, None) when there is none. The ETag
    is read before the body: a body newer than its ETag makes the caller's `If-Match` put fail,
    never succeed against a record it did not read."""
    fs, base = filesystem(url)
    path = f"{base.rstrip('/')}/{LEASE_OBJECT}"
    fs.invalidate_cache(path)  # another machine wrote it: the listing cache must not answer
    try:
        etag = fs.info(path)["ETag"]
        body = fs.cat_file(path)
    except FileNotFoundError:
        return None, None
    try:
        record = json.loads(body)
    except ValueError:
        record = {}  # torn or foreign: unreadable, so treated as expired
    return record, etag


def _put(url: str, record: dict, etag: str | None) -> str:
    """The conditional put: create only (`etag` None) or replace only `etag`. Returns the new ETag."""
    fs, base = filesystem(url)
    path = f"{base.rstrip('/')}/{LEASE_OBJECT}"
    data = json.dumps(record, sort_keys=True).encode()
    if etag is None:
        out = fs.pipe_file(path, data, mode="create")
    else:
        out = fs.pipe_file(path, data, IfMatch=etag)
    return out["ETag"]


@dataclass
class Lease:
    """This process's share of the lease of the store at `url` (renewed from a thread)."""

    url: str
    record: dict
    """What the object holds: the holder's details, `expires` (UNIX time), `seconds`."""
    etag: str
    lost: str | None = None
    """Set once the lease was taken over: by whom."""
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _mutex: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def token(self) -> str:
        return self.record["token"]

    def renew(self) -> bool:
        """Push the deadline `seconds` ahead, conditionally on the ETag this process last saw;
        after a 412, re-read: a record with our token (another process of this writer renewed)
        is adopted and renewed, another's means the lease was lost. Returns whether it is held."""
        with self._mutex:
            if self.lost:
                return False
            for _ in range(5):
                record = dict(self.record, expires=time.time() + float(self.record["seconds"]))
                try:
                    self.etag, self.record = _put(self.url, record, self.etag), record
                    return True
                except OSError as err:
                    if not _condition_failed(err):
                        raise
                current, etag = read(self.url)
                if not current or current.get("token") != self.token:
                    self.lost = _describe(current)
                    return False
                self.etag = etag
            return True  # five collisions with our own processes: the lease is ours and fresh

    def _keep(self) -> None:
        period = float(self.record["seconds"]) / 3
        while not self._stop.wait(period):
            try:
                if not self.renew():
                    log.error("%s: the writer's lease was taken over by %s; stopping uploads", self.url, self.lost)
                    return
            except Exception as err:  # a network error: try again next period, the lease has two more
                log.warning("%s: renewing the writer's lease failed (%s); retrying", self.url, err)

    def start(self) -> "Lease":
        threading.Thread(target=self._keep, name=f"lease {self.url}", daemon=True).start()
        _HELD.setdefault(self.url, []).append(self)
        return self

    def release(self, last: bool) -> None:
        """Stop renewing; when `last` (no other process of this writer holds it), rewrite the
        record as expired so the next writer need not wait the lease out."""
        self._stop.set()
        held = _HELD.get(self.url, [])
        if self in held:
            held.remove(self)
        with self._mutex:
            if not last or self.lost:
                return
            try:
                _put(self.url, dict(self.record, expires=0.0, released=True), self.etag)
            except OSError as err:  # taken over meanwhile (412), or the network: it expires anyway
                log.warning("%s: could not release the writer's lease (%s); it expires by itself", self.url, err)

    def check(self) -> None:
        """Raise `LeaseLost` when the lease is not this writer's any more. A process past its own
        deadline (it was paused) renews first, so it never writes on an expired lease."""
        if not self.lost and time.time() > float(self.record["expires"]) - float(self.record["seconds"]) / 3:
            self.renew()
        if self.lost:
            raise LeaseLost(f"{self.url}: this run lost the store's writer lease to {self.lost}; it stopped before writing more")


def _describe(record: dict | None) -> str:
    if not record:
        return "nobody (the lease object was deleted)"
    return f"pid {record.get('pid')} on {record.get('host')} ({record.get('command')})"


_HELD: dict[str, list[Lease]] = {}
"""This process's leases, by store URL (for `verify`)."""


def _forget_inherited() -> None:
    # a forked child has no renewing thread: it holds nothing until it takes the lease itself
    _HELD.clear()


os.register_at_fork(after_in_child=_forget_inherited)


def take(url: str, holder: dict, may_replace=lambda record: False, seconds: float | None = None) -> Lease:
    """Take (or join) the writer's lease of the store at `url` for `holder` (its details, with
    its `token`) and keep renewing it; raise `LeaseHeld` naming the holder when another writer
    has it. Free: no object, an expired or released record, or one `may_replace` accepts (a
    holder known dead); the same token: joined. Conditional puts make a race between two
    writers end with one lease, the loser re-reading and usually refused."""
    seconds = lease_seconds() if seconds is None else float(seconds)
    for _ in range(10):
        record, etag = read(url)
        if record and record.get("token") == holder["token"]:
            lease = Lease(url, record, etag)
            if lease.renew():  # the writer's other process may be about to release it
                return lease.start()
            continue
        if record is not None and not (float(record.get("expires", 0)) < time.time() or may_replace(record)):
            raise LeaseHeld(url, record)
        mine = dict(holder, seconds=seconds, expires=time.time() + seconds)
        try:
            return Lease(url, mine, _put(url, mine, etag)).start()
        except OSError as err:
            if not _condition_failed(err):
                raise
    raise LeaseHeld(url, read(url)[0])


def verify(url: str) -> None:
    """Before this process uploads to the store at `url`: raise `LeaseLost` when the lease it
    holds there was taken over (nothing to check when it holds none)."""
    for lease in list(_HELD.get(url, ())):
        lease.check()
