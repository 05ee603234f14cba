"""Upload sessions: open, the missing-chunk query with reservations, chunk PUT, abort.

A session is a catalog record, so it survives a restart: a producer that asked "missing"
before the server restarted can still commit after. Chunks the missing query reports as
present, and chunks uploaded, are reserved until the session expires, so GC cannot remove
them between the query and the commit. The commit itself re-checks every chunk inside the
writer transaction, which is what makes the reservation an optimisation and never the only
guard.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, wait
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol

import lmdb

from checkpoint_vault.protocol import UNPRINTABLE

from .chunking import PROFILES, ChunkingProfile, profile_from_wire
from .content.parts import ContentParts
from .content.reader import Reader
from .content.shared import SharedEntry
from .create import CreateParts, ensure_namespace
from .domains import Domain, cached
from .errors import (
    Conflict,
    HashMismatch,
    InvalidRequest,
    QuotaExceeded,
    TooLarge,
    TooManyUploads,
    UploadExpired,
    UploadNotFound,
    UploadPrepared,
)
from .filehash import RunningHashes
from .frame import ROOM, Encoder, chunk_id
from .ids import new_upload_id
from .manifest import FileEntry
from .names import PARTS, check_chunk_id, check_namespace
from .records import UploadSession
from .sink import ChunkSink, store_all
from .writer import WriteTxn

if TYPE_CHECKING:
    from .clock import Clock


@dataclass(frozen=True)
class Opening:
    """What an upload session is opened with (`Uploads.begin`), checked by the caller."""

    namespace: str
    parent: str | None
    inherit: bool
    metadata: Any
    tags: list[str]
    by: str | None
    profile: dict[str, Any]  # the namespace's chunking profile, if it is made here


class UploadParts(ContentParts, CreateParts, ChunkSink, Protocol):
    """What upload sessions need of the store: reading chunks back (`ContentParts`), making
    the namespace (`CreateParts`), keeping chunks (`ChunkSink`), and the clock for expiry."""

    @property
    def clock(self) -> Clock: ...


MAX_MISSING_QUERY = 100_000
# Bytes of referenced chunks one positioned batch may have hashed from the store (~1 s of
# one core): past it the file's running hash stops there, so a small body of references
# cannot buy unbounded work (the client holds at most half of it, client/aio.py).
MAX_REFERENCED_BYTES = 2 << 30
OPEN_UPLOADS = "open_uploads"  # counter: sessions opened and neither committed nor ended
OPEN_UPLOADS_BY = "open_uploads:"  # + token name: the same counter per token
PENDING_BYTES_BY = "pending_bytes:"  # + token name: new chunk bytes of its open sessions
MAX_TAGS = 64
MAX_TAG_LENGTH = 128
MAX_METADATA_BYTES = 64 << 10  # as compact JSON: 20 MiB per record made listings 63 MB
MAX_METADATA_DEPTH = 32  # nesting of objects and arrays; deeper cannot be serialised safely


def check_tags(tags: Any) -> list[str]:
    if tags is None:
        return []
    if (
        not isinstance(tags, list)
        or len(tags) > MAX_TAGS
        or not all(isinstance(t, str) and 0 < len(t) <= MAX_TAG_LENGTH for t in tags)
    ):
        raise InvalidRequest(
            f"tags must be a list of at most {MAX_TAGS} strings of 1-{MAX_TAG_LENGTH} characters"
        )
    for tag in tags:  # a tag is read back as text (listings, the console, `ckpt ls`)
        if (bad := UNPRINTABLE.search(tag)) is not None:  # protocol/_text.py has the rule
            raise InvalidRequest(
                f"tag {tag[:40]!r} holds U+{ord(bad.group()):04X}: tags may not hold control, "
                "format (bidi, zero-width), line-separator, private-use or surrogate characters"
            )
    return list(dict.fromkeys(tags))


def check_metadata(metadata: Any) -> dict[str, Any]:
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise InvalidRequest("metadata must be a JSON object")
    if _depth(metadata, MAX_METADATA_DEPTH + 1) > MAX_METADATA_DEPTH:
        raise InvalidRequest(f"metadata is nested deeper than {MAX_METADATA_DEPTH} levels")
    try:
        size = len(json.dumps(metadata, separators=(",", ":"), allow_nan=False))
    except ValueError:  # NaN or Infinity: listings would stop being valid JSON
        raise InvalidRequest("metadata must not contain NaN or Infinity") from None
    except TypeError:
        raise InvalidRequest("metadata must hold only JSON values") from None
    if size > MAX_METADATA_BYTES:
        raise TooLarge(f"metadata is {size} bytes as JSON; the limit is {MAX_METADATA_BYTES}")
    return metadata


def _depth(value: Any, stop: int) -> int:
    """Nesting depth of lists and dicts in `value`, counted no further than `stop`."""
    if stop <= 0 or not isinstance(value, (dict, list)):
        return 0
    items = value.values() if isinstance(value, dict) else value
    return 1 + max((_depth(v, stop - 1) for v in items), default=0)


def check_new_checkpoint(
    store: UploadParts, ns: str, parent: Any, inherit: bool, chunking: Any
) -> ChunkingProfile:
    """Checks shared by every way of making a checkpoint (upload session or one-request
    save); returns the chunking profile a namespace created now would get."""
    check_namespace(ns)
    if parent is not None and not isinstance(parent, str):
        raise InvalidRequest("parent must be a checkpoint id, 'latest' or null")
    if inherit and parent is None:
        raise InvalidRequest("inherit needs a parent")
    if chunking is not None:
        return profile_from_wire(chunking, store.config.max_chunk_size)
    return PROFILES[store.config.default_profile]


def _file_key(upload_id: str, name: str = "") -> bytes:
    return upload_id.encode() + b"\0" + name.encode()


def acked_here(session: UploadSession) -> bool:
    """Whether the session's writes are acknowledged once durable on this node, without
    waiting for a sync replica: a part's (vault/parts.py, "Acknowledged here"). Its bytes
    reach the bucket by shipping (the owner's record says when), and the replica still
    ships them behind, in commit order."""
    return session.namespace == PARTS


class Uploads:
    def __init__(self, store: UploadParts) -> None:
        self._s = store
        self._db = store.catalog_env.db["uploads"]
        self._files = store.catalog_env.db["uploadfiles"]
        self._sent = store.catalog_env.db["uploadchunks"]
        # Chunk batches acknowledged before they synced (Writer.stage), per upload: a
        # commit naming them waits for these first (`settle`).
        self._unsynced: dict[str, list[Future[Any]]] = {}
        self._unsynced_lock = threading.Lock()
        # Files hashed as their chunks arrive; referenced chunks are read as a commit would.
        self.running = RunningHashes(Reader(store).hash_into)

    # -- session records --------------------------------------------------------------
    def get(self, txn: lmdb.Transaction, upload_id: str) -> UploadSession:
        raw = txn.get(upload_id.encode(), db=self._db) if len(upload_id) <= 64 else None
        if raw is None:
            raise UploadNotFound(f"upload {upload_id[:64]!r} does not exist")
        return UploadSession.from_json(raw)

    def session(self, upload_id: str) -> UploadSession:
        """A session as stored (committed or not), in its own read transaction."""
        with self._s.catalog_env.read() as txn:
            return self.get(txn, upload_id)

    def live(self, txn: lmdb.Transaction, upload_id: str) -> UploadSession:
        """A session that still accepts chunks and files."""
        session = self.get(txn, upload_id)
        if session.committed:
            raise Conflict(f"upload {upload_id} is already committed as {session.committed}")
        if session.prepared is not None:
            raise UploadPrepared(f"upload {upload_id} is prepared in {session.prepared}")
        if session.expires_at <= self._s.clock.now():
            raise UploadExpired(f"upload {upload_id} expired; open a new one")
        return session

    def put(self, txn: lmdb.Transaction, session: UploadSession) -> None:
        txn.put(session.id.encode(), session.to_json(), db=self._db)

    def files(self, txn: lmdb.Transaction, upload_id: str) -> dict[str, FileEntry]:
        prefix = _file_key(upload_id)
        out: dict[str, FileEntry] = {}
        cur = txn.cursor(db=self._files)
        ok = cur.set_range(prefix)
        while ok and bytes(cur.key()).startswith(prefix):
            name = bytes(cur.key())[len(prefix) :].decode()
            out[name] = FileEntry.from_view(memoryview(bytes(cur.value())))[0]
            ok = cur.next()
        return out

    def put_file(self, txn: lmdb.Transaction, upload_id: str, name: str, entry: FileEntry) -> None:
        """Make `entry` the upload's file `name` (writer thread; a prepare, vault/txn.py)."""
        txn.put(_file_key(upload_id, name), entry.to_bytes(), db=self._files)

    def sent(self, txn: lmdb.Transaction, upload_id: str, cid: bytes) -> bool:
        """Did this session send the bytes of `cid` (chunk PUT or batch)?"""
        return txn.get(_file_key(upload_id) + cid, db=self._sent) is not None

    def present(self, txn: lmdb.Transaction, upload_id: str, cid: bytes, domain: Domain) -> bool:
        """May this session count `cid` as stored without sending it? Only if it is stored
        and sound, and either referenced inside the caller's domain or sent by this session
        (vault/domains.py): elsewhere the vault must not confirm it exists."""
        meta = self._s.chunks.meta(txn, cid)
        if meta is None or meta.damaged:
            return False
        return self._s.catalog.nsrefs.visible(txn, cid, domain) or self.sent(txn, upload_id, cid)

    def drop(self, txn: lmdb.Transaction, upload_id: str, keep_session: bool) -> None:
        for name in self.files(txn, upload_id):
            txn.delete(_file_key(upload_id, name), db=self._files)
        prefix = _file_key(upload_id)
        cur = txn.cursor(db=self._sent)
        if cur.set_range(prefix):
            while bytes(cur.key()).startswith(prefix):
                if not cur.delete():
                    break
        if not keep_session:
            txn.delete(upload_id.encode(), db=self._db)

    def committed(self, txn: lmdb.Transaction, session: UploadSession, ckpt_id: str) -> None:
        """End `session` as committed as `ckpt_id`, in the commit's transaction: its files
        and sent marks go, the session stays (a retry answers the same checkpoint)."""
        session.committed = ckpt_id
        self.count(txn, session, -1)
        self.put(txn, session)
        self.drop(txn, session.id, keep_session=True)

    def count(self, txn: lmdb.Transaction, session: UploadSession, delta: int) -> None:
        """Open-session counters, total and per token: +1 at open, -1 when it ends (its
        pending bytes end with it)."""
        self._s.counters.add(txn, OPEN_UPLOADS, delta)
        if session.created_by is not None:
            self._s.counters.add(txn, OPEN_UPLOADS_BY + session.created_by, delta)
            if delta < 0 and session.sent_bytes:
                key = PENDING_BYTES_BY + session.created_by
                self._s.counters.add(txn, key, -session.sent_bytes)

    def charge(self, txn: lmdb.Transaction, upload_id: str, nbytes: int) -> None:
        """Count `nbytes` of new chunks against the session's token (writer thread, in the
        transaction storing them, so refusing stores nothing)."""
        session = self.get(txn, upload_id)
        if nbytes <= 0 or session.created_by is None:
            return
        key = PENDING_BYTES_BY + session.created_by
        limit = self._s.config.max_pending_bytes_per_token
        pending = self._s.counters.get(txn, key)
        if pending + nbytes > limit:
            raise QuotaExceeded(
                f"token {session.created_by!r} holds {pending} bytes in uncommitted uploads "
                f"(limit {limit}); commit or abort them first"
            )
        session.sent_bytes += nbytes
        self.put(txn, session)
        self._s.counters.add(txn, key, nbytes)

    def _check_limits(self, txn: lmdb.Transaction, by: str | None) -> None:
        limit = self._s.config.max_upload_sessions
        if limit and self._s.counters.get(txn, OPEN_UPLOADS) >= limit:
            raise TooManyUploads(
                f"{limit} upload sessions are open; commit or abort some, or let them expire"
            )
        mine = self._s.config.max_upload_sessions_per_token
        if by is not None and self._s.counters.get(txn, OPEN_UPLOADS_BY + by) >= mine:
            raise TooManyUploads(
                f"token {by!r} has {mine} upload sessions open; commit or abort some "
                "(an admin can list and abort them: GET /v1/admin/uploads)"
            )

    def open_sessions(self) -> list[UploadSession]:
        """Sessions neither committed nor expired nor aborted (for admins), oldest first."""
        now = self._s.clock.now()
        live = [UploadSession.from_json(v) for _, v in self._s.catalog_env.scan("uploads")]
        return sorted(
            (s for s in live if not s.committed and s.expires_at > now),
            key=lambda s: s.created_at,
        )

    # -- operations -------------------------------------------------------------------
    def open(
        self,
        ns: str,
        parent: str | None,
        inherit: bool,
        metadata: Any,
        tags: Any,
        chunking: Any = None,
        by: str | None = None,
    ) -> tuple[UploadSession, ChunkingProfile]:
        wanted = check_new_checkpoint(self._s, ns, parent, inherit, chunking)
        metadata = check_metadata(metadata)
        tags = check_tags(tags)

        def op(w: WriteTxn) -> tuple[UploadSession, ChunkingProfile]:
            now = self._s.clock.now()
            fields = Opening(ns, parent, bool(inherit), metadata, tags, by, asdict(wanted))
            return self.begin(w.catalog, fields, self.fresh_id(), now + self._s.config.upload_ttl)

        return self._s.writer.run(op)

    def fresh_id(self) -> str:
        return self._s.config.upload_id_prefix + new_upload_id()

    def begin(
        self, txn: lmdb.Transaction, o: Opening, upload_id: str, expires_at: float
    ) -> tuple[UploadSession, ChunkingProfile]:
        """An upload session opened in the writer's `txn`: the limits checked, the namespace
        made if new, the parent resolved; every way of opening one (uploads, parts, a
        commit of parts) goes through here."""
        now = self._s.clock.now()
        self._check_limits(txn, o.by)
        ns_rec = ensure_namespace(self._s, txn, o.namespace, o.profile, now)
        parent_id = None
        if o.parent is not None:
            parent_id = self._s.catalog.resolve(txn, o.namespace, o.parent).id
        session = UploadSession(
            id=upload_id,
            namespace=o.namespace,
            parent=parent_id,
            inherit=o.inherit,
            metadata=o.metadata,
            tags=o.tags,
            created_at=now,
            expires_at=expires_at,
            created_by=o.by,
        )
        self.put(txn, session)
        self.count(txn, session, +1)
        return session, ns_rec.chunking()

    def missing(self, upload_id: str, ids: Any, domain: Domain = None) -> list[str]:
        """Ids this session must send: not stored, damaged, or stored only outside the
        caller's `domain`. The others are reserved until the session expires; chunks
        outside the domain never are, so a query cannot keep another tenant's deleted
        data alive."""
        if not isinstance(ids, list) or len(ids) > MAX_MISSING_QUERY:
            raise InvalidRequest(f"chunks must be a list of at most {MAX_MISSING_QUERY} ids")
        raw_ids = [check_chunk_id(i) for i in ids]
        self.settle(upload_id)  # chunks this session sent count as sent
        domain = cached(domain)
        with self._s.catalog_env.read() as txn:
            session = self.live(txn, upload_id)
            here = [self.present(txn, upload_id, c, domain) for c in raw_ids]
        until_ms = int(session.expires_at * 1000)
        shared = self._shared(raw_ids, here, domain)
        missing = [
            i for i, c, ok in zip(ids, raw_ids, here, strict=True) if not ok and c not in shared
        ]
        to_reserve = [c for c, ok in zip(raw_ids, here, strict=True) if ok]
        if to_reserve or shared:
            prefix = _file_key(upload_id)
            now_ms = self._s.now_ms()

            index = self._s.shared

            def op(w: WriteTxn) -> set[bytes]:
                for c in to_reserve:
                    meta = self._s.chunks.meta(w.catalog, c)
                    if meta is not None:
                        self._s.chunks.reserve(w.catalog, c, meta, until_ms)
                refused = set()
                for c, e in shared.items():
                    if index is None or not index.takeable(e.where.key):
                        refused.add(c)  # condemned since the lookup: the producer sends it
                        continue
                    self._s.chunks.adopt(w, c, e.where, e.size, e.flags, now_ms, until_ms)
                    w.catalog.put(prefix + c, b"", db=self._sent)  # counts as sent
                return refused

            refused = self._s.writer.run(
                op, size=(len(to_reserve) + len(shared)) * 64, local=acked_here(session)
            )
            if refused:
                missing = [
                    i
                    for i, c, ok in zip(ids, raw_ids, here, strict=True)
                    if not ok and (c not in shared or c in refused)
                ]
        return missing

    def _shared(
        self, ids: list[bytes], here: list[bool], domain: Domain
    ) -> dict[bytes, SharedEntry]:
        """Chunks absent here that another node shipped to the shared tier. Only for
        callers without a dedup domain: the shared index knows no namespaces, so a tenant
        confined to some must prove it holds the bytes by sending them (vault/domains.py)."""
        index = self._s.shared
        absent = [c for c, ok in zip(ids, here, strict=True) if not ok]
        if index is None or domain is not None or not absent:
            return {}
        return index.lookup(absent)

    def _placed(
        self,
        txn: lmdb.Transaction,
        upload_id: str,
        chunks: Sequence[tuple[bytes, bytes | memoryview | None]],
        carried: Mapping[bytes, bytes | memoryview],
        domain: Domain,
    ) -> list[tuple[bytes, bytes | memoryview | int]] | None:
        """A positioned batch for the running hash: its chunks in order, a reference as
        (id, size) to read from the store; None if one names a chunk the caller may not
        count as stored, or they add up past MAX_REFERENCED_BYTES (the file's running hash
        then stops at this batch)."""
        out: list[tuple[bytes, bytes | memoryview | int]] = []
        referenced = 0
        for cid, data in chunks:
            if data is None:
                data = carried.get(cid)
            if data is not None:
                out.append((cid, data))
                continue
            meta = self._s.chunks.meta(txn, cid)
            if meta is None or not self.present(txn, upload_id, cid, domain):
                return None
            referenced += meta.size
            if referenced > MAX_REFERENCED_BYTES:
                return None
            out.append((cid, meta.size))
        return out

    def put_chunk(self, upload_id: str, cid: str, data: bytes, domain: Domain = None) -> bool:
        """Store one chunk named by its hex id; True if it was new (or healed) to the
        caller: stored only outside its `domain` also answers True."""
        created = self.put_chunks(upload_id, [(check_chunk_id(cid), data)], domain)
        self.settle(upload_id)  # one chunk: answered "stored" once it is durable
        return created == 1

    def put_chunks(
        self,
        upload_id: str,
        chunks: Sequence[tuple[bytes, bytes | memoryview | None]],
        domain: Domain = None,
        in_place: bool = False,
        at: tuple[str, int] | None = None,
        named_here: bool = False,
    ) -> int:
        """Store client-chunked chunks (raw id, plaintext); returns how many were new *to
        the caller*: a chunk stored only outside its `domain` counts as created, so the
        answer confirms nothing about other tenants (bytes are still stored once).
        `in_place`: each plaintext is a writable view that starts `frame.ROOM` spare bytes
        early, and raw frames are built there instead of copied (a received batch body).
        `at`: (file name, offset) where these chunks lie, in order, in a file of this upload:
        the file's hash runs as they arrive (vault/filehash.py). A plaintext None is a
        reference to a chunk the caller may count as stored (`present`), there only for
        `at`; references to anything else store nothing and answer the same, and the file
        is read back at its commit. `named_here`: the ids were computed from these very
        bytes in this process (a file the server read itself), so they are not hashed twice.

        Every chunk is checked before any is stored, so a bad one changes nothing.
        """
        if at is None and any(data is None for _, data in chunks):
            raise InvalidRequest("chunk references need the batch's place: ?file=&offset=")
        spans = {}
        if in_place:
            spans = {cid: memoryview(span) for cid, span in chunks if span is not None}
            chunks = [(c, None if s is None else memoryview(s)[ROOM:]) for c, s in chunks]
        limit = self._s.config.max_chunk_size
        carried: dict[bytes, bytes | memoryview] = {}  # chunks that came with bytes
        for cid, data in chunks:
            if data is None:
                continue
            if len(data) > limit:
                raise TooLarge(f"chunk {cid.hex()} is larger than {limit} bytes")
            if not named_here and chunk_id(data) != cid:
                raise HashMismatch(f"BLAKE3 of the data does not match chunk id {cid.hex()}")
            carried[cid] = data
        domain = cached(domain)
        with self._s.catalog_env.read() as txn:
            session = self.live(txn, upload_id)
            known = {cid for cid in carried if self._s.chunks.usable(txn, cid)}
            seen = {cid for cid in known if self.present(txn, upload_id, cid, domain)}
            placed = None if at is None else self._placed(txn, upload_id, chunks, carried, domain)
        if at is not None and placed is None:
            # A reference may name a chunk of this upload's previous batch, answered once
            # applied, a moment before its transaction is visible: wait for those, look again.
            self.settle(upload_id)
            with self._s.catalog_env.read() as txn:
                placed = self._placed(txn, upload_id, chunks, carried, domain)
        if at is not None and placed is not None:
            self.running.feed(upload_id, at[0], at[1], placed)
        encoder = Encoder()
        items: dict[bytes, tuple[bytes | memoryview, bytes | memoryview | None]] = {
            cid: (data, None if cid in known else _frame(encoder, data, spans.get(cid)))
            for cid, data in carried.items()
        }
        until_ms = int(session.expires_at * 1000)
        prefix = _file_key(upload_id)

        # Charged: bytes new to the caller (not in its domain, not sent by this session),
        # whether or not another tenant stored them: else the limit would be an oracle.
        fresh = sum(len(d) for c, (d, _) in items.items() if c not in seen)

        def op(w: WriteTxn) -> int:
            self.charge(w.catalog, upload_id, fresh)
            written = len(store_all(self._s, w, items, until_ms))
            for cid in items:
                w.catalog.put(prefix + cid, b"", db=self._sent)
            return written + len(known - seen)

        created, durable = self._s.writer.stage(
            op,
            size=sum(len(f) for _, f in items.values() if f is not None),
            local=acked_here(session),
        )
        with self._unsynced_lock:
            pending = [f for f in self._unsynced.get(upload_id, ()) if not f.done()]
            self._unsynced[upload_id] = [*pending, durable]
        return created

    def settle(self, upload_id: str) -> None:
        """Wait until every chunk batch this upload was answered for is durable (or failed:
        its chunks are then simply missing, which the commit reports)."""
        with self._unsynced_lock:
            pending = self._unsynced.pop(upload_id, [])
        wait(pending)

    def add_file(self, upload_id: str, name: str, entry: FileEntry) -> None:
        self.add_files(upload_id, {name: entry})

    def add_files(self, upload_id: str, files: Mapping[str, FileEntry]) -> None:
        """Files into a live upload, in one writer transaction (a commit of many hosts'
        parts names them all at once: one transaction, and one wait for a sync replica,
        rather than one per file)."""

        def op(w: WriteTxn) -> None:
            self.live(w.catalog, upload_id)
            for name, entry in files.items():
                w.catalog.put(_file_key(upload_id, name), entry.to_bytes(), db=self._files)

        local = acked_here(self.session(upload_id))
        size = sum(len(e.chunks) for e in files.values()) * 36
        self._s.writer.run(op, size=size, local=local)

    def remove_file(self, upload_id: str, name: str) -> bool:
        """Take a file back out of a live upload (an S3 client deleting or renaming an
        object it wrote into the open checkpoint, api/s3/); True if it was there. Its
        chunks stay stored until GC finds them unreferenced."""

        def op(w: WriteTxn) -> bool:
            self.live(w.catalog, upload_id)
            return bool(w.catalog.delete(_file_key(upload_id, name), db=self._files))

        return self._s.writer.run(op)

    def abort(self, upload_id: str) -> None:
        def op(w: WriteTxn) -> None:
            session = self.get(w.catalog, upload_id)
            if session.committed:
                raise Conflict(f"upload {upload_id} is already committed as {session.committed}")
            if session.prepared is not None:  # its transaction's decision ends it
                raise UploadPrepared(f"upload {upload_id} is prepared in {session.prepared}")
            self.drop(w.catalog, upload_id, keep_session=False)
            self.count(w.catalog, session, -1)

        self.settle(upload_id)
        self.running.forget(upload_id)
        self._s.writer.run(op)

    def expire(self) -> int:
        """Delete sessions past expiry (committed or not); their reservations lapse with them."""
        now = self._s.clock.now()
        expired = [
            k.decode()
            for k, v in self._s.catalog_env.scan("uploads")
            if UploadSession.from_json(v).expires_at <= now
        ]
        if not expired:
            return 0
        with self._unsynced_lock:
            for upload_id in expired:
                self._unsynced.pop(upload_id, None)

        def op(w: WriteTxn) -> int:
            txn = w.catalog
            n = 0
            for upload_id in expired:
                try:
                    session = self.get(txn, upload_id)
                except UploadNotFound:
                    continue
                if session.prepared is not None and not session.committed:
                    continue  # only its transaction's decision ends it (vault/txn.py)
                if session.expires_at <= now:
                    self.drop(txn, upload_id, keep_session=False)
                    if not session.committed:
                        self.count(txn, session, -1)
                    n += 1
            return n

        return self._s.writer.run(op)


def _frame(
    encoder: Encoder, data: bytes | memoryview, span: memoryview | None
) -> bytes | memoryview:
    return encoder.encode(data) if span is None else encoder.encode_in_place(span)
