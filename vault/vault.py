"""`Vault`: the engine's one entry point, a synchronous, thread-safe facade.

api/ calls these methods from a bounded thread pool; tests and offline tools call them
directly. It holds the engine's parts (`uploads`, `committer`, `reader`, `lifecycle`,
`tokens`, `audit`, `roles`) and callers use those directly: its own methods are the ones that
join several parts, never a pass-through to one. Writes go through the single writer
thread; reads run in short LMDB read transactions on the caller's thread.

Maintenance operations (`gc`, `check`, `retention`, `verify`, `compact`, `shrink`,
`catalog_backup`, `backup_catalog`) do not take the vault's maintenance lock
(`self.maintenance`, vault/maintenance.py): their caller holds it, and the one that does is
`maintenance.run`, around each whole task, for the schedule, the admin routes and the offline
commands alike. A caller outside it (a test, a benchmark) has the vault to itself.

Its role among its peers (primary, standby, fenced), replication and promotion are
`self.roles` (vault/roles.py); the long operations are run as maintenance tasks
(maintenance/), which call the methods below.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from checkpoint_vault.protocol import (
    JSON,
    CatalogBackup,
    CheckReport,
    CodecShare,
    CompactReport,
    GcReport,
    QuotaUse,
    RetentionReport,
    StatsReport,
    TierTotals,
    Usage,
    VerifyReport,
)

from . import backup, prune, scrub
from . import compact as compaction
from .audit import AuditLog
from .bulk import BulkDeleted, delete_many
from .catalog import Catalog
from .check import check
from .chunking import ChunkingProfile
from .clock import Clock, SystemClock
from .commit import Committer
from .config import VaultConfig
from .content.moves import Mover
from .content.reader import Reader
from .content.shared import SharedIndex
from .content.sharedgc import Condemned
from .deliver import deliver_descriptor
from .direct import Chunking, DirectSaver, PreparedSave, SaveOptions
from .domains import Domain
from .errors import InvalidRequest, NotTheWriter
from .gauges import HandedOver, MapUse, Observation
from .gc import collect
from .ingest import FileIngest, ingest_descriptor
from .lifecycle import Lifecycle
from .maintenance import MaintenanceLock
from .manifest import FileEntry
from .names import PARTS, check_namespace
from .ownership import make_private
from .parts import Parts
from .policy import Policies, Policy
from .quotas import usage as quota_usage
from .records import VALIDITY_STATES, NamespaceRecord, StoredCheckpoint, UploadSession
from .replication import FollowConfig, ReplicationConfig
from .roles import Roles
from .runtime import Runtime
from .samples import NamespaceBytes, StorageSamples, allocated_bytes, usage_sample
from .seal import Keyring
from .shrink import ShrinkResult, hot_store, shrink, worth_shrinking
from .snapshot import Snapshot, snapshot
from .store import Store
from .tier import Tier
from .tokens import Tokens
from .uploads import OPEN_UPLOADS_BY, PENDING_BYTES_BY, Uploads
from .usage import checkpoint_usage, namespace_usage
from .writer import WriteTxn

if TYPE_CHECKING:
    from typing_extensions import Unpack

log = logging.getLogger(__name__)


def _not_the_writer() -> NotTheWriter:
    return NotTheWriter(
        "this server process only reads the data dir; the change was not forwarded to the "
        "process that writes it: retry"
    )


MAX_LIST = 1000

# A requested chunking profile: a profile name or {min_size, avg_size, max_size}.


def _obj(value: Mapping[str, JSON] | None) -> JSON:
    """The engine's validators check plain dicts and lists (they also refuse what an untyped
    caller passes); other mappings and sequences are copied into those, the rest left for
    the validators to refuse."""
    return dict(value) if isinstance(value, Mapping) and not isinstance(value, dict) else value


def _seq(value: Sequence[str] | None) -> JSON:
    return list(value) if isinstance(value, tuple) else value


class Vault:
    def __init__(
        self,
        path: str | Path,
        config: VaultConfig | None = None,
        clock: Clock | None = None,
        tiers: Mapping[str, Tier] | None = None,
        keyring: Keyring | None = None,
        replication: ReplicationConfig | None = None,
        follow: FollowConfig | None = None,
        runtime: Runtime | None = None,
        *,
        reader: bool = False,
    ) -> None:
        """`follow`: open as a standby of that tier's replica; `replication` is then what
        the vault replicates with once promoted (default: async, to the followed tier).
        `runtime`: the process's threads (vault/runtime.py); None: the vault's own.
        `reader`: open to read beside the process that has it open to write (a worker of
        `ckpt serve --workers`, started once that one has opened it): no recovery, no
        journal, no writer; every change raises `NotTheWriter`."""
        self.config = config or VaultConfig()
        self.path = Path(path)
        self.store = Store.open(
            self.path,
            clock or SystemClock(),
            self.config,
            tiers,
            keyring,
            runtime,
            refuse=_not_the_writer if reader else None,
        )
        self.store.shared = _shared_index(self.store, self.config)
        self.maintenance = MaintenanceLock.of(self.path)
        if not reader:
            make_private(self.path)
        self._closed = False
        try:
            self.roles = Roles(self.store, self.path, replication, follow)
        except BaseException:
            self.store.close()
            raise
        if self.store.shared is not None:  # what the shared tier's GC lets it take
            self.store.shared.gate = Condemned(
                self.store.shared,
                self.config.shared_shard,
                self.shared_epoch,
                self.config.shared_gc_grace,
            )
        self.uploads = Uploads(self.store)
        self.reader = Reader(self.store)
        self.content = Mover(self.store, self.reader)
        self.lifecycle = Lifecycle(self.store)
        self.tokens = Tokens(self.store)
        self.audit = AuditLog(self.store, self.config.audit_max_age, self.config.audit_max_bytes)
        self.committer = Committer(self.store, self.uploads, self.reader)
        self._direct = DirectSaver(self.store, self.reader)
        self.parts = Parts(
            self.store, self.uploads, self.committer, self.content, self.config.part_ttl
        )
        # Files handed over by descriptor since start: saved from, and restored into.
        self.handed = HandedOver()
        if self.roles.standby is None and not reader:
            self._direct.apply_journal()
        self._policies = Policies(self.store.catalog_env.db["policies"])
        # Per-namespace usage as of the last full scan (`usage()`), for /metrics: the scan
        # reads every manifest, too much for every scrape.
        self.last_usage: dict[str, Usage] = {}
        # Logical, stored and on-disk bytes over time: one sample per usage scan.
        self.samples = StorageSamples(self.store)

    @property
    def catalog(self) -> Catalog:
        return self.store.catalog

    @property
    def tiers(self) -> Mapping[str, Tier]:
        """Configured tiers by name, warmest first; hot (LMDB) is not among them."""
        return self.store.tiers

    @property
    def clock(self) -> Clock:
        return self.store.clock

    def snapshot(self) -> AbstractContextManager[Snapshot]:
        """One consistent, read-only view of the catalog (for the tiering planner)."""
        return snapshot(self.store, self._policies)

    def forget_dead_readers(self) -> int:
        """Clear the LMDB reader slots of processes that died mid-read (a worker killed):
        their snapshots would otherwise keep pages from reuse until the next start."""
        return sum(
            int(env.lmdb.reader_check()) for env in (self.store.catalog_env, self.store.frames_env)
        )

    def close(self) -> None:
        """Idempotent: a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        self.roles.close()
        self.store.close()

    # -- write path -------------------------------------------------------------------
    def open_upload(
        self,
        ns: str,
        *,
        parent: str | None = None,
        inherit: bool = False,
        metadata: Mapping[str, JSON] | None = None,
        tags: Sequence[str] | None = None,
        chunking: Chunking | None = None,
        by: str | None = None,
    ) -> tuple[UploadSession, ChunkingProfile]:
        """Open an upload session. `chunking`: a profile name or {min_size, avg_size,
        max_size}, used only if this upload creates the namespace; `by`: the token name
        (the checkpoint's creator, and per-token limits)."""
        return self.uploads.open(ns, parent, inherit, _obj(metadata), _seq(tags), chunking, by)

    def ingest(self, upload_id: str, name: str, domain: Domain = None) -> FileIngest:
        """Stream a file into an upload; `domain` as for `missing` (what counts as new
        bytes against the token's pending-bytes limit)."""
        return FileIngest(self.store, self.uploads, upload_id, name, domain)

    def ingest_descriptor(
        self,
        upload_id: str,
        name: str,
        fd: int,
        domain: Domain = None,
        stop: threading.Event | None = None,
    ) -> FileEntry:
        """Chunk the open file `fd` into an upload, reading it here (a client on this
        machine handed it over); `domain` as for `missing`. Takes `fd` over: it is closed
        when this returns, by the thread that read it, so no caller can close it under a
        read (and let its number name another file meanwhile). `stop` set: stop at the
        next piece (503 `unavailable`; nothing is attached)."""
        try:
            entry = ingest_descriptor(self.store, self.uploads, upload_id, name, fd, domain, stop)
        finally:
            os.close(fd)
        self.handed.count("", entry.size)
        return entry

    def deliver_descriptor(
        self, entry: FileEntry, fd: int, stop: threading.Event | None = None
    ) -> None:
        """Write the file `entry` (from `manifest`) into the open file `fd` a client on this
        machine handed over, durably. Takes `fd` over as `ingest_descriptor` does. `stop`
        set: stop at the next batch (503 `unavailable`)."""
        try:
            deliver_descriptor(self.store, self.reader, entry, fd, stop)
        finally:
            os.close(fd)
        self.handed.count("restored_", entry.size)

    def save(
        self, ns: str, files: Mapping[str, bytes], **options: Unpack[SaveOptions]
    ) -> tuple[StoredCheckpoint, bool]:
        """One-shot save of small, in-memory files (see vault/direct.py)."""
        return self._direct.save(ns, files, **options)

    def prepare_save(
        self, ns: str, files: Mapping[str, bytes], **options: Unpack[SaveOptions]
    ) -> PreparedSave:
        """A worker's one-request save: checked, cut, hashed and compressed here, for the
        process that writes to commit (`commit_prepared`), so its CPU is spent on every
        core."""
        return self._direct.prepare(ns, files, **options)

    def commit_prepared(self, prepared: PreparedSave) -> Future[tuple[StoredCheckpoint, bool]]:
        """Queue the writer transaction of a save a worker prepared; resolves once durable
        (journaled). A retry with the same key returns the first attempt's checkpoint."""
        return self._direct.submit(prepared)

    # -- read path --------------------------------------------------------------------
    def namespaces(self) -> list[tuple[NamespaceRecord, str | None]]:
        """Every namespace with the id of its newest live checkpoint (or None); not those
        emptied by deletes (a thread deleted is gone from the list; its record stays, with
        its chunking profile and the tombstones lineage needs, until a save refills it)."""
        with self.store.catalog_env.read() as txn:
            return [
                (ns, next(self.catalog.ids(txn, ns.name), None))
                for ns in self.catalog.namespaces(txn)
                if ns.emptied_at is None and ns.name != PARTS  # parts: vault/parts.py
            ]

    def checkpoints(
        self,
        ns: str,
        *,
        limit: int = 100,
        before: str | None = None,
        tag: str | None = None,
        validity: str | None = None,
        durable: bool = False,
    ) -> tuple[list[StoredCheckpoint], str | None]:
        """Live checkpoints newest first, and the cursor for the next page (or None);
        `durable`: only those whose parts are all adopted (vault/pending.py)."""
        check_namespace(ns)
        if not 1 <= limit <= MAX_LIST:
            raise InvalidRequest(f"limit must be 1 to {MAX_LIST}")
        if validity is not None and validity not in VALIDITY_STATES:
            raise InvalidRequest(f"validity must be one of {', '.join(VALIDITY_STATES)}")
        out: list[StoredCheckpoint] = []
        with self.store.catalog_env.read() as txn:
            self.catalog.require_namespace(txn, ns)
            ids = (
                self.catalog.tagged_ids(txn, ns, tag, before)
                if tag is not None
                else self.catalog.ids(txn, ns, before)
            )
            for cid in ids:
                rec = self.catalog.record(txn, cid)
                if rec is None or (tag is not None and tag not in rec.tags):
                    continue
                if validity is not None and rec.validity.state != validity:
                    continue
                if durable and not rec.durable:
                    continue
                if len(out) == limit:
                    return out, out[-1].id
                out.append(rec)
        return out, None

    def get(self, ns: str, ref: str, durable: bool = False) -> StoredCheckpoint:
        with self.store.catalog_env.read() as txn:
            return self.catalog.resolve(txn, ns, ref, durable)

    def manifest(self, ns: str, ref: str) -> tuple[StoredCheckpoint, dict[str, FileEntry]]:
        with self.store.catalog_env.read() as txn:
            rec = self.catalog.resolve(txn, ns, ref)
            return rec, self.catalog.manifest(txn, rec.id)

    def lineage(self, ns: str, ref: str) -> list[StoredCheckpoint]:
        with self.store.catalog_env.read() as txn:
            return self.catalog.lineage(txn, self.catalog.resolve(txn, ns, ref))

    # -- changes to checkpoints -------------------------------------------------------
    def delete_many(self, ns: str, ids: Sequence[str] | None = None) -> BulkDeleted:
        """Delete these checkpoints of `ns` (None: all of them), pinned ones kept; see
        vault/bulk.py."""
        check_namespace(ns)
        return delete_many(self.store, ns, ids)

    # -- policies ---------------------------------------------------------------------
    def policy(self, ns: str | None) -> Policy:
        """A namespace's own policy (or the default with ns=None); defaults if unset."""
        with self.store.catalog_env.read() as txn:
            if ns is not None:
                self.catalog.require_namespace(txn, ns)
            return self._policies.get(txn, ns) or Policy()

    def set_policy(self, ns: str | None, changes: Mapping[str, JSON]) -> Policy:
        """Merge `changes` ({"retention": {...}, "tiering": {...}}, any keys) into a policy."""
        if ns is not None:
            check_namespace(ns)

        def op(w: WriteTxn) -> Policy:
            if ns is not None:
                self.catalog.require_namespace(w.catalog, ns)
            policy = (self._policies.get(w.catalog, ns) or Policy()).updated(_obj(changes))
            self._policies.put(w.catalog, ns, policy)
            return policy

        return self.store.writer.run(op)

    # -- maintenance (the caller holds the lock: maintenance.run) ------------------------
    def retention(self, dry_run: bool = True, namespace: str | None = None) -> RetentionReport:
        """Plan retention for one or every namespace; unless dry_run, apply that plan."""
        plans = prune.plan(self.store, self._policies, namespace)
        deleted = [] if dry_run else prune.apply(self.store, plans)
        return prune.report(plans, deleted, dry_run)

    def verify(
        self,
        namespace: str | None = None,
        sample: float = 1.0,
        rate: float | None = None,
        stop: threading.Event | None = None,
    ) -> VerifyReport:
        """Scrub at most `rate` B/s; `stop` set: stop at the next batch (vault/pacing.py)."""
        if not 0.0 < sample <= 1.0:
            raise InvalidRequest("sample must be a fraction in (0, 1]")
        return scrub.verify(self.store, namespace, sample, rate, stop=stop)

    def shared_epoch(self) -> int | None:
        """The replica epoch this process writes its shard under (0 without replication),
        None while it takes no changes: what keys its marks in the shared tier."""
        if self.roles.standby is not None or not self.roles.writable:
            return None
        repl = self.roles.replication
        return repl.epoch if repl is not None else 0

    def gc(self, dry_run: bool = False, stop: threading.Event | None = None) -> GcReport:
        """Collect expired uploads and unreferenced chunks. Packed chunks leave dead bytes in
        their packs: with tiers, call tiering's `gc_and_repack` instead. `stop` set: stop
        at the next batch (`MaintenanceStopped`)."""
        return collect(self.store, self.uploads, dry_run, stop)

    def compact(
        self,
        namespace: str | None = None,
        rate: float | None = None,
        progress: compaction.Progress | None = None,
        stop: threading.Event | None = None,
    ) -> CompactReport:
        """Re-encode older checkpoints' chunks as deltas against their successors (or
        byte-grouped), at most `rate` B/s read; `stop` set: stop at the next batch; see
        vault/compact.py."""
        if rate is not None and rate <= 0:
            raise InvalidRequest("rate must be a positive number of bytes per second")
        return compaction.compact(self.store, namespace, rate, progress, stop)

    def shrink(self, above: float | None = None) -> ShrinkResult | None:
        """Give the pages LMDB freed back to the file system if more than `above` (default
        `config.shrink_above`; 0: whenever any is) of what the hot store holds is reclaimable;
        None when it was not worth it (vault/shrink.py)."""
        bound = self.config.shrink_above if above is None else above
        if not worth_shrinking(self.store, bound):
            return None
        return shrink(self.store)

    def storage(self, ns: str, ref: str) -> Usage:
        """How one checkpoint is stored: stored against logical bytes, by codec and tier."""
        with self.store.catalog_env.read() as txn:
            rec = self.catalog.resolve(txn, check_namespace(ns), ref)
            return checkpoint_usage(self.store, txn, rec)

    def usage(self) -> dict[str, Usage]:
        """Every namespace's stored against logical bytes (a scan of all manifests)."""
        with self.store.catalog_env.read() as txn:
            names = [n.name for n in self.catalog.namespaces(txn)]
        out: dict[str, Usage] = {}
        for ns in names:  # one short transaction per namespace
            with self.store.catalog_env.read() as txn:
                if self.catalog.namespace(txn, ns) is not None:
                    out[ns] = namespace_usage(self.store, txn, ns)
        self.last_usage = out
        if self.roles.writable:  # a standby's samples are the primary's, replicated
            stats = self.stats()
            at, disk = self.clock.now(), allocated_bytes(self.path)
            self.samples.append(
                usage_sample(at, stats.logical_bytes, stats.stored_bytes, disk, out)
            )
        return out

    def check(self, repair: bool = False, stop: threading.Event | None = None) -> CheckReport:
        """Recount references (vault/check.py); `stop` set: stop mid-scan, before any
        repair (`MaintenanceStopped`)."""
        return check(self.store, repair, stop)

    def catalog_backup(self, to: str | None = None) -> CatalogBackup:
        """Back the catalog up to tier `to`, an absolute path, or (None) the last tier;
        sealed when a keyring is configured (vault/backup.py)."""
        return backup.backup_to(self.store, self.path, to)

    # -- monitoring -------------------------------------------------------------------
    def observe(self) -> Observation:
        """Gauges for monitoring: storage, sessions, maps, writer, recovery points."""
        now = self.store.clock.now()
        recovery: dict[str, tuple[float | None, float | None]] = {}
        with self.store.catalog_env.read() as txn:
            sessions = int(txn.stat(self.store.catalog_env.db["uploads"])["entries"])
            by_token = {
                "sessions": self.store.counters.with_prefix(txn, OPEN_UPLOADS_BY),
                "pending_bytes": self.store.counters.with_prefix(txn, PENDING_BYTES_BY),
            }
            for ns in self.catalog.namespaces(txn):
                newest = self.catalog.latest(txn, ns.name, valid_only=False)
                valid = self.catalog.latest(txn, ns.name, valid_only=True)
                recovery[ns.name] = (
                    now - newest.created_at if newest else None,
                    now - valid.created_at if valid else None,
                )
        return Observation(
            stats=self.stats(),
            upload_sessions=sessions,
            uploads_by_token=by_token,
            maps={
                name: MapUse(env.used_bytes(), env.map_size())
                for name, env in (
                    ("catalog", self.store.catalog_env),
                    ("frames", self.store.frames_env),
                )
            },
            writer=replace(self.store.writer.stats),  # a copy: the writer goes on counting
            save_journal=self.store.writer.journal_on(),
            commit_file_hashes=self.committer.file_hashes(),
            handed_over=self.handed.totals(),
            writer_queue=self.store.writer.queue_depth(),
            recovery_seconds=recovery,
            namespace_usage={
                ns: NamespaceBytes(u.logical_bytes, u.stored_bytes)
                for ns, u in self.last_usage.items()
            },
            small_file_bases=self._direct.bases_found.totals(),
        )

    def backup_catalog(self, dest: Path) -> int:
        """A consistent, compacted, plain copy of the catalog at `dest`; returns its size."""
        return backup.backup_catalog(self.store, dest)

    def stats(self) -> StatsReport:
        with self.store.catalog_env.read() as txn:
            c = self.store.counters
            logical = c.get(txn, "logical_bytes")
            stored = c.get(txn, "stored_bytes")
            chunks = c.get(txn, "chunks")
            namespaces = sum(1 for _ in self.catalog.namespaces(txn))
            checkpoints = c.get(txn, "checkpoints")
            tiers = self.store.chunks.tier_totals(txn, self.store.tiers)
            codecs = self.store.chunks.codec_totals(txn)
            quota_use = [
                QuotaUse(q.glob, q.logical_bytes, quota_usage(txn, self.catalog, q))
                for q in self.config.quotas
            ]
        environments = hot_store(self.store)
        return StatsReport(
            logical_bytes=logical,
            stored_bytes=stored,
            chunks=chunks,
            checkpoints=checkpoints,
            namespaces=namespaces,
            dedup_ratio=round(logical / stored, 4) if stored else None,
            tiers={t: TierTotals(v["chunks"], v["bytes"]) for t, v in tiers.items()},
            codecs={c: CodecShare(**v) for c, v in codecs.items()},
            map_size=self.store.catalog_env.map_size(),
            quotas=quota_use,
            role=self.roles.role,
            replication=self.roles.replication.status() if self.roles.replication else None,
            standby=self.roles.standby.status() if self.roles.standby else None,
            disk_bytes=allocated_bytes(self.path),
            reclaimable_bytes=sum(e.reclaimable_bytes for e in environments.values()),
            environments=environments,
        )


def _shared_index(store: Store, config: VaultConfig) -> SharedIndex | None:
    if not config.shared_tier:
        return None
    tier = store.tiers.get(config.shared_tier)
    if tier is None or not config.shared_writer:
        store.close()
        raise InvalidRequest(f"shared tier {config.shared_tier!r} is not configured")
    return SharedIndex(tier, config.shared_tier, config.shared_writer, store.keyring)
