"""Small checkpoints in one request and one writer transaction.

An agent saving its state after every step cannot afford an upload session's four round
trips and three synced transactions. Here the caller hands over every file's bytes at once;
chunking, hashing and compression happen on the calling thread, and a single writer
transaction creates the namespace if needed, stores the chunks and commits the checkpoint,
acknowledged by one sequential sync of its record in the save journal (vault/journal.py),
which `replay` applies again after a crash. An idempotency key makes a retried save return
the checkpoint the first attempt made, so clients may retry it like every other step.

A record holds what the transaction wrote, not the request: the files' chunk lists and the
frames of the chunks it stored. An agent's state that grew by a message is ~40 kB of which
one or two chunks are new, so a record is ~3 kB where the whole files made it ~40 (and its
sync and the writer's copy grew with the state). The other
chunks were stored and sound when the transaction ran, and a record is applied again on
exactly that state (vault/journal.py), so they are there again; a record that finds one
missing is refused rather than applied wrong. Records holding whole files (`"v"` absent,
written before) still replay.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, TypedDict

import blake3

from checkpoint_vault.protocol import JSON, decode_bundle, encode_bundle

from .chunking import ChunkingProfile, cut_whole
from .content.reader import Reader
from .create import Draft, create, ensure_namespace
from .env import Env
from .errors import Conflict, VaultError
from .frame import Decoder, Encoder, chunk_id, plaintext_length
from .idempotency import IdempotencyKeys, check_key
from .manifest import FileEntry
from .names import check_file_name
from .records import StoredCheckpoint
from .sink import store_all
from .smallfile import (
    WHOLE_MAX,
    BaseCounts,
    RecentFiles,
    Whole,
    bases,
    can_patch,
    patch_base,
)
from .store import Store
from .uploads import check_metadata, check_new_checkpoint, check_tags
from .writer import WriteTxn

if TYPE_CHECKING:
    from typing_extensions import Unpack

log = logging.getLogger(__name__)

# Bytes of files up to which a save's preparation reads in one read transaction, open
# while it cuts, hashes and compresses them (~0.1 ms at this size); past it, two short ones.
ONE_READ_MAX = 256 << 10


@dataclass(frozen=True)
class SaveRequest:
    """A checked one-request save, as its journal record holds it too."""

    ns: str
    files: Mapping[str, bytes]
    parent: str | None  # as the request named it (a journal record: the resolved id)
    inherit: bool
    metadata: dict[str, Any]
    tags: list[str]
    key: str | None
    by: str | None
    profile: ChunkingProfile


@dataclass(frozen=True)
class PreparedSave:
    """A save cut, hashed and compressed where it arrived, ready for the writer: what a
    worker process hands the process that writes (node/calls.py), so that the CPU of a
    save is spent in the worker and the writing process only commits it."""

    request: SaveRequest
    entries: dict[str, FileEntry]
    frames: dict[bytes, bytes]  # chunk id -> frame, for the chunks the vault lacked
    # chunk id -> its base: a small file's frame left to the writer, which holds the base
    # (the preparing worker did not: vault/smallfile.py)
    patch_here: dict[bytes, bytes] = field(default_factory=dict)


Chunking = str | Mapping[str, JSON]  # a profile's name, or its sizes


class SaveOptions(TypedDict, total=False):
    """What a one-request save may say besides its namespace and files (all optional)."""

    parent: str | None
    inherit: bool
    metadata: Mapping[str, JSON] | None
    tags: Sequence[str] | None
    chunking: Chunking | None
    key: str | None
    by: str | None


class DirectSaver:
    def __init__(self, store: Store, reader: Reader) -> None:
        self._s = store
        self._keys = IdempotencyKeys(store)
        self._recent = RecentFiles(reader)
        self.bases_found = BaseCounts()
        self._local = threading.local()  # an Encoder per thread: making one costs ~30 us

    def save(
        self, ns: str, files: Mapping[str, bytes], **options: Unpack[SaveOptions]
    ) -> tuple[StoredCheckpoint, bool]:
        """Create a checkpoint from in-memory files; returns (record, created)."""
        request, done = self._request(ns, files, options)
        if done is not None:  # a retry: the first attempt may be visible before it is durable
            self._s.writer.wait_durable()
            return done, False
        return self.submit(self._prepared(request)).result()

    def prepare(
        self, ns: str, files: Mapping[str, bytes], **options: Unpack[SaveOptions]
    ) -> PreparedSave:
        """Everything of `save` but the writer's transaction, for `submit` in the process
        that writes (a worker's save, node/calls.py); a retry of a save already made is
        found there, in the transaction. A small file whose base this process does not
        hold is left to the writer to frame (`patch_here`), which holds it. A small save's
        reads (its namespace and key, then which of its chunks are stored and its parent's
        files) share one read transaction, held while it is cut: a few tens of µs."""
        if sum(len(data) for data in files.values()) > ONE_READ_MAX:
            return self._prepared(self._request(ns, files, options)[0], defer=True)
        with self._s.catalog_env.read() as txn:
            request = self._request(ns, files, options, txn)[0]
            return self._prepared(request, defer=True, txn=txn)

    def apply_journal(self) -> None:
        """Saves acknowledged by their journal records after the last durable state (a
        crash came between): applied again, in order, before anything else is served."""
        journal = self._s.writer.journal
        pending = list(journal.pending())
        if not pending:
            return
        log.warning("applying %d save-journal records the last durable state lacks", len(pending))
        submitted = []
        for seq, record in pending:
            try:
                submitted.append((seq, self.replay(record)))
            except Exception:  # noqa: BLE001 - logged; the records after it are still applied
                log.exception("save-journal record %d could not be read", seq)
        for seq, future in submitted:
            try:
                future.result()
            except Exception:  # noqa: BLE001 - as above
                log.exception("save-journal record %d could not be applied again", seq)
        journal.applied = pending[-1][0]
        self._s.writer.wait_durable()  # the durable state now contains every record

    def replay(self, record: bytes) -> Future[tuple[StoredCheckpoint, bool]]:
        """Apply a save-journal record again (at open, vault/journal.py): the same save,
        with the id, time and parent it was given; (record, False) if the catalog holds
        it already. ValueError if the record is not one `save` wrote."""
        header, parts = decode_bundle(record)
        holds_chunks = header.get("v") == RECORD_OF_CHUNKS
        try:
            request = SaveRequest(
                header["ns"],
                {} if holds_chunks else parts,
                header["parent"],
                header["inherit"],
                header["metadata"],
                header["tags"],
                header["key"],
                header["by"],
                ChunkingProfile(**header["profile"]),
            )
            given = (str(header["id"]), float(header["created_at"]))
            prepared = _recorded(request, parts) if holds_chunks else self._prepared(request)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a journal record of a save: {e}") from None
        return self.submit(prepared, given)

    def _request(
        self, ns: str, files: Mapping[str, bytes], options: SaveOptions, txn: Any = None
    ) -> tuple[SaveRequest, StoredCheckpoint | None]:
        """The checked request, and the checkpoint a first attempt with `key` made (read
        in `txn` if given, else in a read transaction of its own)."""
        parent, inherit = options.get("parent"), options.get("inherit", False)
        key, by = options.get("key"), options.get("by")
        wanted = self._check(ns, files, parent, inherit, key, options.get("chunking"))
        raw_metadata, raw_tags = options.get("metadata"), options.get("tags")
        # Other mappings and sequences as the plain dicts and lists the validators check.
        metadata = check_metadata(
            dict(raw_metadata) if isinstance(raw_metadata, Mapping) else raw_metadata
        )
        tags = check_tags(list(raw_tags) if isinstance(raw_tags, tuple) else raw_tags)
        with _reading(self._s.catalog_env, txn) as t:
            ns_rec = self._s.catalog.namespace(t, ns)
            done = self._keys.replay(t, key, ns, by) if key is not None else None
        profile = ns_rec.chunking() if ns_rec is not None else wanted
        return SaveRequest(ns, files, parent, inherit, metadata, tags, key, by, profile), done

    def _prepared(self, s: SaveRequest, defer: bool = False, txn: Any = None) -> PreparedSave:
        """Cut and hash here (not in the writer thread every save waits on)."""
        entries, items, patch_here = self._cut(s.files, s.profile, s.ns, s.parent, defer, txn)
        frames = {c: bytes(f) for c, (_, f) in items.items() if f is not None}
        return PreparedSave(s, entries, frames, patch_here)

    def submit(
        self, p: PreparedSave, given: tuple[str, float] | None = None
    ) -> Future[tuple[StoredCheckpoint, bool]]:
        """Queue the writer transaction of a prepared save. `given`: the id and time of a
        journal record applied again (not journaled a second time)."""
        s = p.request
        fields = _fields(s.profile)
        entries = p.entries
        items = _items(s.files, entries, p.frames)
        written: list[bytes] = []  # the chunks the transaction stored: what its record holds

        def op(w: WriteTxn) -> tuple[StoredCheckpoint, bool]:
            txn = w.catalog
            if given is not None and (known := self._s.catalog.record(txn, given[0])):
                return known, False
            if not s.files and (lost := [c for c, (_, f) in items.items() if f is None]):
                _require_stored(self._s, txn, lost)  # a record's: held by the vault
            done = self._keys.replay(txn, s.key, s.ns, s.by) if s.key is not None else None
            if done is not None:
                return done, False
            now = given[1] if given is not None else self._s.clock.now()
            ns_rec = ensure_namespace(self._s, txn, s.ns, fields, now)
            if ns_rec.chunking() != s.profile:
                raise Conflict(f"namespace {s.ns!r} changed its chunking profile; save again")
            parent_id = self._s.catalog.resolve_id(txn, s.ns, s.parent) if s.parent else None
            self._check_patches(txn, items, bool(s.files))
            if p.patch_here:
                self._patch_here(txn, items, p.patch_here)
            # Referenced by the checkpoint made in this same transaction: no reservation;
            # every one of them is sound once stored, so `create` need not look again.
            written[:] = store_all(self._s, w, items, 0, inline=True)
            self._remember(s.files, entries)
            draft = Draft(
                s.ns, parent_id, s.inherit, s.metadata, s.tags, entries, s.by,
                id=given[0] if given is not None else None,
            )  # fmt: skip
            rec = create(self._s, txn, draft, now, sound=items, ns_rec=ns_rec)
            if s.key is not None:
                self._keys.remember(txn, s.key, s.by, rec, now)
            return rec, True

        def journal(result: tuple[StoredCheckpoint, bool]) -> bytes | None:
            rec, created = result
            if not created:
                return None
            header = {
                "ns": s.ns,
                "id": rec.id,
                "parent": rec.parent,
                "created_at": rec.created_at,
                "inherit": s.inherit,
                "metadata": s.metadata,
                "tags": s.tags,
                "key": s.key,
                "by": s.by,
                "profile": fields,
                "v": RECORD_OF_CHUNKS,
            }
            parts = [(_ENTRY + name, entry.to_bytes()) for name, entry in entries.items()]
            for cid in written:  # prepared as absent, or (rarely) gone or damaged since
                frame = items[cid][1] or Encoder().encode(items[cid][0])
                parts.append((_FRAME + cid.hex(), frame))
            return encode_bundle(header, parts)

        size = sum(len(f) for _, f in items.values() if f is not None)
        return self._s.writer.submit(op, size, journal=journal if given is None else None)

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
        if key is not None:
            check_key(key)
        return check_new_checkpoint(self._s, ns, parent, inherit, chunking)

    def _check_patches(
        self, txn: Any, items: dict[bytes, tuple[bytes | memoryview, bytes | None]], whole: bool
    ) -> None:
        """In the writer's transaction: a patch prepared against a base that is no longer
        sound, or whose chain grew past the bound since, is stored whole instead (`whole`:
        the file's bytes are at hand; a journal record's are not, and applying it again
        on the state it was first applied on finds its bases as they were)."""
        for cid, (data, frame) in items.items():
            base = patch_base(frame)
            if base is None or can_patch(self._s.chunks, txn, base):
                continue
            if not whole:
                raise ValueError(f"the record's patch {cid.hex()} lacks its base {base.hex()}")
            items[cid] = (data, Encoder().encode(data))

    def _patch_here(
        self,
        txn: Any,
        items: dict[bytes, tuple[bytes | memoryview, bytes | None]],
        patch_here: Mapping[bytes, bytes],
    ) -> None:
        """In the writer's transaction: the frames of the small files the worker left here,
        a patch against the base this process holds (every small file it committed lately
        passes through it), else whole."""
        whole = Whole(self._encoder())
        for cid, base_id in patch_here.items():
            data, frame = items[cid]
            if frame is not None or self._s.chunks.usable(txn, cid):
                continue  # stored since it was prepared: `store_all` keeps that copy
            base = self._recent.cached(base_id) if can_patch(self._s.chunks, txn, base_id) else None
            self.bases_found.count("writer" if base is not None else "writer_missed")
            items[cid] = (data, whole.frame(data, base_id if base is not None else None, base))

    def _remember(self, files: Mapping[str, bytes], entries: Mapping[str, FileEntry]) -> None:
        """The writer keeps the small files it commits: the bases of the next saves, which
        a worker that did not prepare this one leaves to it."""
        for name, data in files.items():
            entry = entries[name]
            if len(entry.chunks) == 1 and 0 < entry.size <= WHOLE_MAX:
                self._recent.remember(
                    entry.chunks[0][0], data if type(data) is bytes else bytes(data)
                )

    def _cut(
        self,
        files: Mapping[str, bytes],
        profile: ChunkingProfile,
        ns: str,
        parent: str | None,
        defer: bool,
        txn: Any = None,
    ) -> tuple[
        dict[str, FileEntry],
        dict[bytes, tuple[bytes | memoryview, bytes | None]],
        dict[bytes, bytes],
    ]:
        entries: dict[str, FileEntry] = {}
        pieces: dict[bytes, memoryview] = {}
        small: dict[str, bytes] = {}  # file name -> its one chunk (vault/smallfile.py)
        for name, data in files.items():
            if 0 < len(data) <= WHOLE_MAX:
                cid = chunk_id(data)  # the chunk is the file: one hash for both
                pieces[cid] = memoryview(data)
                small[name] = cid
                entries[name] = FileEntry(len(data), cid, ((cid, len(data)),))
                continue
            chunks = cut_whole(profile, data)
            ids = [chunk_id(c) for c in chunks]
            pieces.update(zip(ids, chunks, strict=True))
            entries[name] = FileEntry(
                len(data),
                blake3.blake3(data).digest(),
                tuple(zip(ids, (len(c) for c in chunks), strict=True)),
            )
        with _reading(self._s.catalog_env, txn) as t:
            known = {c for c in pieces if self._s.chunks.usable(t, c)}
            new_small = {name: cid for name, cid in small.items() if cid not in known}
            based = self._bases(t, ns, parent) if new_small else {}
        encoder = self._encoder()
        whole = Whole(encoder) if new_small else None
        chunked = {c for c in pieces if c not in known} - set(small.values())
        items: dict[bytes, tuple[bytes | memoryview, bytes | None]] = {
            c: (d, encoder.encode(d) if c in chunked else None) for c, d in pieces.items()
        }
        patch_here: dict[bytes, bytes] = {}
        for name, cid in small.items():
            data = files[name]
            plain = data if isinstance(data, bytes) else bytes(data)
            if whole is None or name not in new_small:
                self._recent.remember(cid, plain)
                continue
            base_id, depth = based.get(name, (None, -1))
            base = self._base(base_id, defer)
            if base_id is not None and base is None and defer:
                patch_here[cid] = base_id  # framed by the writer, which holds the base
                self._recent.remember(cid, plain)
                continue
            frame = whole.frame(data, base_id, base)
            items[cid] = (pieces[cid], frame)
            self._recent.remember(cid, plain, depth + 1 if patch_base(frame) else 0)
        return entries, items, patch_here

    def _base(self, base_id: bytes | None, defer: bool) -> bytes | None:
        """The plaintext of `base_id` if this process holds it; else, unless `defer`, read
        back (None if it cannot be)."""
        if base_id is None:
            return None
        base = self._recent.cached(base_id)
        if base is not None:
            self.bases_found.count("recent")
        elif not defer:
            self.bases_found.count("read")
            base = self._recent.plaintext(base_id)
        return base

    def _encoder(self) -> Encoder:
        encoder: Encoder | None = getattr(self._local, "encoder", None)
        if encoder is None:
            encoder = self._local.encoder = Encoder()
        return encoder

    def _bases(self, txn: Any, ns: str, parent: str | None) -> dict[str, tuple[bytes, int]]:
        """The chunks the parent's small files are, for this save's to patch against (none
        if the parent cannot be read here: the writer's transaction says why)."""
        if parent is None:
            return {}
        try:
            manifest = self._s.catalog.manifest(txn, self._s.catalog.resolve_id(txn, ns, parent))
        except VaultError:
            return {}
        parent_files = {n: e.chunks for n, e in manifest.items()}
        known = self._recent.depths([c[0][0] for c in parent_files.values() if len(c) == 1])
        return bases(self._s.chunks, txn, parent_files, known)


RECORD_OF_CHUNKS = 2  # a journal record's "v": chunk lists and new frames, not whole files
_ENTRY, _FRAME = "e/", "f/"  # a record's parts: a file's entry, a stored chunk's frame


def _recorded(request: SaveRequest, parts: Mapping[str, bytes]) -> PreparedSave:
    """The prepared save a journal record of chunks describes (`request.files` empty)."""
    entries: dict[str, FileEntry] = {}
    frames: dict[bytes, bytes] = {}
    for name, data in parts.items():
        if name.startswith(_ENTRY):
            entries[name[len(_ENTRY) :]] = FileEntry.from_view(memoryview(data))[0]
        elif name.startswith(_FRAME):
            frames[bytes.fromhex(name[len(_FRAME) :])] = data
        else:
            raise ValueError(f"unknown part {name!r}")
    for name in entries:
        check_file_name(name, stored=True)
    return PreparedSave(request, entries, frames)


def _require_stored(store: Store, txn: Any, cids: list[bytes]) -> None:
    """A journal record's chunks that it does not hold must be stored and sound (they were
    when it was first applied, on this same state); else it cannot be applied again."""
    for cid in cids:
        if not store.chunks.usable(txn, cid):
            raise ValueError(f"the record needs chunk {cid.hex()}, which the vault lacks")


def _items(
    files: Mapping[str, bytes], entries: Mapping[str, FileEntry], frames: Mapping[bytes, bytes]
) -> dict[bytes, tuple[bytes | memoryview, bytes | None]]:
    """Each chunk's bytes (a slice of its file) with its frame, or None where the vault
    had it when the save was prepared (`store_all` looks again in the transaction). A
    journal record's save has no files: its frames give the bytes of the chunks it holds,
    and the others are the vault's (`_require_stored`)."""
    items: dict[bytes, tuple[bytes | memoryview, bytes | None]] = {}
    decoder = Decoder() if not files else None
    for name, entry in entries.items():
        if decoder is not None:
            for cid, _ in entry.chunks:
                frame = frames.get(cid)
                data: bytes | memoryview = b""
                if frame is not None and patch_base(frame) is not None:
                    # Its base is in the vault, perhaps from the record before this one,
                    # not yet applied; only the size is needed to store the frame, and
                    # every read verifies a patch against its id.
                    data = memoryview(bytes(plaintext_length(frame)))
                elif frame is not None:
                    data = decoder.plaintext(frame, cid)
                items[cid] = (data, frame)
            continue
        view, at = memoryview(files[name]), 0
        for cid, size in entry.chunks:
            items[cid] = (view[at : at + size], frames.get(cid))
            at += size
    return items


@lru_cache(maxsize=64)
def _fields(profile: ChunkingProfile) -> dict[str, Any]:
    """A new namespace's chunking record (profiles are frozen: one dict per profile; the
    caller must not change it)."""
    return asdict(profile)


@contextmanager
def _reading(env: Env, txn: Any) -> Iterator[Any]:
    """`txn` when the caller holds a read transaction (a small save's preparation reads in
    one), else one of `env`'s own for the block."""
    if txn is not None:
        yield txn
        return
    with env.read() as own:
        yield own
