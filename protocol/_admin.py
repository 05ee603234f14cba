"""The answers of the admin and maintenance routes, one dataclass each.

The engine returns these (vault/, tiering/), the service serialises them once with
`to_wire` (api/routes/admin.py, and the schedule's log line), the client parses them with
`from_wire`, and api/openapi.py derives their schemas. The JSON of each is exactly what the
routes have always answered.

The maintenance reports (GC, check, verify, compaction) are not frozen: the engine fills
one in as it goes, counter by counter, and hands it back when done; nothing changes it
after. Figures derived from fields (`ok`, `saved_bytes`, `mb_per_s`) are computed, not
stored, and listed in `DERIVED` (name -> JSON schema) so the OpenAPI document names them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ._wire import record_of, wire_of

_OPTIONAL: dict[str, Any] = {"optional": True}


def _optional(default: Any = None) -> Any:
    """A field that is left out of the JSON when None."""
    return field(default=default, metadata=_OPTIONAL)


@dataclass
class GcReport:
    """POST /v1/admin/gc: what garbage collection removed (or would, on a dry run); with
    tiers, what the repack after it rewrote."""

    chunks_deleted: int = 0
    bytes_freed: int = 0
    uploads_expired: int = 0
    keys_expired: int = 0  # idempotency keys of one-request saves
    dry_run: bool = False
    packs_rewritten: int | None = _optional()  # tiers configured, not a dry run
    pack_bytes_freed: int | None = _optional()

    DERIVED: ClassVar[dict[str, Any]] = {}

    def to_wire(self) -> dict[str, Any]:
        return wire_of(self)

    @classmethod
    def from_wire(cls, d: object) -> GcReport:
        return record_of(cls, d, "gc report")


@dataclass(frozen=True)
class Drift:
    """A reference count that disagrees with the manifests: of a chunk or of a stored file
    entry (vault/entries.py), one of the two named."""

    refs: int
    expected: int
    chunk: str | None = _optional()
    entry: str | None = _optional()

    DERIVED: ClassVar[dict[str, Any]] = {}

    def to_wire(self) -> dict[str, Any]:
        # The subject first, as the check has always listed it.
        subject = {"chunk": self.chunk} if self.chunk is not None else {"entry": self.entry}
        return {**subject, "refs": self.refs, "expected": self.expected}

    @classmethod
    def from_wire(cls, d: object) -> Drift:
        return record_of(cls, d, "drift")


@dataclass
class CheckReport:
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

    @classmethod
    def from_wire(cls, d: object) -> CheckReport:
        return record_of(cls, d, "check report")


@dataclass
class VerifyReport:
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

    @classmethod
    def from_wire(cls, d: object) -> VerifyReport:
        return record_of(cls, d, "verify report")


@dataclass
class CompactReport:
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

    @classmethod
    def from_wire(cls, d: object) -> CompactReport:
        return record_of(cls, d, "compact report")


@dataclass(frozen=True)
class RetentionPlan:
    """One namespace's retention plan: each kept id with its reasons, the ids to delete,
    and the bytes deleting them frees."""

    keep: dict[str, list[str]] = field(default_factory=dict)
    delete: list[str] = field(default_factory=list)
    reclaimable_bytes: int = 0

    DERIVED: ClassVar[dict[str, Any]] = {}

    def to_wire(self) -> dict[str, Any]:
        return wire_of(self)

    @classmethod
    def from_wire(cls, d: object) -> RetentionPlan:
        return record_of(cls, d, "retention plan")


@dataclass(frozen=True)
class RetentionReport:
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

    @classmethod
    def from_wire(cls, d: object) -> RetentionReport:
        return record_of(cls, d, "retention report")


@dataclass(frozen=True)
class KeepBestRule:
    """Keep the `n` checkpoints best by a numeric metadata key (`mode` min or max)."""

    metric: str
    mode: str = field(metadata={"schema": {"enum": ["min", "max"]}})
    n: int

    DERIVED: ClassVar[dict[str, Any]] = {}

    def to_wire(self) -> dict[str, Any]:
        return wire_of(self)

    @classmethod
    def from_wire(cls, d: object) -> KeepBestRule:
        return record_of(cls, d, "keep_best")


@dataclass(frozen=True)
class RetentionRules:
    """A policy's retention rules as stored and answered; a rule that is null is off.
    `keep_within` is a duration ("1w", "36h")."""

    keep_last: int | None = None
    keep_hourly: int | None = None
    keep_daily: int | None = None
    keep_weekly: int | None = None
    keep_monthly: int | None = None
    keep_within: str | None = None
    keep_tags: list[str] = field(default_factory=list)
    keep_best: KeepBestRule | None = None
    keep_valid_min: int = 1

    DERIVED: ClassVar[dict[str, Any]] = {}

    def to_wire(self) -> dict[str, Any]:
        return wire_of(self)

    @classmethod
    def from_wire(cls, d: object) -> RetentionRules:
        return record_of(cls, d, "retention")


@dataclass(frozen=True)
class PolicyRecord:
    """GET/PUT .../policy: a namespace's (or the default) retention rules and tiering
    settings. The tiering settings are the keys the operator set, checked by the server
    (tiering/policy.py reads them), kept as given."""

    retention: RetentionRules = field(default_factory=RetentionRules)
    tiering: dict[str, Any] = field(default_factory=dict)

    DERIVED: ClassVar[dict[str, Any]] = {}

    def to_wire(self) -> dict[str, Any]:
        return wire_of(self)

    @classmethod
    def from_wire(cls, d: object) -> PolicyRecord:
        return record_of(cls, d, "policy")


@dataclass(frozen=True)
class TierPlan:
    """What a tiering run moves (or would) to one tier: chunks (of which some come from a
    warmer tier rather than hot), their stored bytes, and the checkpoints they belong to."""

    chunks: int
    from_other_tiers: int
    bytes: int
    checkpoints: list[str] = field(default_factory=list)

    DERIVED: ClassVar[dict[str, Any]] = {}

    def to_wire(self) -> dict[str, Any]:
        return wire_of(self)

    @classmethod
    def from_wire(cls, d: object) -> TierPlan:
        return record_of(cls, d, "tier plan")


@dataclass(frozen=True)
class PromotePlan:
    """Packed chunks a tiering run brings back hot (a rule holds their checkpoints hot)."""

    chunks: int
    bytes: int
    checkpoints: list[str] = field(default_factory=list)

    DERIVED: ClassVar[dict[str, Any]] = {}

    def to_wire(self) -> dict[str, Any]:
        return wire_of(self)

    @classmethod
    def from_wire(cls, d: object) -> PromotePlan:
        return record_of(cls, d, "promote plan")


@dataclass(frozen=True)
class HotBytes:
    """Stored bytes on the hot disk now, and after the plan."""

    bytes: int
    bytes_after: int

    DERIVED: ClassVar[dict[str, Any]] = {}

    def to_wire(self) -> dict[str, Any]:
        return wire_of(self)

    @classmethod
    def from_wire(cls, d: object) -> HotBytes:
        return record_of(cls, d, "hot")


@dataclass(frozen=True)
class RepackSummary:
    """Packs rewritten or deleted. Planned (a dry run): the packs under the `below` live
    fraction and their dead bytes. Done: what was rewritten, deleted, written and freed.
    Also what moving packed chunks on to a colder tier did (no `below` there)."""

    packs: int  # planned: sparse packs; done: packs in the tiers
    below: float | None = _optional()
    dead_bytes: int | None = _optional()  # planned only
    rewritten: int | None = _optional()
    deleted: int | None = _optional()
    new_packs: int | None = _optional()
    chunks_moved: int | None = _optional()
    dead_bytes_freed: int | None = _optional()
    seconds: float | None = _optional()

    DERIVED: ClassVar[dict[str, Any]] = {}

    def to_wire(self) -> dict[str, Any]:
        wire = wire_of(self)
        if self.below is not None:  # first, as the route has always answered it
            wire = {"below": self.below, **wire}
        return wire

    @classmethod
    def from_wire(cls, d: object) -> RepackSummary:
        return record_of(cls, d, "repack")


@dataclass(frozen=True)
class MoveSummary:
    """Chunks moved between the hot disk and a tier, and how fast; a move to a tier also
    says what carrying packed chunks on from warmer tiers did (`from_other_tiers`)."""

    chunks: int
    bytes: int
    packs: int
    skipped: int
    seconds: float
    mb_per_s: float
    from_other_tiers: RepackSummary | None = _optional()

    DERIVED: ClassVar[dict[str, Any]] = {}

    def to_wire(self) -> dict[str, Any]:
        return wire_of(self)

    @classmethod
    def from_wire(cls, d: object) -> MoveSummary:
        return record_of(cls, d, "move")


@dataclass(frozen=True)
class TieringReport:
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
    moved: dict[str, MoveSummary] | None = _optional()
    promoted: MoveSummary | None = _optional()
    retiered: list[str] | None = _optional()

    DERIVED: ClassVar[dict[str, Any]] = {}

    def to_wire(self) -> dict[str, Any]:
        return wire_of(self)

    @classmethod
    def from_wire(cls, d: object) -> TieringReport:
        return record_of(cls, d, "tiering report")


@dataclass(frozen=True)
class CatalogBackup:
    """POST /v1/admin/catalog/backup (201): where the copy went (a tier and its key, or a
    path in the server's backup_dir), its size, and whether it is sealed."""

    tier: str | None = _optional()
    key: str | None = _optional()
    path: str | None = _optional()
    bytes: int = 0
    sealed: bool = False
    seconds: float = 0.0

    DERIVED: ClassVar[dict[str, Any]] = {}

    def to_wire(self) -> dict[str, Any]:
        return wire_of(self)

    @classmethod
    def from_wire(cls, d: object) -> CatalogBackup:
        return record_of(cls, d, "catalog backup")


@dataclass(frozen=True)
class ReplicaRestored:
    """`ckpt catalog restore replica:NAME`: a data dir rebuilt from a tier's continuous
    replica, the base copy of one epoch and generation plus the log segments after it."""

    epoch: int
    generation: str
    base_segment: int
    segments: int  # log segments replayed
    batches: int  # commit batches replayed
    through: float | None  # commit time (Unix) of the last batch replayed
    seconds: float

    DERIVED: ClassVar[dict[str, Any]] = {}

    def to_wire(self) -> dict[str, Any]:
        return wire_of(self)

    @classmethod
    def from_wire(cls, d: object) -> ReplicaRestored:
        return record_of(cls, d, "replica restore")


@dataclass(frozen=True)
class TokenRecord:
    """A token as GET /v1/admin/tokens lists it: never its secret. Times are Unix seconds;
    a token being rotated is listed once per secret."""

    name: str
    scopes: list[str]
    created_at: float
    expires_at: float | None = None  # None: never
    last_used: float | None = None  # as last flushed from the server's memory

    DERIVED: ClassVar[dict[str, Any]] = {}

    def to_wire(self) -> dict[str, Any]:
        return wire_of(self)

    @classmethod
    def from_wire(cls, d: object) -> TokenRecord:
        return record_of(cls, d, "token")


@dataclass(frozen=True)
class TokenIssued:
    """POST /v1/admin/tokens and .../rotate (201): the token and its secret, in this
    answer only; a new token also gets warnings about scopes that match more than they
    seem to."""

    name: str
    scopes: list[str]
    created_at: float
    expires_at: float | None
    last_used: float | None
    token: str  # the secret
    warnings: list[str] | None = _optional()  # create only

    DERIVED: ClassVar[dict[str, Any]] = {}

    @classmethod
    def of(cls, record: TokenRecord, secret: str, warnings: list[str] | None = None) -> TokenIssued:
        return cls(
            record.name, record.scopes, record.created_at, record.expires_at,
            record.last_used, secret, warnings,
        )  # fmt: skip

    def to_wire(self) -> dict[str, Any]:
        return wire_of(self)

    @classmethod
    def from_wire(cls, d: object) -> TokenIssued:
        return record_of(cls, d, "token")


@dataclass(frozen=True)
class AuditEntry:
    """One audit log entry (GET /v1/admin/audit): who changed what, when, with what."""

    at: float  # Unix seconds
    token: str  # token name (never the secret)
    action: str  # "METHOD /route/template"
    target: str  # the path as requested, with its query
    status: int
    request_id: str
    # The request body's fields, bounded (PATCH, policy, tokens): arbitrary JSON.
    details: dict[str, Any] = field(default_factory=dict)

    DERIVED: ClassVar[dict[str, Any]] = {}

    def to_wire(self) -> dict[str, Any]:
        return wire_of(self)

    @classmethod
    def from_wire(cls, d: object) -> AuditEntry:
        return record_of(cls, d, "audit entry")


@dataclass
class CodecShare:
    """Chunks of one codec: how many, their stored (frame) bytes and plaintext bytes."""

    chunks: int = 0
    bytes: int = 0  # stored (frame) bytes
    plain: int = 0  # plaintext bytes

    DERIVED: ClassVar[dict[str, Any]] = {}

    def to_wire(self) -> dict[str, Any]:
        return wire_of(self)

    @classmethod
    def from_wire(cls, d: object) -> CodecShare:
        return record_of(cls, d, "codec share")


@dataclass
class Usage:
    """GET .../storage, and each namespace of GET /v1/stats?namespaces=true: the bytes a
    set of checkpoints holds, the chunks (and delta bases) it needs, by codec and by tier.
    Not frozen: the engine adds chunk after chunk as it measures."""

    logical_bytes: int = 0  # the files' sizes
    stored_bytes: int = 0  # frames at rest for the distinct chunks (and bases they need)
    chunks: int = 0
    max_chain: int = 0  # most deltas one read of these chunks decodes
    codecs: dict[str, CodecShare] = field(default_factory=dict)
    tiers: dict[str, int] = field(default_factory=dict)  # stored bytes by tier ("hot")

    DERIVED: ClassVar[dict[str, Any]] = {"ratio": {"type": ["number", "null"]}}

    @property
    def ratio(self) -> float | None:
        """Logical over stored bytes (None when nothing is stored)."""
        return round(self.logical_bytes / self.stored_bytes, 3) if self.stored_bytes else None

    def to_wire(self) -> dict[str, Any]:
        return {**wire_of(self), "ratio": self.ratio}

    @classmethod
    def from_wire(cls, d: object) -> Usage:
        return record_of(cls, d, "usage")


@dataclass(frozen=True)
class TierTotals:
    """Chunks in one place (`hot`, or a tier's name) and their stored bytes."""

    chunks: int
    bytes: int

    DERIVED: ClassVar[dict[str, Any]] = {}

    def to_wire(self) -> dict[str, Any]:
        return wire_of(self)

    @classmethod
    def from_wire(cls, d: object) -> TierTotals:
        return record_of(cls, d, "tier totals")


@dataclass(frozen=True)
class QuotaUse:
    """A configured quota: the namespaces it covers (a glob), its limit and the logical
    bytes they hold."""

    glob: str
    limit: int
    used: int

    DERIVED: ClassVar[dict[str, Any]] = {}

    def to_wire(self) -> dict[str, Any]:
        return wire_of(self)

    @classmethod
    def from_wire(cls, d: object) -> QuotaUse:
        return record_of(cls, d, "quota")


@dataclass(frozen=True)
class ReplicationStatus:
    """A primary's continuous replica (vault/replication/shipper.py): where, how far
    behind (`lag_seconds` against `lag_budget`), and counters since start."""

    tier: str
    mode: str = field(metadata={"schema": {"enum": ["async", "sync"]}})
    epoch: int
    fenced_by: int | None  # the epoch that fenced this primary, once found
    generation: str
    lag_seconds: float
    lag_bytes: int
    lag_budget: float
    queued_batches: int
    base_pending: bool
    lag_p50: float | None
    lag_p99: float | None
    batches: int
    restorable_batch: int
    segments: int
    bases: int
    shipped_bytes: int
    failures: int
    overflows: int
    last_error: str | None

    DERIVED: ClassVar[dict[str, Any]] = {}

    def to_wire(self) -> dict[str, Any]:
        return wire_of(self)

    @classmethod
    def from_wire(cls, d: object) -> ReplicationStatus:
        return record_of(cls, d, "replication")


@dataclass(frozen=True)
class StandbyStatus:
    """A standby following a replica (vault/replication/follow.py): its position, how long
    since it last held everything the replica held, and counters since start."""

    tier: str
    state: str
    epoch: int | None
    generation: str | None
    next_segment: int | None
    poll_interval: float
    lag_seconds: float | None  # None until the first poll that found nothing newer
    applied_through: float | None  # commit time of the last batch applied
    apply_lag_p50: float | None
    apply_lag_p99: float | None
    segments: int
    batches: int
    rebases: int
    polls: int
    failures: int
    last_error: str | None

    DERIVED: ClassVar[dict[str, Any]] = {}

    def to_wire(self) -> dict[str, Any]:
        return wire_of(self)

    @classmethod
    def from_wire(cls, d: object) -> StandbyStatus:
        return record_of(cls, d, "standby")


@dataclass(frozen=True)
class StatsReport:
    """GET /v1/stats: storage totals, by tier and recoded codec; quotas; this server's
    role and its replica or standby; with `namespaces=true`, each namespace's usage."""

    logical_bytes: int
    stored_bytes: int
    chunks: int
    checkpoints: int
    namespaces: int
    dedup_ratio: float | None
    tiers: dict[str, TierTotals]
    codecs: dict[str, CodecShare]
    map_size: int
    quotas: list[QuotaUse]
    role: str = field(metadata={"schema": {"enum": ["primary", "standby", "fenced"]}})
    replication: ReplicationStatus | None
    standby: StandbyStatus | None
    by_namespace: dict[str, Usage] | None = _optional()

    DERIVED: ClassVar[dict[str, Any]] = {}

    def to_wire(self) -> dict[str, Any]:
        return wire_of(self)

    @classmethod
    def from_wire(cls, d: object) -> StatsReport:
        return record_of(cls, d, "stats")


@dataclass(frozen=True)
class Promotion:
    """POST /v1/admin/promote: the epoch this server claimed (fencing the old primary),
    the replica generation and log segment it took over at, and its role now."""

    epoch: int
    generation: str
    fence: int  # the first log segment of the new epoch
    seconds: float
    role: str = "primary"

    DERIVED: ClassVar[dict[str, Any]] = {}

    def to_wire(self) -> dict[str, Any]:
        return wire_of(self)

    @classmethod
    def from_wire(cls, d: object) -> Promotion:
        return record_of(cls, d, "promotion")


@dataclass(frozen=True)
class Health:
    """GET /v1/health (no token): liveness, version and role; to a caller on the same
    machine the local socket's path (it may hand files over); on a standby, its lag behind
    the replica (None until its first poll that found nothing newer)."""

    status: str
    version: str
    role: str = field(metadata={"schema": {"enum": ["primary", "standby", "fenced"]}})
    instance: str  # random per start: tells servers on one machine apart
    local_socket: str | None = _optional()
    # A standby's only: present (maybe null) exactly when `role` is "standby".
    lag_seconds: float | None = field(
        default=None, metadata={"optional": True, "schema": {"type": ["number", "null"]}}
    )

    DERIVED: ClassVar[dict[str, Any]] = {}

    def to_wire(self) -> dict[str, Any]:
        wire = wire_of(self)
        if self.role == "standby":
            wire["lag_seconds"] = self.lag_seconds
        return wire

    @classmethod
    def from_wire(cls, d: object) -> Health:
        return record_of(cls, d, "health")


@dataclass(frozen=True)
class CheckpointWritten:
    """What a change answers a write-only token: only what it wrote, since metadata, file
    names, sizes and hashes are what such a token may not read."""

    id: str
    namespace: str

    DERIVED: ClassVar[dict[str, Any]] = {}

    def to_wire(self) -> dict[str, Any]:
        return wire_of(self)

    @classmethod
    def from_wire(cls, d: object) -> CheckpointWritten:
        return record_of(cls, d, "written")
