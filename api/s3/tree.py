"""A bucket as S3 sees it, made of checkpoints: the engine-facing half of the endpoint.

A bucket is one namespace. Its objects are the files of the namespace's newest checkpoint,
overlaid by the open upload the endpoint is filling: objects written since (new or
replacing), and objects deleted since, recorded as empty files under DELETED in that
upload (a catalog record, so a restart keeps them). Committing the open upload makes a
checkpoint holding the whole overlaid tree: the untouched files listed from its parent's
manifest (no bytes move; their hashes are proven by the parent), the written ones as the
upload holds them, the reserved names removed first. So every checkpoint is the bucket as
it stood when a framework's completion marker landed, with lineage to the one before,
and restoring any of them restores a consistent tree.

Synchronous: api/s3/handlers.py runs these on the worker pool, one namespace at a time
(a lock per bucket, api/s3/state.py), so nothing here races another change of the bucket.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass, field

import blake3

from checkpoint_vault.protocol import CommitFile
from checkpoint_vault.vault import FileEntry, NotFound, StoredCheckpoint, Vault
from checkpoint_vault.vault.errors import UploadExpired, UploadNotFound

RESERVED = ".ckpt-s3/"  # names of the endpoint's own bookkeeping inside an open upload
DELETED = RESERVED + "deleted/"  # + key: the key was deleted since the newest checkpoint
PARTS = RESERVED + "parts/"  # + multipart upload id / part number: one part's bytes
# + path: the object `path/`, a "directory" marker (PyArrow, Hadoop and the S3 consoles make
# them); a file name cannot end with `/`, so such keys are stored under this prefix.
DIRS = RESERVED + "dirs/"
# Completion markers when a namespace's policy names none (`s3.markers`): Flink's
# `chk-N/_metadata`, Orbax's commit marker, torch DCP's `.metadata`, TensorFlow's
# `checkpoint` index, Ray Train's snapshot of its checkpoints (written after each report).
DEFAULT_MARKERS = (
    "_metadata",
    "commit_success.txt",
    ".metadata",
    "checkpoint",
    "checkpoint_manager_snapshot.json",
)
EMPTY = FileEntry(0, blake3.blake3(b"").digest(), ())


def to_name(key: str) -> str:
    """The vault file name an object key is stored as."""
    return DIRS + key[:-1] if key.endswith("/") else key


def to_key(name: str) -> str | None:
    """The object key a stored file name stands for; None for the endpoint's own records."""
    if name.startswith(DIRS):
        return name[len(DIRS) :] + "/"
    return None if name.startswith(RESERVED) else name


def etag(entry: FileEntry) -> str:
    """An object's ETag: from its BLAKE3, the length of the MD5 hex S3 gives (clients
    compare ETags, none recomputes them for objects they did not upload whole)."""
    return f'"{entry.hash.hex()[:32]}"'


@dataclass
class Tree:
    """The bucket's objects now: key -> entry, and when each was last written."""

    files: dict[str, FileEntry] = field(default_factory=dict)
    modified: dict[str, float] = field(default_factory=dict)
    latest: StoredCheckpoint | None = None
    written: set[str] = field(default_factory=set)  # keys the open upload holds
    deleted: set[str] = field(default_factory=set)  # keys deleted since the newest checkpoint


def tree(vault: Vault, ns: str, upload_id: str | None, opened_at: float) -> Tree:
    """The bucket's objects: the newest checkpoint's files overlaid by the open upload."""
    out = Tree()
    with vault.store.catalog_env.read() as txn:
        if vault.catalog.namespace(txn, ns) is not None:
            out.latest = vault.catalog.latest(txn, ns, valid_only=False)
        if out.latest is not None:
            stored = vault.catalog.manifest(txn, out.latest.id)
            out.files = {k: e for n, e in stored.items() if (k := to_key(n)) is not None}
            out.modified = dict.fromkeys(out.files, out.latest.created_at)
        pending: dict[str, FileEntry] = {}
        if upload_id is not None:
            try:
                pending = vault.uploads.files(txn, upload_id)
            except (UploadNotFound, UploadExpired):
                pending = {}
    for name, entry in sorted(pending.items()):
        if name.startswith(DELETED):
            gone = to_key(name[len(DELETED) :])
            if gone is not None:
                out.deleted.add(gone)
                if name[len(DELETED) :] not in pending:
                    out.files.pop(gone, None)
        elif (key := to_key(name)) is not None:
            out.files[key] = entry
            out.modified[key] = opened_at
            out.written.add(key)
    return out


def markers(vault: Vault, ns: str) -> tuple[str, ...]:
    """The base names (or globs) that complete a checkpoint in this namespace."""
    for scope in (ns, None):
        try:
            own = vault.policy(scope).s3.get("markers")
        except NotFound:
            continue
        if own is not None:
            return tuple(own)
    return DEFAULT_MARKERS


def commit_after(vault: Vault, ns: str, default: float) -> float:
    """Seconds an open checkpoint may sit unwritten before it is committed anyway."""
    from checkpoint_vault.vault.policy import parse_duration

    for scope in (ns, None):
        try:
            value = vault.policy(scope).s3.get("commit_after")
        except NotFound:
            continue
        if value is not None:
            return parse_duration(value, "s3.commit_after")
    return default


def is_marker(key: str, patterns: tuple[str, ...]) -> bool:
    base = key.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(base, p) for p in patterns)


def commit(
    vault: Vault, ns: str, upload_id: str, domain: Callable[[str], bool] | None
) -> StoredCheckpoint:
    """Commit the open upload as one checkpoint holding the whole tree (module doc); an
    upload that leaves the tree as the newest checkpoint holds it is dropped and that
    checkpoint answered (`unchanged`)."""
    now = tree(vault, ns, upload_id, 0.0)
    if (
        now.latest is not None
        and now.latest.validity.state != "invalid"
        and unchanged(vault, now.latest, now)
    ):
        vault.uploads.abort(upload_id)
        return now.latest
    with vault.store.catalog_env.read() as txn:
        pending = vault.uploads.files(txn, upload_id)
    for name in pending:
        if to_key(name) is None:
            vault.uploads.remove_file(upload_id, name)
    listed = {
        to_name(key): CommitFile(e.size, e.hash.hex(), [cid.hex() for cid, _ in e.chunks])
        for key, e in now.files.items()
        if key not in now.written
    }
    record, _ = vault.committer.commit(upload_id, listed, domain)
    return record


def unchanged(vault: Vault, latest: StoredCheckpoint, now: Tree) -> bool:
    """Whether the tree holds exactly the objects of `latest`, byte for byte. A marker PUT
    again after its commit (a client retrying a request whose answer was lost, a proxy that
    cut the session) would otherwise commit a second, identical checkpoint, which counts
    against `keep_last` and pushes out a real older one; an S3 PUT is idempotent. Not
    over an invalid checkpoint: the same bytes written again make a new, valid one."""
    with vault.store.catalog_env.read() as txn:
        stored = vault.catalog.manifest(txn, latest.id)
    before = {k: e for n, e in stored.items() if (k := to_key(n)) is not None}
    return before.keys() == now.files.keys() and not any(
        _differs(before[k], e) for k, e in now.files.items()
    )


def _introduced(vault: Vault, rec: StoredCheckpoint) -> dict[str, FileEntry]:
    """The files a checkpoint wrote itself: those its parent (if still live) lacked or held
    other bytes for."""
    with vault.store.catalog_env.read() as txn:
        mine = vault.catalog.manifest(txn, rec.id)
        parent = vault.catalog.record(txn, rec.parent) if rec.parent else None
        theirs = (
            vault.catalog.manifest(txn, parent.id)
            if parent is not None and not parent.is_tombstone
            else {}
        )
    return {k: e for k, e in mine.items() if _differs(theirs.get(k), e)}


def _differs(a: FileEntry | None, b: FileEntry) -> bool:
    return a is None or a.size != b.size or a.chunks != b.chunks


def owner(vault: Vault, ns: str, key: str, entry: FileEntry) -> StoredCheckpoint | None:
    """The live checkpoint that wrote this version of `key`: the oldest one holding it."""
    name = to_name(key)
    found: StoredCheckpoint | None = None
    before = None
    while True:
        page, before = vault.checkpoints(ns, limit=1000, before=before)
        with vault.store.catalog_env.read() as txn:
            for rec in page:  # newest first: the last match is the oldest
                other = vault.catalog.manifest(txn, rec.id).get(name)
                if other is not None and not _differs(other, entry):
                    found = rec
                elif found is not None:
                    return found
        if before is None:
            return found


def emptied(vault: Vault, rec: StoredCheckpoint, after: Tree) -> bool:
    """Whether none of the objects checkpoint `rec` wrote is in the bucket any more."""
    mine = _introduced(vault, rec).items()
    return all(_differs(after.files.get(k), e) for n, e in mine if (k := to_key(n)) is not None)


def mark_deleted(vault: Vault, upload_id: str, key: str) -> None:
    vault.uploads.add_file(upload_id, DELETED + to_name(key), EMPTY)


def base_entry(vault: Vault, checkpoint: str, key: str) -> FileEntry | None:
    """The version of `key` a committed checkpoint holds."""
    with vault.store.catalog_env.read() as txn:
        return vault.catalog.manifest(txn, checkpoint).get(to_name(key))
