"""Atomic commit: one writer transaction makes a checkpoint, its manifest and its reference
counts visible together, or nothing at all.

Before the transaction, on a worker thread, files listed by the client are checked against
the stored chunks: sizes add up and the whole-file BLAKE3 matches, or, when the client left
the hash out, is computed (every chunk was verified against its id when stored, so the
producer need not hash the file a second time). A file identical (size and chunk list) to
one of the parent's or of the namespace's latest checkpoint was proven when that was
committed, and skips the read (re-saving an unchanged 200 MB state without naming a parent
would otherwise re-read and re-hash all of it), as does a second copy of a file in the
upload. Inside the transaction the session is re-read (a retried commit returns the
checkpoint the first one made) and every chunk is re-checked, because GC may have run
since.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import lmdb

from checkpoint_vault.protocol import CommitFile

from . import quotas
from .config import VaultConfig
from .content.reader import Reader
from .create import CreateParts, Draft, create, inherited
from .domains import Domain, cached
from .errors import (
    Conflict,
    HashMismatch,
    InvalidRequest,
    MissingChunks,
    TooLarge,
    TooManyUploads,
    UploadExpired,
    UploadPrepared,
)
from .manifest import FileEntry
from .names import check_chunk_id, check_file_name
from .records import StoredCheckpoint, UploadSession
from .uploads import Uploads

if TYPE_CHECKING:
    from .clock import Clock
    from .config import VaultConfig
    from .env import Env
    from .writer import Writer


class CommitParts(CreateParts, Protocol):
    """What a commit needs of the store: making the checkpoint (`CreateParts`), and the
    catalog's tables, the clock and the writer."""

    @property
    def catalog_env(self) -> Env: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def writer(self) -> Writer: ...


# A listed file may have at most MAX_CHUNKS_SLACK + size // MIN_AVERAGE_CHUNK chunks.
# FastCDC's smallest profile cuts 1 KiB on average and tensor-aware cutting adds one short
# chunk per small tensor; 400,000 8-byte chunks in one file (a 42 MB manifest and +150 MB
# of catalog for 4.8 MB of data, slowing everyone's commits) is not a checkpoint.
MIN_AVERAGE_CHUNK = 256
MAX_CHUNKS_SLACK = 4096

# How a committed file's hash was proven: identical to a file already committed, hashed as
# its chunks arrived (vault/filehash.py), or read back from the store at commit, the one
# that costs a pass over the file (operators see these as ckpt_commit_file_hashes).
HASH_SOURCES = ("same_file", "on_arrival", "read_back")


# A commit reading back at most this many bytes (~0.1-0.3 s of one core) needs no read-back
# slot (`max_read_backs_per_token`): producers committing small unproven files at once
# (the crash test's, after a restart lost their running hashes) are never refused.
READ_BACK_FREE = 256 << 20


def _parse_listed(
    files: Mapping[str, CommitFile] | None, config: VaultConfig
) -> dict[str, tuple[int, bytes | None, list[bytes]]]:
    """Names and ids checked (the engine's boundary: they become LMDB keys), as bytes.
    The commit's size and reference count are checked first, from the body alone: what a
    commit costs (lookups, read-back, manifest) grows with them, not with the body."""
    files = files or {}
    refs = sum(len(spec.chunks) for spec in files.values())
    if refs > config.max_commit_chunks:
        raise TooLarge(
            f"this commit lists {refs} chunk references; this server's limit is "
            f"{config.max_commit_chunks} per commit (uploads.max_commit_chunks)"
        )
    logical = sum(max(spec.size, 0) for spec in files.values())
    if logical > config.max_checkpoint_bytes:
        raise TooLarge(
            f"this commit lists {logical} bytes of files; this server's limit is "
            f"{config.max_checkpoint_bytes} per checkpoint (uploads.max_checkpoint_bytes)"
        )
    out = {}
    for name, spec in files.items():
        check_file_name(name)
        if spec.size < 0:
            raise InvalidRequest(f"file {name!r}: size must be a non-negative integer")
        if len(spec.chunks) > MAX_CHUNKS_SLACK + spec.size // MIN_AVERAGE_CHUNK:
            raise TooLarge(
                f"file {name!r}: {len(spec.chunks)} chunks for {spec.size} bytes; at most "
                f"{MAX_CHUNKS_SLACK} plus one per {MIN_AVERAGE_CHUNK} bytes"
            )
        digest = None if spec.hash is None else check_chunk_id(spec.hash)  # 64 hex, as ids
        out[name] = (spec.size, digest, [check_chunk_id(c) for c in spec.chunks])
    return out


@dataclass(frozen=True)
class Plan:
    """A commit checked and its files proven, ready for its writer transaction; or,
    `done`, the checkpoint an earlier commit of the upload made."""

    upload_id: str
    entries: dict[str, FileEntry]
    how: Counter[str]
    transaction: str | None = None
    done: StoredCheckpoint | None = None
    quota: bool = True  # False: a decided transaction's apply (its prepare checked it)

    @property
    def size(self) -> int:
        """The writer's estimate of the transaction's bytes."""
        return sum(len(e.chunks) for e in self.entries.values()) * 64


def _check_prepared(session: UploadSession, transaction: str | None) -> None:
    """A prepared upload belongs to its transaction: only that one commits it."""
    if session.prepared is not None and session.prepared != transaction:
        raise UploadPrepared(
            f"upload {session.id} is prepared in transaction {session.prepared}: "
            "it is committed or aborted with it (POST /v1/commits)"
        )


class Committer:
    def __init__(self, store: CommitParts, uploads: Uploads, reader: Reader) -> None:
        self._s = store
        self._uploads = uploads
        self._reader = reader
        self._hashed: Counter[str] = Counter(dict.fromkeys(HASH_SOURCES, 0))
        self._reading: Counter[str] = Counter()  # commits reading back, per token name
        self._hashed_lock = threading.Lock()

    def file_hashes(self) -> dict[str, int]:
        """Committed files by how their hash was proven, since start (HASH_SOURCES)."""
        with self._hashed_lock:
            return dict(self._hashed)

    def commit(
        self,
        upload_id: str,
        files: Mapping[str, CommitFile] | None = None,
        domain: Domain = None,
        *,
        local: bool = False,
    ) -> tuple[StoredCheckpoint, bool]:
        """Commit an upload; returns the record and whether this call created it. Listed
        chunks count only if stored inside the caller's `domain` or sent by this session
        (vault/domains.py); others are `missing_chunks`, and no size or hash of them is
        ever computed into an answer. `local`: acknowledged once durable here (a part's,
        vault/writer.py)."""
        plan = self.plan(upload_id, files, domain)
        if plan.done is not None:  # a retry: the first commit may be visible before it is
            self._s.writer.wait_durable()  # durable (outside the read: growing the map waits)
            return plan.done, False
        made = self._s.writer.run(
            lambda w: self.apply(w.catalog, plan), size=plan.size, local=local
        )
        self.finish(plan, made[1])
        return made

    def plan(
        self,
        upload_id: str,
        files: Mapping[str, CommitFile] | None = None,
        domain: Domain = None,
        transaction: str | None = None,
        quota: bool = True,
    ) -> Plan:
        """Everything a commit checks before its writer transaction (files proven, sizes
        and quota), or the checkpoint an earlier commit made. `transaction`: the cross-
        namespace commit (vault/txn.py) this upload was prepared for; a prepared upload
        commits only through it, and `quota` False once it is decided: a quota filled
        since its prepare must not split a transaction already committed."""
        listed = _parse_listed(files, self._s.config)
        self._uploads.settle(upload_id)
        with self._s.catalog_env.read() as txn:
            session = self._uploads.get(txn, upload_id)
            if session.committed:
                return Plan(upload_id, {}, Counter(), transaction, self._existing(txn, session))
            _check_prepared(session, transaction)
            self._check_size(txn, session, listed, quota)
            claimed = self._entries(txn, upload_id, listed, cached(domain))
            proven = list(self._parent_files(txn, session).values())
            latest = self._s.catalog.latest(txn, session.namespace, valid_only=False)
            if latest is not None and latest.id != session.parent:
                proven.extend(self._s.catalog.manifest(txn, latest.id).values())
        known = {(e.size, e.chunks): e.hash for e in proven}
        entries, how = self._prove(upload_id, claimed, known, session.created_by or "")
        return Plan(upload_id, entries, how, transaction, quota=quota)

    def finish(self, plan: Plan, created: bool) -> None:
        """After the plan's transaction committed: running hashes forgotten, counted."""
        self._uploads.running.forget(plan.upload_id)
        if created:
            with self._hashed_lock:
                self._hashed.update(plan.how)

    def _prove(
        self,
        upload_id: str,
        claimed: dict[str, tuple[bytes | None, FileEntry]],
        known: dict[tuple[int, tuple[tuple[bytes, int], ...]], bytes],
        by: str,
    ) -> tuple[dict[str, FileEntry], Counter[str]]:
        """Each file's proven hash (HASH_SOURCES) and how many were proven which way; the
        read-backs' bytes are checked against the limit before any is read, and token
        `by` reads back in at most `max_read_backs_per_token` commits at once."""
        running = self._uploads.running
        # Which files need a read-back, and its bytes, before any is read (a copy of one
        # later in this upload is proven by the first read).
        cheap: dict[str, tuple[bytes | None, str]] = {}
        to_read: dict[tuple[int, tuple[tuple[bytes, int], ...]], str] = {}
        for name, (digest, entry) in claimed.items():
            key = (entry.size, entry.chunks)
            proof, source = known.get(key), "same_file"
            if proof is None and key not in to_read:
                proof = running.digest(upload_id, name, [cid for cid, _ in entry.chunks])
                source = "on_arrival"
            if key not in to_read and (proof is None or (digest is not None and digest != proof)):
                to_read[key] = name
            elif proof is not None:
                known.setdefault(key, proof)  # a copy later in this upload: proven
            cheap[name] = (proof, source)
        self._check_read_back(to_read)
        with self._read_back_slot(by, sum(size for size, _ in to_read) > READ_BACK_FREE):
            return self._hash(upload_id, claimed, known, cheap, to_read)

    @contextlib.contextmanager
    def _read_back_slot(self, by: str, needed: bool) -> Iterator[None]:
        """One of token `by`'s read-back slots while its files are read back (when more
        than READ_BACK_FREE bytes: `needed`), or 429
        (TooManyUploads, with Retry-After) at once: a worker waiting for a slot would hold
        the pool as surely as one hashing, so one token's read-backs occupy at most
        `max_read_backs_per_token` of the workers, never every one."""
        if not needed:
            yield
            return
        limit = self._s.config.max_read_backs_per_token
        with self._hashed_lock:
            if self._reading[by] >= limit:
                raise TooManyUploads(
                    f"token {by!r} already has {limit} commit(s) reading back file hashes "
                    "(uploads.max_read_backs_per_token); retry once one has answered"
                )
            self._reading[by] += 1
        try:
            yield
        finally:
            with self._hashed_lock:
                self._reading[by] -= 1
                if not self._reading[by]:
                    del self._reading[by]

    def _hash(
        self,
        upload_id: str,
        claimed: dict[str, tuple[bytes | None, FileEntry]],
        known: dict[tuple[int, tuple[tuple[bytes, int], ...]], bytes],
        cheap: dict[str, tuple[bytes | None, str]],
        to_read: dict[tuple[int, tuple[tuple[bytes, int], ...]], str],
    ) -> tuple[dict[str, FileEntry], Counter[str]]:
        """The proofs `_prove` planned: the files in `to_read` read back, the others as
        found cheaply."""
        entries: dict[str, FileEntry] = {}
        how: Counter[str] = Counter()
        for name, (digest, entry) in claimed.items():
            key = (entry.size, entry.chunks)
            proof, source = cheap[name]
            if to_read.get(key) == name:
                proof, source = self._reader.file_hash(entry), "read_back"
            elif key in to_read:
                proof, source = known[key], "same_file"
            assert proof is not None  # proven cheaply, or read back (to_read) above
            if digest is not None and digest != proof:
                raise HashMismatch(f"file {name!r}: BLAKE3 of its chunks does not match 'hash'")
            entries[name] = FileEntry(entry.size, proof, entry.chunks)
            known[(entry.size, entry.chunks)] = proof  # a copy later in this upload: proven
            how[source] += 1
        return entries, how

    def _check_size(
        self,
        txn: lmdb.Transaction,
        session: UploadSession,
        listed: dict[str, tuple[int, bytes | None, list[bytes]]],
        quota: bool = True,
    ) -> None:
        """The checkpoint's logical size (files added to the session and inherited ones
        too) against the per-checkpoint limit and the quota, before any chunk is looked up
        or read. The writer transaction checks the quota again (usage may have changed)."""
        files = {name: e.size for name, e in self._uploads.files(txn, session.id).items()}
        files.update({name: size for name, (size, _, _) in listed.items()})
        if session.inherit and session.parent:
            for name, e in inherited(self._s, txn, session.parent).items():
                files.setdefault(name, e.size)
        logical = sum(files.values())
        limit = self._s.config.max_checkpoint_bytes
        if logical > limit:
            raise TooLarge(
                f"this checkpoint would hold {logical} bytes of files; this server's limit is "
                f"{limit} per checkpoint (uploads.max_checkpoint_bytes)"
            )
        if quota and self._s.config.quotas:
            quotas.check(txn, self._s.catalog, self._s.config.quotas, session.namespace, logical)

    def _check_read_back(
        self, to_read: Mapping[tuple[int, tuple[tuple[bytes, int], ...]], str]
    ) -> None:
        """Refuse, before reading anything, a commit whose unproven files add up past the
        read-back limit: hashing them holds a worker thread for their logical size, which
        repeated references make as large as the body allows."""
        nbytes = sum(size for size, _ in to_read)
        limit = self._s.config.max_commit_read_back_bytes
        if nbytes > limit:
            names = sorted(to_read.values())
            shown = ", ".join(repr(n) for n in names[:5]) + (", ..." if len(names) > 5 else "")
            raise TooLarge(
                f"proving the hash of {shown} would read back {nbytes} bytes; this server's "
                f"limit is {limit} per commit (uploads.max_commit_read_back_bytes): send their "
                "chunks with positions so they are hashed as they arrive, or commit fewer "
                "files per upload"
            )

    def _existing(self, txn: lmdb.Transaction, session: UploadSession) -> StoredCheckpoint:
        rec = self._s.catalog.record(txn, session.committed or "")
        if rec is None:
            raise Conflict(f"upload {session.id} was committed but its checkpoint is gone")
        return rec

    def _entries(
        self,
        txn: lmdb.Transaction,
        upload_id: str,
        listed: dict[str, tuple[int, bytes | None, list[bytes]]],
        domain: Domain,
    ) -> dict[str, tuple[bytes | None, FileEntry]]:
        """Each listed file's claimed hash and its entry (hash not yet known: empty)."""
        entries: dict[str, tuple[bytes | None, FileEntry]] = {}
        missing: list[str] = []
        sizes: dict[bytes, int | None] = {}  # each distinct chunk looked up once
        for name, (size, digest, cids) in listed.items():
            chunks = []
            for cid in cids:
                if cid not in sizes:
                    meta = self._s.chunks.meta(txn, cid)
                    usable = meta is not None and self._uploads.present(txn, upload_id, cid, domain)
                    sizes[cid] = meta.size if meta is not None and usable else None
                n = sizes[cid]
                if n is None:
                    missing.append(cid.hex())
                else:
                    chunks.append((cid, n))
            if not missing and sum(n for _, n in chunks) != size:
                raise InvalidRequest(
                    f"file {name!r}: chunk sizes add up to {sum(n for _, n in chunks)}, not {size}"
                )
            entries[name] = (digest, FileEntry(size, b"", tuple(chunks)))
        if missing:
            raise MissingChunks(list(dict.fromkeys(missing)))
        return entries

    def _parent_files(self, txn: lmdb.Transaction, session: UploadSession) -> dict[str, FileEntry]:
        """The parent's files if it is still live (files identical to them are proven)."""
        parent = self._s.catalog.record(txn, session.parent) if session.parent else None
        if parent is None or parent.is_tombstone:
            return {}
        return self._s.catalog.manifest(txn, parent.id)

    def apply(self, txn: lmdb.Transaction, plan: Plan) -> tuple[StoredCheckpoint, bool]:
        """The commit transaction of `plan` (writer thread, inside the caller's
        transaction: several plans in one make a commit across namespaces)."""
        upload_id, listed = plan.upload_id, plan.entries
        session = self._uploads.get(txn, upload_id)
        if session.committed:
            return self._existing(txn, session), False
        _check_prepared(session, plan.transaction)
        now = self._s.clock.now()
        if session.expires_at <= now:
            raise UploadExpired(f"upload {upload_id} expired before commit; open a new one")
        files = self._uploads.files(txn, upload_id)
        files.update(listed)
        draft = Draft(
            session.namespace,
            session.parent,
            session.inherit,
            session.metadata,
            session.tags,
            files,
            session.created_by,
        )
        rec = create(self._s, txn, draft, now, quota=plan.quota)
        self._uploads.committed(txn, session, rec.id)
        return rec, True
