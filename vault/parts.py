"""Parts: a checkpoint written on many hosts and committed once (issue 44).

A *part* is a set of files one host saved on its own node, before the namespace's owner
commits them together. On the node that takes it, a part is an ordinary upload and then an
ordinary checkpoint of the reserved namespace `_parts` (a name `check_namespace` refuses,
so no route reaches it and listings leave it out): refcounts, GC, tiering and restore
apply to it unchanged. Its record's metadata names the namespace it is for and when it
expires; its creator is the token that saved it. A part lives `ttl` seconds from its open
(upload, hold and its chunks' reservations share that one deadline) unless released
first; `expire` deletes what is past it, and GC then collects its chunks.

Acknowledged here: every write of a part on its node (its upload's open, reservations,
chunk batches and files, its commit, a claim, its shipping's switches) is acknowledged
once durable on this node's disk (`Writer` `local`), not when a sync replica has it; the
replica ships it behind, in commit order. Its bytes reach the bucket by shipping, and the
owner's record says when (`durable`); a standby that takes the shard over before its
replica had the part does not hold it, and a commit naming it fails (`PartGone`,
`PartUnavailable`) until it is saved again (docs/DESIGN.md, "A checkpoint from many
hosts": the crash points and the trade).

Shipping (`ship`) demotes the part's hot chunks into the cluster's shared tier, which
publishes them in the shared chunk index (vault/content/shared.py), so any node can name
them without a copy.

The owner's side (`commit_parts`) makes one checkpoint of every part's files: an upload of
the namespace opened on the owner, every chunk asked for with `missing` (which adopts what
the shared index lists, and reserves what the owner holds), each file added with the hash
its part node proved, then the upload's commit: one writer transaction, visible all or
nothing, one id, one lineage. A chunk that is neither here nor listed fails it
(`PartNotShipped`, nothing visible) and the upload is aborted.

Trust: the part manifests come from nodes of the cluster (api/cluster/parts.py checks the
URL against the live members), asked with the caller's own token, and a part counts only
for the namespace and token that saved it; the part node enforced the token's dedup domain
when its chunks arrived, so the owner adopts without one.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import blake3

from checkpoint_vault.protocol import CommitFile, PartFile, PartRecord

from .bulk import delete_many
from .chunking import PROFILES, ChunkingProfile
from .clock import rfc3339
from .commit import Committer
from .content.moves import Mover
from .domains import Domain
from .durable import Durability
from .errors import Conflict, InvalidRequest, PartGone, PartNotShipped, UploadNotFound, VaultError
from .manifest import FileEntry, distinct_chunks
from .names import PARTS, check_file_name, check_namespace
from .records import StoredCheckpoint, UploadSession
from .store import Store
from .uploads import (
    MAX_MISSING_QUERY,
    Opening,
    Uploads,
    check_metadata,
    check_new_checkpoint,
    check_tags,
)
from .writer import WriteTxn

PART_TTL = 3600.0  # seconds a committed part is held unless an owner releases it first
# Seconds a part named by a checkpoint not adopted yet is held (from its commit): its node
# may be down this long and come back; a release after adoption ends it first.
CLAIM_HOLD = 7 * 86400.0


@dataclass(frozen=True)
class PartManifest:
    """A committed part as its node describes it to an owner."""

    id: str  # the part's checkpoint id on its node
    namespace: str  # the namespace it is for
    created_by: str | None
    created_at: float
    expires_at: float
    files: dict[str, FileEntry]
    shipped: bool  # every chunk is in the shared tier (or no shared tier: never)
    claimed: bool = False  # named by a checkpoint not adopted yet (held until released)

    @property
    def size(self) -> int:
        return sum(e.size for e in self.files.values())

    def to_record(self) -> PartRecord:
        files = {
            name: PartFile(
                e.size, e.hash.hex(), [cid.hex() for cid, _ in e.chunks], [n for _, n in e.chunks]
            )
            for name, e in self.files.items()
        }
        return PartRecord(
            self.id,
            self.namespace,
            self.created_by,
            rfc3339(self.created_at),
            rfc3339(self.expires_at),
            self.shipped,
            files,
        )

    @staticmethod
    def from_record(r: PartRecord) -> PartManifest:
        """A manifest another node answered; malformed: `InvalidRequest`."""
        try:
            files = {
                check_file_name(name): FileEntry(
                    f.size,
                    bytes.fromhex(f.hash),
                    tuple(zip(map(bytes.fromhex, f.chunks), f.sizes, strict=True)),
                )
                for name, f in r.files.items()
            }
            return PartManifest(
                r.id,
                check_namespace(r.namespace),
                r.created_by,
                _seconds(r.created_at),
                _seconds(r.expires_at),
                files,
                r.shipped,
            )
        except ValueError as e:
            raise InvalidRequest(f"a part node answered a malformed manifest ({e})") from None


def _seconds(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True)
class PartsCommit:
    """What the owner commits: the parts' manifests and the checkpoint's own fields.
    `refs`: how the caller named the parts, (node, id) each: with the namespace and the
    token they name the commit's upload, so a retry finds what the first attempt did."""

    namespace: str
    parts: Sequence[PartManifest]
    by: str | None
    refs: Sequence[tuple[str, str]] = ()
    parent: str | None = None
    metadata: Mapping[str, Any] | None = None
    tags: Sequence[str] | None = None
    # False: visible once every part's manifest is here, `durable: false` until adopted
    wait_durable: bool = True


def commit_upload_id(prefix: str, ns: str, by: str | None, refs: Sequence[tuple[str, str]]) -> str:
    """The owner's upload for a commit of these parts: the same for every attempt, so a
    retry after a lost answer (or a crash after the commit) returns the first checkpoint
    instead of making a second, and one after a crash before it carries on in its upload."""
    text = "\0".join([ns, by or "", *sorted(f"{node}\0{pid}" for node, pid in refs)])
    return prefix + blake3.blake3(text.encode()).hexdigest()[:32]


class Parts:
    """Both sides of a commit across hosts, on one node's engine."""

    def __init__(
        self,
        store: Store,
        uploads: Uploads,
        committer: Committer,
        mover: Mover,
        ttl: float = PART_TTL,
    ) -> None:
        self._s = store
        self._uploads = uploads
        self._committer = committer
        self._mover = mover
        self.ttl = ttl
        self._shipping = threading.Lock()  # one shipping run at a time on this node
        self.durability = Durability(store, uploads)

    # -- the part's node ---------------------------------------------------------------
    def open(
        self,
        namespace: str,
        by: str | None,
        ttl: float | None = None,
        chunking: ChunkingProfile | None = None,
    ) -> tuple[UploadSession, ChunkingProfile]:
        """An upload that becomes a part for `namespace` (routes use it as any upload).
        `ttl`: hold the part at most this long (never past this node's own TTL)."""
        check_namespace(namespace)
        if ttl is not None and ttl <= 0:
            raise InvalidRequest("a part's ttl must be a positive number of seconds")
        life = min(self.ttl if ttl is None else ttl, self.ttl, self._s.config.upload_ttl)
        wanted = chunking or PROFILES[self._s.config.default_profile]

        def op(w: WriteTxn) -> tuple[UploadSession, ChunkingProfile]:
            # One deadline for the upload, the part and its chunks' reservations: a part
            # abandoned is collectable as soon as it expires.
            expires = self._s.clock.now() + life
            meta = {"namespace": namespace, "expires_at": expires}
            fields = Opening(PARTS, None, False, meta, [], by, asdict(wanted))
            return self._uploads.begin(w.catalog, fields, self._uploads.fresh_id(), expires)

        return self._s.writer.run(op, local=True)

    def commit(
        self, upload_id: str, files: Mapping[str, CommitFile] | None, domain: Domain = None
    ) -> PartManifest:
        """Commit a part's upload (a retry answers the same part)."""
        if part_target(self._uploads.session(upload_id)) is None:
            raise Conflict(f"upload {upload_id} is not a part: commit it as an upload")
        rec, _ = self._committer.commit(upload_id, files, domain, local=True)
        return self.manifest(rec.id)

    def manifest(self, part_id: str) -> PartManifest:
        """A live part; `PartGone` if released, expired or never made here."""
        part = self._read(part_id)
        if part.expires_at <= self._s.clock.now():
            raise PartGone(f"part {part_id} expired")
        return part

    def _read(self, part_id: str) -> PartManifest:
        """A part held here, expired or not (`expire` deletes those)."""
        with self._s.catalog_env.read() as txn:
            rec = self._s.catalog.record(txn, part_id) if 0 < len(part_id) <= 64 else None
            if rec is None or rec.is_tombstone or rec.namespace != PARTS:
                raise PartGone(f"part {part_id[:64]!r} is not held on this node")
            files = self._s.catalog.manifest(txn, rec.id)
            shipped = self._shipped(txn, files)
        target = rec.metadata.get("namespace")
        if not isinstance(target, str):
            raise PartGone(f"part {part_id} is not a part")
        return PartManifest(
            rec.id,
            target,
            rec.created_by,
            rec.created_at,
            self._expires(rec),
            files,
            shipped,
            bool(rec.metadata.get("claimed")),
        )

    def held(self) -> list[PartManifest]:
        """Every part this node holds, oldest first, expired ones until `expire` deleted
        them (for operators)."""
        return self._manifests(rec.id for rec in self._records())

    def any_claimed(self) -> bool:
        """Whether some part here is claimed (records only: the node's loop asks every
        second)."""
        return any(rec.metadata.get("claimed") for rec in self._records())

    def _records(self) -> list[StoredCheckpoint]:
        """The records of the parts held here, oldest first."""
        with self._s.catalog_env.read() as txn:
            if self._s.catalog.namespace(txn, PARTS) is None:
                return []
            ids = list(self._s.catalog.ids(txn, PARTS))
            recs = (self._s.catalog.record(txn, i) for i in reversed(ids))
            return [r for r in recs if r is not None and not r.is_tombstone]

    def _manifests(self, ids: Iterable[str]) -> list[PartManifest]:
        out = []
        for part_id in ids:
            with contextlib.suppress(PartGone):  # released meanwhile
                out.append(self._read(part_id))
        return out

    def claim(self, part_id: str) -> PartManifest:
        """Hold a part until it is released, whatever its deadline: a checkpoint committed
        without waiting for shipping names it until its owner adopted its chunks."""
        self.manifest(part_id)

        def op(w: WriteTxn) -> None:
            rec = self._s.catalog.record(w.catalog, part_id)
            if rec is not None and not rec.is_tombstone and not rec.metadata.get("claimed"):
                rec.metadata = {**rec.metadata, "claimed": True}
                self._s.catalog.put_record(w.catalog, rec)

        self._s.writer.run(op, local=True)  # as the part's own writes (the module docstring)
        return self.manifest(part_id)

    def unclaim(self, part_id: str) -> None:
        """Back to its own deadline: the commit that claimed it made nothing."""

        def op(w: WriteTxn) -> None:
            rec = self._s.catalog.record(w.catalog, part_id)
            if rec is not None and rec.namespace == PARTS and rec.metadata.get("claimed"):
                rec.metadata = {k: v for k, v in rec.metadata.items() if k != "claimed"}
                self._s.catalog.put_record(w.catalog, rec)

        self._s.writer.run(op)

    def _expires(self, rec: StoredCheckpoint) -> float:
        if rec.metadata.get("claimed"):  # named by a checkpoint not adopted yet
            return rec.created_at + CLAIM_HOLD
        at = rec.metadata.get("expires_at")
        return float(at) if isinstance(at, (int, float)) else rec.created_at + self.ttl

    def _shipped(self, txn: Any, files: Mapping[str, FileEntry]) -> bool:
        shared = self._s.shared
        if shared is None:
            return False
        for cid in distinct_chunks(files):
            meta = self._s.chunks.meta(txn, cid)
            where = None if meta is None else meta.where
            if getattr(where, "tier", None) != shared.tier_name:
                return False
        return True

    def ship(self, part_id: str, stop: threading.Event | None = None) -> PartManifest:
        """Demote the part's hot chunks into the shared tier (published in the shared
        index as each pack lands). Chunks packed in another tier stay: they are not the
        part's own (it never demotes), and a commit then fails on them as not shipped."""
        shared = self._s.shared
        if shared is None:  # configuration, not a moment: retrying cannot help
            raise Conflict("this node has no shared tier: its parts cannot be shipped")
        part = self.manifest(part_id)
        with self._shipping:
            with self._s.catalog_env.read() as txn:
                hot = []
                for cid in distinct_chunks(part.files):
                    meta = self._s.chunks.meta(txn, cid)
                    if meta is not None and meta.hot and not meta.damaged:
                        hot.append(cid)
            if hot:
                self._mover.demote(shared.tier_name, sorted(hot), stop=stop, local=True)
        return self.manifest(part_id)

    def release(self, part_id: str) -> bool:
        """Delete a part (its owner adopted it); False if it was not held."""
        try:
            self.manifest(part_id)
        except PartGone:
            return False
        return bool(delete_many(self._s, PARTS, [part_id]).deleted)

    def to_ship(self) -> list[str]:
        """Claimed parts not shipped yet whose shipping delay is over (after a restart, or
        a delay configured): the node's loop ships them, no owner needs to ask."""
        delay = self._s.config.part_ship_delay
        now = self._s.clock.now()
        due = (
            r.id
            for r in self._records()
            if r.metadata.get("claimed") and r.created_at + delay <= now
        )
        return [p.id for p in self._manifests(due) if not p.shipped]

    def expired(self, rec: StoredCheckpoint) -> bool:
        return self._expires(rec) <= self._s.clock.now()

    def expire(self) -> int:
        """Delete the parts held past their TTL; GC collects their chunks."""
        with self._s.catalog_env.read() as txn:
            if self._s.catalog.namespace(txn, PARTS) is None:
                return 0
            old = []
            for cid in self._s.catalog.ids(txn, PARTS):
                rec = self._s.catalog.record(txn, cid)
                if rec is not None and self.expired(rec):
                    old.append(cid)
        return len(delete_many(self._s, PARTS, old).deleted) if old else 0

    # -- the namespace's owner ---------------------------------------------------------
    def replayed(
        self, ns: str, by: str | None, refs: Sequence[tuple[str, str]]
    ) -> StoredCheckpoint | None:
        """The checkpoint an earlier commit of these parts made, if its upload lives."""
        upload_id = commit_upload_id(self._s.config.upload_id_prefix, ns, by, refs)
        with self._s.catalog_env.read() as txn:
            try:
                session = self._uploads.get(txn, upload_id)
            except UploadNotFound:
                return None
            if not session.committed or session.namespace != ns:
                return None
            return self._s.catalog.record(txn, session.committed)

    def commit_parts(self, c: PartsCommit) -> StoredCheckpoint:
        """One checkpoint of every part's files (see the module's docstring)."""
        files, held_by = _check_parts(c)
        session = self._commit_session(c)
        if session.committed:
            with self._s.catalog_env.read() as txn:
                first = self._s.catalog.record(txn, session.committed)
            if first is not None and not first.durable:
                return first
            rec, _ = self._committer.commit(session.id)  # the first attempt's
            return rec
        try:
            # Not waiting: unless this node or the shared index (as it knows it) has every
            # chunk, make it visible now, without the reservation pass over every chunk.
            early = not c.wait_durable and not self.durability.adoptable(files)
            missing = -1 if early else self._adopt(session.id, files)
            if missing > 0 and c.wait_durable:
                raise PartNotShipped(
                    f"{missing} chunk(s) of the parts are neither on this node nor in the "
                    "shared tier yet: ship the parts first, or retry"
                )
            if missing:  # visible now, adopted by the owner's background step
                refs = [(node, pid) for node, pid in c.refs]
                return self.durability.commit_pending(session.id, files, held_by, refs)
            self._uploads.add_files(session.id, files)
            rec, _ = self._committer.commit(session.id)
        except BaseException:
            with contextlib.suppress(VaultError):
                self._uploads.abort(session.id)
            raise
        return rec

    def _commit_session(self, c: PartsCommit) -> UploadSession:
        """The commit's upload on this owner: the live one an earlier attempt opened, or a
        new one (as `Uploads.open` makes, under the id `commit_upload_id` gives)."""
        check_new_checkpoint(self._s, c.namespace, c.parent, False, None)
        metadata = check_metadata(dict(c.metadata or {}))
        tags = check_tags(list(c.tags or []))
        upload_id = commit_upload_id(self._s.config.upload_id_prefix, c.namespace, c.by, c.refs)

        def op(w: WriteTxn) -> UploadSession:
            now = self._s.clock.now()
            with contextlib.suppress(UploadNotFound):
                found = self._uploads.get(w.catalog, upload_id)
                if found.expires_at > now and found.namespace == c.namespace:
                    return found
                self._uploads.drop(w.catalog, upload_id, keep_session=False)
                if not found.committed:
                    self._uploads.count(w.catalog, found, -1)
            wanted = asdict(PROFILES[self._s.config.default_profile])
            fields = Opening(c.namespace, c.parent, False, metadata, tags, c.by, wanted)
            expires = now + self._s.config.upload_ttl
            return self._uploads.begin(w.catalog, fields, upload_id, expires)[0]

        # Local as the parts' writes: M2's commit must not wait for the replica's backlog
        # (a lost session is opened again by the retry; M1's commit itself waits for it).
        return self._s.writer.run(op, local=True)

    def _adopt(self, upload_id: str, files: Mapping[str, FileEntry]) -> int:
        """Every chunk reserved here or adopted from the shared index; how many are
        neither (not shipped yet)."""
        if self._s.shared is not None:
            self._s.shared.refresh()  # what the part nodes shipped a moment ago
        ids = [cid.hex() for cid in distinct_chunks(files)]
        missing: list[str] = []
        for i in range(0, len(ids), MAX_MISSING_QUERY):
            missing += self._uploads.missing(upload_id, ids[i : i + MAX_MISSING_QUERY], None)
        return len(missing)


def part_target(session: UploadSession) -> str | None:
    """The namespace a part's upload is for (its scope governs it); None: not a part."""
    if session.namespace != PARTS:
        return None
    target = session.metadata.get("namespace")
    return target if isinstance(target, str) else None


def _check_parts(c: PartsCommit) -> tuple[dict[str, FileEntry], dict[str, int]]:
    """The files of every part, each part saved for this namespace by this token, and
    which part (its place in `c.parts`) holds each."""
    if not c.parts:
        raise InvalidRequest("a commit of parts needs at least one part")
    files: dict[str, FileEntry] = {}
    held_by: dict[str, int] = {}
    for i, part in enumerate(c.parts):
        if part.namespace != c.namespace:
            raise InvalidRequest(f"part {part.id} was saved for {part.namespace!r}")
        if part.created_by != c.by:
            raise InvalidRequest(f"part {part.id} was saved by another token")
        for name, entry in part.files.items():
            if name in files:
                raise InvalidRequest(f"file {name!r} is in more than one part")
            files[name] = entry
            held_by[name] = i
    return files, held_by


__all__ = [
    "PARTS",
    "PART_TTL",
    "PartManifest",
    "Parts",
    "PartsCommit",
    "commit_upload_id",
    "part_target",
]
