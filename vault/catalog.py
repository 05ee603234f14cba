"""The metadata catalog: checkpoints, manifests, namespaces and the per-namespace index.

Transaction-level helpers; the writer thread composes them into atomic operations (commit,
delete, patch) and read paths use them under a read transaction. The namespace index holds
live checkpoints only, keyed namespace + NUL + id, so "newest first" is a reverse scan and
deleted checkpoints survive only as tombstone records reachable through lineage. The tag
index does the same per (namespace, tag), so finding a checkpoint by tag (how the LangGraph
saver finds its checkpoints by their own ids) does not read every newer record.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import blake3
import lmdb

from . import recordpack
from .content.chunks import Chunks
from .domains import NamespaceRefs
from .entries import Entries, entry_digest
from .env import Env
from .errors import CheckpointNotFound, InvalidRequest, NamespaceNotFound
from .manifest import (
    FileEntry,
    decode_entry_refs,
    decode_manifest,
    distinct_chunks,
    encode_entry_refs,
)
from .pending import PendingTable
from .records import NamespaceRecord, StoredCheckpoint

LATEST = "latest"
LATEST_VALID = "latest-valid"
MAX_LINEAGE = 100_000


# Manifests a recount reads between two looks at its caller's stop (a few ms of work).
RECOUNT_STEP = 1024
TAG_INDEX_BUILT = "tag_index_built"  # counter: 1 once the tag index covers every checkpoint


def _index_key(ns: str, cid: str = "") -> bytes:
    return ns.encode() + b"\0" + cid.encode()


def _tag_key(ns: str, tag: str, cid: str = "") -> bytes:
    """Fixed-width tag hash: any tag string, and no prefix of one tag is another's key."""
    return ns.encode() + b"\0" + blake3.blake3(tag.encode()).digest()[:16] + cid.encode()


def _newest_first(cur: lmdb.Cursor, prefix: bytes, start: bytes) -> Iterator[str]:
    """Keys under `prefix` strictly below `start`, newest (largest) first, as ids."""
    if not cur.set_range(start) and not cur.last():
        return
    while True:
        key = bytes(cur.key())
        if key.startswith(prefix) and key < start:
            yield key[len(prefix) :].decode()
        elif key < prefix:
            return
        if not cur.prev():
            return


def _put(txn: lmdb.Transaction, key: bytes, value: bytes, db: lmdb._Database) -> None:
    txn.put(key, value, db=db)


def _put_last(txn: lmdb.Transaction, key: bytes, value: bytes, db: lmdb._Database) -> None:
    """Put, appending when `key` sorts after every key of `db` (new checkpoint ids do).
    LMDB splits a full page in the middle, so keys inserted in order leave every page half
    empty; an append starts a fresh page instead and the pages behind stay full (measured:
    900 records took 450 pages, 55% full)."""
    cur = txn.cursor(db=db)
    last = bytes(cur.key()) if cur.last() else None
    txn.put(key, value, db=db, append=last is not None and key > last)


class Catalog:
    def __init__(self, env: Env, chunks: Chunks) -> None:
        self._records = env.db["checkpoints"]
        self._manifests = env.db["manifests"]
        self.pending = PendingTable(env.db["pending"])
        self._index = env.db["nsindex"]
        self._tags = env.db["tagindex"]
        self._namespaces = env.db["namespaces"]
        self._chunks = chunks
        self._counters = chunks.counters
        self.nsrefs = NamespaceRefs(env)
        self.entries = Entries(env, chunks)

    # -- namespaces -------------------------------------------------------------------
    def namespace(self, txn: lmdb.Transaction, ns: str) -> NamespaceRecord | None:
        raw = txn.get(ns.encode(), db=self._namespaces)
        return NamespaceRecord.from_json(raw) if raw is not None else None

    def require_namespace(self, txn: lmdb.Transaction, ns: str) -> NamespaceRecord:
        rec = self.namespace(txn, ns)
        if rec is None:
            raise NamespaceNotFound(f"namespace {ns!r} does not exist")
        return rec

    def put_namespace(self, txn: lmdb.Transaction, rec: NamespaceRecord) -> None:
        txn.put(rec.name.encode(), rec.to_json(), db=self._namespaces)

    def namespaces(self, txn: lmdb.Transaction) -> Iterator[NamespaceRecord]:
        for _, raw in txn.cursor(db=self._namespaces):
            yield NamespaceRecord.from_json(raw)

    def namespaces_under(
        self, txn: lmdb.Transaction, prefix: str, match: Callable[[str], bool]
    ) -> Iterator[NamespaceRecord]:
        """Records of the namespaces whose names start with `prefix` and pass `match`
        (one cursor range; only matching records are decoded)."""
        start = prefix.encode()
        cur = txn.cursor(db=self._namespaces)
        ok = cur.set_range(start)
        while ok:
            key = bytes(cur.key())
            if not key.startswith(start):
                return
            if match(key.decode()):
                yield NamespaceRecord.from_json(cur.value())
            ok = cur.next()

    # -- checkpoints ------------------------------------------------------------------
    def record(self, txn: lmdb.Transaction, cid: str) -> StoredCheckpoint | None:
        raw = txn.get(cid.encode(), db=self._records)
        if raw is None:
            return None
        rec = StoredCheckpoint.from_json(recordpack.unpack(raw))
        if rec.files_elided and not rec.is_tombstone:
            rec.files = self._file_infos(txn, cid)
        return rec

    def put_record(self, txn: lmdb.Transaction, rec: StoredCheckpoint, new: bool = False) -> None:
        """Store a record (`new`: a checkpoint id never stored, so possibly an append).

        Its `files` (names, sizes, hashes: ~60% of a packed agent record, the hashes being
        incompressible) are left out when the manifest names stored entries, which hold
        the same sizes and hashes, and for tombstones, which show no files."""
        raw = None if new else txn.get(rec.id.encode(), db=self._manifests)
        with_files = not new and not rec.is_tombstone and decode_entry_refs(raw or b"") is None
        put = _put_last if new else _put
        put(txn, rec.id.encode(), recordpack.pack(rec.to_json(with_files)), self._records)

    def _file_infos(self, txn: lmdb.Transaction, cid: str) -> dict[str, dict[str, Any]]:
        """A live record's `files` from its manifest of entry references."""
        raw = txn.get(cid.encode(), db=self._manifests)
        if raw is None:  # only through catalog damage: check() reports it
            raise CheckpointNotFound(f"checkpoint {cid} has no manifest of its files")
        refs = decode_entry_refs(raw)
        if refs is None:
            whole = decode_manifest(raw)
            return {n: {"size": e.size, "hash": e.hash.hex()} for n, e in whole.items()}
        files: dict[str, dict[str, Any]] = {}
        for name, digest in refs.items():
            head = self.entries.head(txn, digest)
            if head is None:
                raise CheckpointNotFound(f"checkpoint {cid}: file entry of {name!r} is missing")
            files[name] = {"size": head[0], "hash": head[1].hex()}
        return files

    def manifest(self, txn: lmdb.Transaction, cid: str) -> dict[str, FileEntry]:
        raw = txn.get(cid.encode(), db=self._manifests)
        if raw is None:
            pending = self.pending.get(txn, cid)  # not adopted yet: its files (pending.py)
            if pending is not None:
                return dict(pending.files)
            raise CheckpointNotFound(f"checkpoint {cid} has no manifest (deleted?)")
        return self._decode(txn, cid, raw, {})

    def _decode(
        self,
        txn: lmdb.Transaction,
        cid: str,
        raw: bytes | memoryview,
        seen: dict[bytes, FileEntry],
    ) -> dict[str, FileEntry]:
        """Either stored form as whole entries; `seen` caches entries across calls."""
        refs = decode_entry_refs(raw)
        if refs is None:
            return decode_manifest(raw)
        files: dict[str, FileEntry] = {}
        for name, digest in refs.items():
            entry = seen.get(digest) or self.entries.get(txn, digest)
            if entry is None:  # only through catalog damage; check() reports it
                raise CheckpointNotFound(f"checkpoint {cid}: file entry of {name!r} is missing")
            seen[digest] = files[name] = entry
        return files

    def ids(self, txn: lmdb.Transaction, ns: str, before: str | None = None) -> Iterator[str]:
        """Live checkpoint ids of `ns`, newest first, strictly older than `before`."""
        start = _index_key(ns, before) if before else _index_key(ns, "\x7f")
        yield from _newest_first(txn.cursor(db=self._index), _index_key(ns), start)

    def tagged_ids(
        self, txn: lmdb.Transaction, ns: str, tag: str, before: str | None = None
    ) -> Iterator[str]:
        """Live checkpoint ids of `ns` carrying `tag`, newest first, older than `before`."""
        start = _tag_key(ns, tag, before) if before else _tag_key(ns, tag, "\x7f")
        yield from _newest_first(txn.cursor(db=self._tags), _tag_key(ns, tag), start)

    def retag(self, txn: lmdb.Transaction, rec: StoredCheckpoint, tags: list[str]) -> None:
        """Replace a live checkpoint's tags, index included (the caller stores the record)."""
        for tag in rec.tags:
            txn.delete(_tag_key(rec.namespace, tag, rec.id), db=self._tags)
        rec.tags = tags
        for tag in tags:
            txn.put(_tag_key(rec.namespace, tag, rec.id), b"", db=self._tags)

    def build_tag_index(self, txn: lmdb.Transaction) -> int:
        """Index every live checkpoint's tags (catalogs written before the index existed);
        returns how many entries it wrote."""
        n = 0
        for key, _ in txn.cursor(db=self._index):
            rec = self.record(txn, bytes(key).split(b"\0", 1)[1].decode())
            if rec is None:
                continue
            for tag in rec.tags:
                txn.put(_tag_key(rec.namespace, tag, rec.id), b"", db=self._tags)
                n += 1
        self._counters.add(txn, TAG_INDEX_BUILT, 1)
        return n

    def latest(
        self, txn: lmdb.Transaction, ns: str, valid_only: bool, durable_only: bool = False
    ) -> StoredCheckpoint | None:
        """`durable_only`: skip commits of parts not adopted yet (vault/pending.py)."""
        for cid in self.ids(txn, ns):
            rec = self.record(txn, cid)
            if rec is None or (durable_only and not rec.durable):
                continue
            if not valid_only or rec.validity.state != "invalid":
                return rec
        return None

    def resolve(
        self, txn: lmdb.Transaction, ns: str, ref: str, durable: bool = False
    ) -> StoredCheckpoint:
        """A live checkpoint of `ns` by id, `latest` or `latest-valid` (`durable`: the
        newest whose parts are all adopted)."""
        if ref in (LATEST, LATEST_VALID):
            self.require_namespace(txn, ns)
            rec = self.latest(txn, ns, valid_only=ref == LATEST_VALID, durable_only=durable)
            if rec is None:
                what = f"durable {ref}" if durable else ref
                raise CheckpointNotFound(f"namespace {ns!r} has no {what} checkpoint")
            return rec
        rec = self.record(txn, ref)
        if rec is None or rec.namespace != ns or rec.is_tombstone:
            state = "was deleted" if rec is not None and rec.is_tombstone else "does not exist"
            raise CheckpointNotFound(f"checkpoint {ref!r} {state} in namespace {ns!r}")
        return rec

    def resolve_id(self, txn: lmdb.Transaction, ns: str, ref: str) -> str:
        """`resolve(...).id`, without decoding the record when `ref` is an id: a live
        checkpoint of `ns` is one in its index (a save naming its parent asks this inside
        the writer's transaction, where each record decoded is time every save waits)."""
        index = self._index  # values are empty: found is "not None" (b"" is false)
        if ref not in (LATEST, LATEST_VALID) and txn.get(_index_key(ns, ref), db=index) is not None:
            return ref
        return self.resolve(txn, ns, ref).id

    def lineage(self, txn: lmdb.Transaction, rec: StoredCheckpoint) -> list[StoredCheckpoint]:
        chain = [rec]
        seen = {rec.id}
        while chain[-1].parent and len(chain) < MAX_LINEAGE:
            parent = self.record(txn, chain[-1].parent)
            if parent is None or parent.id in seen:
                break
            seen.add(parent.id)
            chain.append(parent)
        return chain

    # -- changes (writer thread) ------------------------------------------------------
    def create(
        self,
        txn: lmdb.Transaction,
        cid: str,
        ns: str,
        parent: str | None,
        metadata: dict[str, Any],
        tags: list[str],
        files: dict[str, FileEntry],
        now: float,
        created_by: str | None = None,
        ns_rec: NamespaceRecord | None = None,
    ) -> StoredCheckpoint:
        """Build the record of a new checkpoint with these files and make it visible
        (`ns_rec`: its namespace's record, if the caller read it in this transaction)."""
        rec = StoredCheckpoint(
            id=cid,
            namespace=ns,
            parent=parent,
            created_at=now,
            metadata=metadata,
            tags=tags,
            files={},
            size=sum(e.size for e in files.values()),
            created_by=created_by,
        )
        rec.set_files(files)
        self.add(txn, rec, files, int(now * 1000), ns_rec)
        return rec

    def add(
        self,
        txn: lmdb.Transaction,
        rec: StoredCheckpoint,
        files: dict[str, FileEntry],
        now_ms: int,
        ns_rec: NamespaceRecord | None = None,
    ) -> None:
        """Make a checkpoint visible: record, manifest, index, counts, references."""
        self.put_record(txn, rec, new=True)
        self._reference(txn, rec, files, now_ms)
        self._show(txn, rec, ns_rec)

    def add_pending(self, txn: lmdb.Transaction, rec: StoredCheckpoint) -> None:
        """Make a checkpoint visible before its manifest exists (vault/pending.py): the
        record keeps its files, nothing is referenced until `complete`."""
        self.put_record(txn, rec)
        self._show(txn, rec)

    def complete(
        self, txn: lmdb.Transaction, rec: StoredCheckpoint, files: dict[str, FileEntry], now_ms: int
    ) -> None:
        """A pending checkpoint's manifest and references, once every chunk is here."""
        self._reference(txn, rec, files, now_ms)
        rec.durable = True
        self.put_record(txn, rec)

    def _reference(
        self, txn: lmdb.Transaction, rec: StoredCheckpoint, files: dict[str, FileEntry], now_ms: int
    ) -> None:
        refs = {name: entry_digest(entry) for name, entry in files.items()}
        # Only an entry of several chunks may be stored as a delta (Entries._delta)
        several = any(len(entry.chunks) > 1 for entry in files.values())
        bases = self._delta_bases(txn, rec) if several else {}
        _put_last(txn, rec.id.encode(), encode_entry_refs(refs), self._manifests)
        for name, digest in refs.items():
            self.entries.add(txn, digest, files[name], now_ms, bases.get(name))
        # the dedup-domain index counts per namespace
        self.nsrefs.add(txn, rec.namespace, distinct_chunks(files), +1)

    def _show(
        self, txn: lmdb.Transaction, rec: StoredCheckpoint, ns: NamespaceRecord | None = None
    ) -> None:
        if ns is None:
            ns = self.require_namespace(txn, rec.namespace)
        _put_last(txn, _index_key(rec.namespace, rec.id), b"", self._index)
        for tag in rec.tags:
            txn.put(_tag_key(rec.namespace, tag, rec.id), b"", db=self._tags)
        ns.checkpoints += 1
        ns.logical_bytes += rec.size
        ns.emptied_at = None
        self.put_namespace(txn, ns)
        self._counters.add(txn, "checkpoints", 1)
        self._counters.add(txn, "logical_bytes", rec.size)

    def remove(self, txn: lmdb.Transaction, rec: StoredCheckpoint, now: float) -> None:
        """Replace a checkpoint by its tombstone and drop its references."""
        if rec.is_tombstone:
            raise InvalidRequest(f"checkpoint {rec.id} is already deleted")
        raw = txn.get(rec.id.encode(), db=self._manifests)
        files: dict[str, FileEntry] = {}  # pending (nothing referenced): its row stays
        if raw is None and (rec.durable or self.pending.get(txn, rec.id) is None):
            raise CheckpointNotFound(f"checkpoint {rec.id} has no manifest (deleted?)")
        if raw is not None:  # until the adopter reads the tombstone and releases its parts
            files = self.manifest(txn, rec.id)
            self._unreference(txn, rec.id, bytes(raw), int(now * 1000))
            txn.delete(rec.id.encode(), db=self._manifests)
        txn.delete(_index_key(rec.namespace, rec.id), db=self._index)
        for tag in rec.tags:
            txn.delete(_tag_key(rec.namespace, tag, rec.id), db=self._tags)
        rec.deleted_at = now
        self.put_record(txn, rec)
        ns = self.require_namespace(txn, rec.namespace)
        ns.checkpoints -= 1
        ns.logical_bytes -= rec.size
        if ns.checkpoints == 0:
            ns.emptied_at = now
        self.put_namespace(txn, ns)
        self.nsrefs.add(txn, rec.namespace, distinct_chunks(files), -1)
        self._counters.add(txn, "checkpoints", -1)
        self._counters.add(txn, "logical_bytes", -rec.size)

    def _delta_bases(self, txn: lmdb.Transaction, rec: StoredCheckpoint) -> dict[str, bytes]:
        """Entries a new checkpoint's files may be stored as deltas of: the same names in
        its parent, else in the namespace's latest checkpoint (an agent saving without
        naming a parent); only manifests of entry references qualify."""
        base = rec.parent or next(self.ids(txn, rec.namespace), None)
        raw = txn.get(base.encode(), db=self._manifests) if base else None
        refs = decode_entry_refs(raw) if raw is not None else None
        return refs or {}

    def _unreference(self, txn: lmdb.Transaction, cid: str, raw: bytes, now_ms: int) -> None:
        """Drop what a manifest held: its entries' references (or, for a manifest holding
        whole entries, one reference per distinct chunk, as it was counted)."""
        refs = decode_entry_refs(raw)
        if refs is None:
            self._chunks.add_refs(txn, distinct_chunks(decode_manifest(raw)), -1, now_ms)
            return
        for digest in refs.values():
            self.entries.drop(txn, digest, now_ms)

    def build_nsrefs(self, txn: lmdb.Transaction) -> int:
        """Rebuild the dedup domains' index from the live manifests."""
        return self.nsrefs.build(txn, self._live_files(txn))

    def nsrefs_drift(self, txn: lmdb.Transaction) -> int:
        """Entries of the dedup domains' index that a recount would change (check)."""
        return self.nsrefs.drift(txn, self._live_files(txn))

    def _live_files(self, txn: lmdb.Transaction) -> Iterator[tuple[str, dict[str, FileEntry]]]:
        for cid, files in self.all_manifests(txn):
            rec = self.record(txn, cid)
            if rec is not None:
                yield rec.namespace, files

    def all_manifests(self, txn: lmdb.Transaction) -> Iterator[tuple[str, dict[str, FileEntry]]]:
        seen: dict[bytes, FileEntry] = {}
        for key, raw in txn.cursor(db=self._manifests):
            cid = bytes(key).decode()
            yield cid, self._decode(txn, cid, raw, seen)

    def expected_refs(
        self, txn: lmdb.Transaction, every: Callable[[], None] | None = None
    ) -> tuple[int, Counter[bytes], Counter[bytes]]:
        """Recount from the manifests alone: (live checkpoints, chunk references, entry
        references), what the stored counts must equal (see vault/entries.py). `every` is
        called each `RECOUNT_STEP` manifests: a long scan's chance to stop (it raises)."""
        n = 0
        chunks: Counter[bytes] = Counter()
        entries: Counter[bytes] = Counter()
        for _, raw in txn.cursor(db=self._manifests):
            n += 1
            if every is not None and n % RECOUNT_STEP == 0:
                every()
            refs = decode_entry_refs(raw)
            if refs is None:
                chunks.update(distinct_chunks(decode_manifest(raw)))
            else:
                entries.update(refs.values())
        expected, held = self.entries.recount(txn, entries)
        chunks.update(held)
        return n, chunks, expected

    def released_refs(self, txn: lmdb.Transaction, cids: Iterable[str]) -> Counter[bytes]:
        """Chunk references that deleting these live checkpoints together would drop."""
        released: Counter[bytes] = Counter()
        entries: Counter[bytes] = Counter()
        for cid in cids:
            raw = txn.get(cid.encode(), db=self._manifests)
            refs = None if raw is None else decode_entry_refs(raw)
            if raw is not None and refs is None:
                released.update(distinct_chunks(decode_manifest(raw)))
            elif refs is not None:
                entries.update(refs.values())
        released.update(self.entries.released(txn, entries))
        return released
