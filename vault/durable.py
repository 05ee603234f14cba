"""The owner's side of a commit of parts that does not wait for shipping (issue 44, M2).

`commit_pending` makes the checkpoint visible as soon as every part's manifest is in the
owner's hands: one writer transaction, one id, `durable: false`, its files a row of the
`pending` table (vault/pending.py) instead of a manifest, so no count ever names a chunk
not held here. `adopt` is the step the owner's background loop runs for each row
(api/cluster/durable.py): once the shared index lists every chunk not already held here,
one writer transaction adopts them (as `missing` does), writes the manifest and its
references and flips the record to durable; then the parts may be released. A row whose
checkpoint was deleted meanwhile is dropped and its parts released the same way. All of
it is in the catalog, so a restart or a takeover (its replica has the table, once it
caught up with the commit) carries on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from . import quotas
from .errors import UploadExpired
from .manifest import FileEntry, distinct_chunks
from .pending import Pending
from .records import StoredCheckpoint
from .store import Store
from .uploads import Uploads
from .writer import WriteTxn

ADOPT_HOLD_MS = 3600_000  # an adopted chunk stays reserved this long before its references


class Durability:
    """Pending commits of parts on this owner: made visible early, adopted later."""

    def __init__(self, store: Store, uploads: Uploads) -> None:
        self._s = store
        self._uploads = uploads

    def commit_pending(
        self,
        upload_id: str,
        files: Mapping[str, FileEntry],
        held_by: Mapping[str, int],
        parts: Sequence[tuple[str, str]],
    ) -> StoredCheckpoint:
        """The commit's upload as a visible checkpoint, `durable: false` (a retry: the
        checkpoint the first attempt made). Acknowledged once durable on this disk, not
        waiting for a sync replica (`local`): the owner's replica ships in commit order, so
        it would wait for the bytes of every part saved on this node just before; the
        record says the checkpoint is not in the bucket yet, and its adoption, which
        says it is, waits for the replica (docs/DESIGN.md, "What this trades")."""
        size = sum(e.size for e in files.values())

        def op(w: WriteTxn) -> StoredCheckpoint:
            session = self._uploads.get(w.catalog, upload_id)
            if session.committed:
                found = self._s.catalog.record(w.catalog, session.committed)
                assert found is not None  # a commit's record is never forgotten
                return found
            now = self._s.clock.now()
            if session.expires_at <= now:
                raise UploadExpired(f"upload {upload_id} expired before commit; retry")
            if self._s.config.quotas:
                quotas.check(w.catalog, self._s.catalog, self._s.config.quotas,
                             session.namespace, size)  # fmt: skip
            rec = StoredCheckpoint(
                id=self._s.ids.next(int(now * 1000)),
                namespace=session.namespace,
                parent=session.parent,
                created_at=now,
                metadata=session.metadata,
                tags=session.tags,
                files={},
                size=size,
                created_by=session.created_by,
                durable=False,
            )
            rec.set_files(files)
            self._s.catalog.add_pending(w.catalog, rec)
            pending = Pending(session.namespace, list(parts), dict(files), dict(held_by))
            self._s.catalog.pending.put(w.catalog, rec.id, pending)
            self._uploads.committed(w.catalog, session, rec.id)
            return rec

        return self._s.writer.run(op, size=len(files) * 256, local=True)

    def adoptable(self, files: Mapping[str, FileEntry]) -> bool:
        """Every chunk held here or listed by the shared index as this node knows it (no
        reservation; listed again only if the last listing is older than its period)."""
        with self._s.catalog_env.read() as txn:
            absent = [c for c in distinct_chunks(files) if not self._s.chunks.usable(txn, c)]
        shared = self._s.shared
        if not absent:
            return True
        return shared is not None and len(shared.lookup(absent)) == len(absent)

    def waiting(self) -> list[str]:
        """Checkpoints not adopted yet (or deleted before their parts were released)."""
        with self._s.catalog_env.read() as txn:
            return self._s.catalog.pending.ids(txn)

    def pending(self, ckpt_id: str) -> Pending | None:
        with self._s.catalog_env.read() as txn:
            return self._s.catalog.pending.get(txn, ckpt_id)

    def adopt(self, ckpt_id: str, refresh: bool = True) -> list[tuple[str, str]] | None:
        """Adopt a pending checkpoint's chunks if the shared index lists them all; the
        parts to release once done (adopted, or the checkpoint deleted), None if some
        part is not shipped yet. `refresh` False: the caller listed the shared index for
        several (the owner's loop lists it once a pass, however many wait)."""
        pending = self.pending(ckpt_id)
        if pending is None:
            return None
        shared = self._s.shared
        if shared is not None and refresh:  # what the part nodes shipped a moment ago
            shared.refresh()
        cids = sorted(distinct_chunks(pending.files))
        with self._s.catalog_env.read() as txn:
            absent = [c for c in cids if not self._s.chunks.usable(txn, c)]
        found = shared.lookup(absent) if shared is not None and absent else {}
        if len(found) < len(absent):
            return None

        def op(w: WriteTxn) -> bool:
            rec = self._s.catalog.record(w.catalog, ckpt_id)
            if self._s.catalog.pending.get(w.catalog, ckpt_id) is None:
                return False
            if rec is None or rec.is_tombstone or rec.durable:
                self._s.catalog.pending.drop(w.catalog, ckpt_id)
                return True
            if shared is not None and not all(shared.takeable(e.where.key) for e in found.values()):
                return False  # a pack condemned since the lookup (shared.py, invariant 6)
            now_ms = self._s.now_ms()
            for c, e in found.items():
                self._s.chunks.adopt(w, c, e.where, e.size, e.flags, now_ms, now_ms + ADOPT_HOLD_MS)
            if not all(self._s.chunks.usable(w.catalog, c) for c in cids):
                return False  # one went meanwhile (GC): the next pass looks again
            self._s.catalog.complete(w.catalog, rec, dict(pending.files), now_ms)
            self._s.catalog.pending.drop(w.catalog, ckpt_id)
            return True

        done = self._s.writer.run(op, size=len(found) * 64 + len(cids) * 64)
        return pending.parts if done else None


__all__ = ["ADOPT_HOLD_MS", "Durability"]
