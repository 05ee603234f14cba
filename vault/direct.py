"""Small checkpoints in one request and one writer transaction.

An agent saving its state after every step cannot afford an upload session's four round
trips and three synced transactions. Here the caller hands over every file's bytes at once;
chunking, hashing and compression happen on the calling thread, and a single writer
transaction creates the namespace if needed, stores the chunks and commits the checkpoint:
one fsync. An idempotency key makes a retried save return the checkpoint the first attempt
made, so clients may retry it like every other step.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

import blake3
import lmdb

from .chunking import ChunkingProfile
from .errors import Conflict, InvalidRequest
from .frame import Encoder, chunk_id
from .manifest import FileEntry
from .names import check_file_name
from .records import CheckpointRecord, NamespaceRecord, UploadSession
from .store import Store, store_all
from .uploads import Uploads, check_metadata, check_new_checkpoint, check_tags
from .writer import WriteTxn

_KEY = re.compile(r"[A-Za-z0-9_-]{16,64}")


class DirectSaver:
    def __init__(self, store: Store, uploads: Uploads) -> None:
        self._s = store
        self._uploads = uploads

    def save(
        self,
        ns: str,
        files: Mapping[str, bytes],
        *,
        parent: Any = None,
        inherit: bool = False,
        metadata: Any = None,
        tags: Any = None,
        chunking: Any = None,
        key: str | None = None,
    ) -> tuple[CheckpointRecord, bool]:
        """Create a checkpoint from in-memory files; returns (record, created)."""
        wanted = self._check(ns, files, parent, inherit, key, chunking)
        metadata, tags = check_metadata(metadata), check_tags(tags)
        with self._s.env.read() as txn:
            ns_rec = self._s.catalog.namespace(txn, ns)
            if key is not None and (done := self._replay(txn, key, ns)) is not None:
                return done, False
        profile = ns_rec.chunking() if ns_rec is not None else wanted
        entries, items = self._cut(files, profile)

        def op(w: WriteTxn) -> tuple[CheckpointRecord, bool]:
            txn = w.cat
            if key is not None and (done := self._replay(txn, key, ns)) is not None:
                return done, False
            now = self._s.clock.now()
            current = self._s.catalog.namespace(txn, ns)
            if current is None:
                self._s.catalog.put_namespace(txn, NamespaceRecord(ns, asdict(profile), now))
            elif current.chunking() != profile:
                raise Conflict(f"namespace {ns!r} changed its chunking profile; save again")
            parent_id = self._s.catalog.resolve(txn, ns, parent).id if parent else None
            # Referenced by the checkpoint made in this same transaction: no reservation.
            store_all(self._s, w, items, 0, inline=True)
            all_files = dict(entries)
            if inherit and parent_id is not None:
                for name, entry in self._s.catalog.manifest(txn, parent_id).items():
                    all_files.setdefault(name, entry)
            rec = self._s.catalog.create(
                txn,
                self._s.ids.next(int(now * 1000)),
                ns,
                parent_id,
                metadata,
                tags,
                all_files,
                now,
            )
            if key is not None:
                self._uploads.put(
                    txn,
                    UploadSession(
                        id=key,
                        namespace=ns,
                        parent=parent_id,
                        inherit=inherit,
                        metadata={},
                        tags=[],
                        created_at=now,
                        expires_at=now + self._s.config.upload_ttl,
                        committed=rec.id,
                    ),
                )
            return rec, True

        size = sum(len(f) for _, f in items.values() if f is not None)
        return self._s.writer.run(op, size=size)

    def _check(
        self,
        ns: str,
        files: Mapping[str, bytes],
        parent: Any,
        inherit: bool,
        key: str | None,
        chunking: Any,
    ) -> ChunkingProfile:
        """Validate the request; return the profile a new namespace would get."""
        for name in files:
            check_file_name(name)
        if key is not None and not _KEY.fullmatch(key):
            raise InvalidRequest("idempotency key must be 16-64 characters of [A-Za-z0-9_-]")
        return check_new_checkpoint(self._s, ns, parent, inherit, chunking)

    def _replay(self, txn: lmdb.Transaction, key: str, ns: str) -> CheckpointRecord | None:
        """The checkpoint an earlier attempt with this key made, if any."""
        raw = txn.get(key.encode(), db=self._s.env.db["uploads"])
        if raw is None:
            return None
        session = UploadSession.from_json(raw)
        rec = self._s.catalog.record(txn, session.committed or "")
        if rec is None or session.namespace != ns:
            raise Conflict(f"idempotency key {key!r} is in use by another request")
        return rec

    def _cut(
        self, files: Mapping[str, bytes], profile: ChunkingProfile
    ) -> tuple[dict[str, FileEntry], dict[bytes, tuple[bytes | memoryview, bytes | None]]]:
        cdc = profile.chunker()
        entries: dict[str, FileEntry] = {}
        pieces: dict[bytes, memoryview] = {}
        for name, data in files.items():
            chunks = [c.data for c in cdc.cut_buf(data)] if data else []
            ids = [chunk_id(c) for c in chunks]
            pieces.update(zip(ids, chunks, strict=True))
            entries[name] = FileEntry(
                len(data),
                blake3.blake3(data).digest(),
                tuple(zip(ids, (len(c) for c in chunks), strict=True)),
            )
        with self._s.env.read() as txn:
            known = {c for c in pieces if self._s.blocks.usable(txn, c)}
        encoder = Encoder()
        items: dict[bytes, tuple[bytes | memoryview, bytes | None]] = {
            c: (d, None if c in known else encoder.encode(d)) for c, d in pieces.items()
        }
        return entries, items
