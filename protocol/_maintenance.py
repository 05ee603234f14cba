"""The answers of the maintenance routes, one record each: GC, check, verify, compaction,
retention, tiering, catalog backup (and the offline replica restore).

The engine returns these (vault/, tiering/), the service serialises them once with
`to_wire` (api/routes/admin.py, and the schedule's log line), the client parses them with
`from_wire`, and api/routes/openapi.py derives their schemas. The JSON of each is exactly what the
routes have always answered.

The reports of GC, check, verify and compaction are not frozen: the engine fills one in as
it goes, counter by counter, and hands it back when done; nothing changes it after. Figures
derived from fields (`ok`, `saved_bytes`, `mb_per_s`, retention's totals) are computed, not
stored, and listed in `DERIVED` (name -> JSON schema) so the OpenAPI document names them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ._wire import Record, optional, wire_of


@dataclass
class GcReport(Record):
    """POST /v1/admin/gc: what garbage collection removed (or would, on a dry run); with
    tiers, what the repack after it rewrote."""

    chunks_deleted: int = 0
    bytes_freed: int = 0
    uploads_expired: int = 0
    keys_expired: int = 0  # idempotency keys of one-request saves
    dry_run: bool = False
    packs_rewritten: int | None = optional()  # tiers configured, not a dry run
    pack_bytes_freed: int | None = optional()
    # A cluster's shared tier (vault/content/sharedgc.py): packs this shard's mark named,
    # packs the sweep condemned and deleted, bytes freed, and why it deleted nothing yet
    shared_packs_marked: int | None = optional()
    shared_packs_condemned: int | None = optional()
    shared_packs_deleted: int | None = optional()
    shared_bytes_freed: int | None = optional()
    shared_waiting: str | None = optional()
    shared_segments_merged: int | None = optional()


@dataclass(frozen=True)
class Drift(Record):
    """A reference count that disagrees with the manifests: of a chunk or of a stored file
    entry (vault/entries.py), one of the two named."""

    refs: int
    expected: int
    chunk: str | None = optional()
    entry: str | None = optional()

    def to_wire(self) -> dict[str, Any]:
        # The subject first, as the check has always listed it.
        subject = {"chunk": self.chunk} if self.chunk is not None else {"entry": self.entry}
        return {**subject, "refs": self.refs, "expected": self.expected}


@dataclass
class CheckReport(Record):
    """POST /v1/admin/check: reference counts recomputed from the manifests, what
    disagrees, and (repair=true) how many things were fixed."""

    checkpoints: int = 0
    chunks: int = 0
    drift: list[Drift] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    damaged: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    orphan_frames: int = 0
    domain_drift: int = 0  # dedup-domain index entries a recount changes (vault/domains.py)
    bases_kept: int = 0  # unreferenced chunks kept because a delta needs them
    stale_links: int = 0  # delta links of chunks no longer stored
    repaired: int = 0

    DERIVED: ClassVar[dict[str, Any]] = {"ok": {"type": "boolean"}}

    @property
    def ok(self) -> bool:
        return not (self.drift or self.missing or self.damaged or self.domain_drift)

    def to_wire(self) -> dict[str, Any]:
        return {**wire_of(self), "ok": self.ok}


@dataclass
class VerifyReport(Record):
    """POST /v1/admin/verify (the scrub): chunks re-read and checked against their ids,
    the corrupt ones, and the checkpoints that became invalid or healed."""

    chunks_checked: int = 0
    bytes_checked: int = 0
    corrupt: list[str] = field(default_factory=list)
    checkpoints_invalidated: list[str] = field(default_factory=list)
    checkpoints_healed: list[str] = field(default_factory=list)
    seconds: float = 0.0

    DERIVED: ClassVar[dict[str, Any]] = {"mb_per_s": {"type": "number"}}

    @property
    def mb_per_s(self) -> float:
        return self.bytes_checked / self.seconds / 1e6 if self.seconds else 0.0

    def to_wire(self) -> dict[str, Any]:
        return {**wire_of(self), "mb_per_s": round(self.mb_per_s, 1)}


@dataclass
class CompactReport(Record):
    """POST /v1/admin/compact: checkpoints re-encoded as deltas against their successors
    (or byte-grouped), and what it saved."""

    checkpoints: int = 0  # compacted against their successor in this run
    chunks_recoded: int = 0
    deltas: int = 0
    grouped: int = 0
    bytes_before: int = 0  # stored bytes of the recoded chunks, before
    bytes_after: int = 0  # and after
    bytes_read: int = 0  # plaintext read (chunks and bases)
    skipped: int = 0  # changed or damaged while being encoded; the next run retries
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # of the whole process (the writer's commits included)
    namespaces: list[str] = field(default_factory=list)

    DERIVED: ClassVar[dict[str, Any]] = {"saved_bytes": {"type": "integer"}}

    @property
    def saved_bytes(self) -> int:
        return self.bytes_before - self.bytes_after

    def to_wire(self) -> dict[str, Any]:
        return {**wire_of(self), "saved_bytes": self.saved_bytes}


@dataclass(frozen=True)
class RetentionPlan(Record):
    """One namespace's retention plan: each kept id with its reasons, the ids to delete,
    and the bytes deleting them frees."""

    keep: dict[str, list[str]] = field(default_factory=dict)
    delete: list[str] = field(default_factory=list)
    reclaimable_bytes: int = 0


@dataclass(frozen=True)
class RetentionReport(Record):
    """POST /v1/admin/retention: the plan per namespace and, applied, what was deleted.
    `delete`, `keep` and `reclaimable_bytes` are the namespaces' together."""

    dry_run: bool
    namespaces: dict[str, RetentionPlan] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)

    DERIVED: ClassVar[dict[str, Any]] = {
        "delete": {"type": "array", "items": {"type": "string"}},
        "keep": {"type": "array", "items": {"type": "string"}},
        "reclaimable_bytes": {"type": "integer"},
    }

    @property
    def delete(self) -> list[str]:
        return [i for p in self.namespaces.values() for i in p.delete]

    @property
    def keep(self) -> list[str]:
        return [i for p in self.namespaces.values() for i in p.keep]

    @property
    def reclaimable_bytes(self) -> int:
        return sum(p.reclaimable_bytes for p in self.namespaces.values())

    def to_wire(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "delete": self.delete,
            "keep": self.keep,
            "reclaimable_bytes": self.reclaimable_bytes,
            "deleted": self.deleted,
            "namespaces": {ns: p.to_wire() for ns, p in self.namespaces.items()},
        }


@dataclass(frozen=True)
class TierPlan(Record):
    """What a tiering run moves (or would) to one tier: chunks (of which some come from a
    warmer tier rather than hot), their stored bytes, and the checkpoints they belong to."""

    chunks: int
    from_other_tiers: int
    bytes: int
    checkpoints: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class PromotePlan(Record):
    """Packed chunks a tiering run brings back hot (a rule holds their checkpoints hot)."""

    chunks: int
    bytes: int
    checkpoints: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class HotBytes(Record):
    """Stored bytes on the hot disk now, and after the plan."""

    bytes: int
    bytes_after: int


@dataclass(frozen=True)
class RepackSummary(Record):
    """Packs rewritten or deleted. Planned (a dry run): the packs under the `below` live
    fraction and their dead bytes. Done: what was rewritten, deleted, written and freed.
    Also what moving packed chunks on to a colder tier did (no `below` there)."""

    packs: int  # planned: sparse packs; done: packs in the tiers
    below: float | None = optional()
    dead_bytes: int | None = optional()  # planned only
    rewritten: int | None = optional()
    deleted: int | None = optional()
    new_packs: int | None = optional()
    chunks_moved: int | None = optional()
    dead_bytes_freed: int | None = optional()
    seconds: float | None = optional()

    def to_wire(self) -> dict[str, Any]:
        wire = wire_of(self)
        if self.below is not None:  # first, as the route has always answered it
            wire = {"below": self.below, **wire}
        return wire


@dataclass(frozen=True)
class MoveSummary(Record):
    """Chunks moved between the hot disk and a tier, and how fast; a move to a tier also
    says what carrying packed chunks on from warmer tiers did (`from_other_tiers`)."""

    chunks: int
    bytes: int
    packs: int
    skipped: int
    seconds: float
    mb_per_s: float
    from_other_tiers: RepackSummary | None = optional()


@dataclass(frozen=True)
class TieringReport(Record):
    """POST /v1/admin/tiering: the plan (per target tier, early demotions for hot
    capacity, chunks coming back hot, hot bytes before and after) and the repack; when run
    (not a dry run), also what moved where, what came back and which checkpoints' `tier`
    changed."""

    dry_run: bool
    tiers: dict[str, TierPlan]
    by_watermark: list[str]  # demoted early for hot capacity
    promote: PromotePlan
    hot: HotBytes
    repack: RepackSummary
    moved: dict[str, MoveSummary] | None = optional()
    promoted: MoveSummary | None = optional()
    retiered: list[str] | None = optional()


@dataclass(frozen=True)
class CatalogBackup(Record):
    """POST /v1/admin/catalog/backup (201): where the copy went (a tier and its key, or a
    path in the server's backup_dir), its size, and whether it is sealed."""

    tier: str | None = optional()
    key: str | None = optional()
    path: str | None = optional()
    bytes: int = 0
    sealed: bool = False
    seconds: float = 0.0


@dataclass(frozen=True)
class ReplicaRestored(Record):
    """`ckpt catalog restore replica:NAME`: a data dir rebuilt from a tier's continuous
    replica, the base copy of one epoch and generation plus the log segments after it."""

    epoch: int
    generation: str
    base_segment: int
    segments: int  # log segments replayed
    batches: int  # commit batches replayed
    through: float | None  # commit time (Unix) of the last batch replayed
    seconds: float
