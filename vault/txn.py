"""Commits across namespaces: several uploads made checkpoints all together or not at all.

On one node (`commit_all`) that is one writer transaction: every upload's commit is planned
(files proven, sizes checked) as a commit is, then all are applied inside the same
transaction, so one refusal rolls every one back. Across shards (docs/DESIGN.md, "Commits
across namespaces") each owner *prepares* its upload here and the cluster's store holds the
decision (cluster/txn.py):

- `prepare` checks everything a commit checks and then, in one writer transaction, makes
  the upload's files final (listed files proven, inherited ones copied in), holds every
  chunk they name for `PREPARED_HOLD`, and marks the session prepared with the transaction
  id, indexed by namespace (`prepared`). Nothing becomes visible; the upload accepts
  nothing more and neither expires nor aborts on its own. It is acknowledged durable (and,
  with sync replication, in the replica: a takeover carries it).
- `apply` is the upload's commit, through its transaction (a retry returns the checkpoint
  the first made) and drops the index entry in the same transaction; `abort` drops the
  entry and opens the upload again (a client fixes the refused one and commits them all
  in a new transaction, as after a refused commit on one node, which changes nothing).
- `pending` lists prepared uploads (all, or one namespace's): what the resolver and reads
  of a namespace look at (a prefix seek, so every process can afford it per request).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import lmdb

from checkpoint_vault.protocol import CommitFile

from . import quotas
from .commit import CommitParts, Committer, Plan
from .create import inherited
from .domains import Domain
from .errors import (
    Conflict,
    InvalidRequest,
    MissingChunks,
    UploadNotFound,
    VaultError,
)
from .manifest import FileEntry, distinct_chunks
from .records import StoredCheckpoint, UploadSession
from .uploads import Uploads
from .writer import WriteTxn

# How long a prepared upload holds its chunks against GC. Its transaction is decided
# within the resolver's timeout (seconds, cluster/txn.py) and applied at the owner's next
# resolver pass, so a day is a margin for an owner that stays down, not a wait: chunks of
# an aborted upload are collected once it lapses.
PREPARED_HOLD = 24 * 3600.0
MAX_ENTRIES = 64  # uploads in one transaction: each costs its owner a prepare and an apply
_TXN_ID = re.compile(r"[0-9a-f]{16,64}")


class TxnParts(CommitParts, Protocol):
    """What commits across namespaces need of the store: what a commit needs."""


@dataclass(frozen=True)
class Entry:
    """One upload of a transaction: the namespace it must belong to, and its listed files
    (as a commit body's; None: only what was streamed or handed over)."""

    namespace: str
    upload_id: str
    files: Mapping[str, CommitFile] | None = None


@dataclass(frozen=True)
class PreparedUpload:
    namespace: str
    upload_id: str
    transaction: str
    prepared_at: float  # the preparing owner's clock: only the resolver's timeout uses it


def check_transaction(transaction: object) -> str:
    if not isinstance(transaction, str) or not _TXN_ID.fullmatch(transaction):
        raise InvalidRequest("transaction must be 16-64 lowercase hex characters")
    return transaction


def check_entries(entries: Sequence[Entry]) -> None:
    """Called once every upload was found (an unknown one is a 404 first)."""
    if not 0 < len(entries) <= MAX_ENTRIES:
        raise InvalidRequest(f"a commit across namespaces takes 1-{MAX_ENTRIES} uploads")
    if len({e.upload_id for e in entries}) != len(entries):
        raise InvalidRequest("an upload is named twice")


@contextlib.contextmanager
def naming(entry: Entry) -> Iterator[None]:
    """An engine error about one upload says which namespace's it is: the caller of a
    commit of many learns which one was refused, with the code it would have had alone."""
    try:
        yield
    except VaultError as e:
        e.message = f"namespace {entry.namespace!r} (upload {entry.upload_id}): {e.message}"
        e.args = (e.message,)
        raise


def _key(namespace: str, upload_id: str = "") -> bytes:
    return namespace.encode() + b"\0" + upload_id.encode()


class Transactions:
    def __init__(self, store: TxnParts, uploads: Uploads, committer: Committer) -> None:
        self._s = store
        self._uploads = uploads
        self._c = committer
        self._db = store.catalog_env.db["prepared"]

    # -- one node: one writer transaction -------------------------------------------
    def commit_all(
        self, entries: Sequence[Entry], domain: Domain = None
    ) -> list[tuple[StoredCheckpoint, bool]]:
        """Commit every upload in one writer transaction; (record, created) per entry, in
        order. A retry returns what the first made."""
        if len(entries) > MAX_ENTRIES:
            check_entries(entries)
        for e in entries:
            with naming(e):
                self._check_namespace(self._uploads.session(e.upload_id), e)
        check_entries(entries)
        plans: list[Plan] = []
        for e in entries:
            with naming(e):
                plans.append(self._c.plan(e.upload_id, e.files, domain))
        if all(p.done is not None for p in plans):
            self._s.writer.wait_durable()  # as a retried commit: visible before durable
            return [(p.done, False) for p in plans if p.done is not None]

        def op(w: WriteTxn) -> list[tuple[StoredCheckpoint, bool]]:
            made = []
            for e, p in zip(entries, plans, strict=True):
                with naming(e):
                    made.append(self._c.apply(w.catalog, p))
            return made

        made = self._s.writer.run(op, size=sum(p.size for p in plans))
        for p, (_, created) in zip(plans, made, strict=True):
            self._c.finish(p, created)
        return made

    # -- across shards: prepare, then apply or abort --------------------------------
    def prepare(self, transaction: str, entry: Entry, domain: Domain = None) -> None:
        """Prepare `entry`'s upload for `transaction` (durable when this returns); again
        for the same transaction, nothing more. Refusals are a commit's own."""
        check_transaction(transaction)
        with naming(entry):
            session = self._uploads.session(entry.upload_id)
            self._check_namespace(session, entry)
            if session.prepared == transaction:
                return
            if session.committed:
                raise Conflict(f"upload {session.id} is already committed as {session.committed}")
            plan = self._c.plan(entry.upload_id, entry.files, domain)
            size = plan.size + 4096
            self._s.writer.run(lambda w: self._prepare(w.catalog, transaction, plan), size=size)
            self._c.finish(plan, False)

    def _prepare(self, txn: lmdb.Transaction, transaction: str, plan: Plan) -> None:
        session = self._uploads.get(txn, plan.upload_id)
        if session.prepared == transaction:
            return
        self._uploads.live(txn, plan.upload_id)  # committed, prepared elsewhere, expired
        now = self._s.clock.now()
        files = self._final_files(txn, session, plan.entries)
        if self._s.config.quotas:
            size = sum(e.size for e in files.values())
            quotas.check(txn, self._s.catalog, self._s.config.quotas, session.namespace, size)
        hold_ms = int((now + PREPARED_HOLD) * 1000)
        chunks = self._s.chunks
        for cid in distinct_chunks(files):
            meta = chunks.meta(txn, cid)
            if meta is not None:
                chunks.reserve(txn, cid, meta, hold_ms)
        for name, entry in files.items():
            self._uploads.put_file(txn, session.id, name, entry)
        session.inherit = False  # the parent's files are the upload's own now
        session.prepared, session.prepared_at = transaction, now
        session.expires_at = now + PREPARED_HOLD
        self._uploads.put(txn, session)
        record = {"transaction": transaction, "at": now}
        txn.put(_key(session.namespace, session.id), json.dumps(record).encode(), db=self._db)

    def _final_files(
        self, txn: lmdb.Transaction, session: UploadSession, listed: Mapping[str, FileEntry]
    ) -> dict[str, FileEntry]:
        """The checkpoint's files as its commit would make them, every chunk sound: so the
        apply depends on nothing but chunks this prepare holds."""
        files = self._uploads.files(txn, session.id)
        files.update(listed)
        if session.inherit and session.parent:
            for name, entry in inherited(self._s, txn, session.parent).items():
                files.setdefault(name, entry)
        usable = self._s.chunks.usable
        missing = [c.hex() for c in distinct_chunks(files) if not usable(txn, c)]
        if missing:
            raise MissingChunks(missing)
        return files

    def apply(self, transaction: str, upload_id: str) -> tuple[StoredCheckpoint, bool]:
        """Commit a prepared upload (its transaction was decided `commit`); a retry
        returns the checkpoint the first made."""
        plan = self._c.plan(upload_id, None, None, transaction, quota=False)
        if plan.done is not None:
            self._s.writer.wait_durable()
            return plan.done, False

        def op(w: WriteTxn) -> tuple[StoredCheckpoint, bool]:
            made = self._c.apply(w.catalog, plan)
            w.catalog.delete(_key(made[0].namespace, upload_id), db=self._db)
            return made

        made = self._s.writer.run(op, size=plan.size)
        self._c.finish(plan, made[1])
        return made

    def abort(self, transaction: str, upload_id: str) -> None:
        """Release an upload prepared for `transaction` (decided `abort`): open again,
        with the files it was prepared with, for a new commit or its own expiry; nothing
        if it is gone or not this transaction's."""

        def op(w: WriteTxn) -> None:
            try:
                session = self._uploads.get(w.catalog, upload_id)
            except UploadNotFound:
                return
            if session.prepared != transaction:
                return
            if session.committed:
                raise Conflict(f"upload {upload_id} was committed in {transaction}")
            session.prepared = session.prepared_at = None
            session.expires_at = self._s.clock.now() + self._s.config.upload_ttl
            self._uploads.put(w.catalog, session)
            w.catalog.delete(_key(session.namespace, upload_id), db=self._db)

        self._s.writer.run(op)

    def pending(self, namespace: str | None = None) -> list[PreparedUpload]:
        """Prepared uploads not yet applied or aborted: `namespace`'s, or all."""
        prefix = b"" if namespace is None else _key(namespace)
        out = []
        with self._s.catalog_env.read() as txn:
            cur = txn.cursor(db=self._db)
            ok = cur.set_range(prefix) if prefix else cur.first()
            while ok and bytes(cur.key()).startswith(prefix):
                ns, _, upload_id = bytes(cur.key()).decode().partition("\0")
                d = json.loads(bytes(cur.value()))
                out.append(PreparedUpload(ns, upload_id, str(d["transaction"]), float(d["at"])))
                ok = cur.next()
        return out

    @staticmethod
    def _check_namespace(session: UploadSession, entry: Entry) -> None:
        if session.namespace != entry.namespace:
            raise Conflict(f"upload {session.id} is not an upload of {entry.namespace!r}")
