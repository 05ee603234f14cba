"""The answers of the service's other admin routes, one record each: stats and storage
(with a primary's replication or a standby's status), health and promotion, policies,
tokens and the audit log; and what a write-only token is answered.

Built by the engine and the routes, serialised once with `to_wire`, parsed by the client
with `from_wire`, their schemas derived by api/routes/openapi.py (see protocol/_maintenance.py
for the maintenance reports, and protocol/_wire.py for how the conversions read fields).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ._wire import Record, optional, wire_of


@dataclass(frozen=True)
class KeepBestRule(Record):
    """Keep the `n` checkpoints best by a numeric metadata key (`mode` min or max)."""

    metric: str
    mode: str = field(metadata={"schema": {"enum": ["min", "max"]}})
    n: int


@dataclass(frozen=True)
class RetentionRules(Record):
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


@dataclass(frozen=True)
class PolicyRecord(Record):
    """GET/PUT .../policy: a namespace's (or the default) retention rules and tiering
    settings. The tiering settings are the keys the operator set, checked by the server
    (tiering/policy.py reads them), kept as given."""

    retention: RetentionRules = field(default_factory=RetentionRules)
    tiering: dict[str, Any] = field(default_factory=dict)
    s3: dict[str, Any] = field(default_factory=dict)  # the S3 endpoint's keys (api/s3/)


@dataclass(frozen=True)
class TokenRecord(Record):
    """A token as GET /v1/admin/tokens lists it: never its secret. Times are Unix seconds;
    a token being rotated is listed once per secret."""

    name: str
    scopes: list[str]
    created_at: float
    expires_at: float | None = None  # None: never
    last_used: float | None = None  # as last flushed from the server's memory


@dataclass(frozen=True)
class TokenIssued(Record):
    """POST /v1/admin/tokens and .../rotate (201): the token and its secret, in this
    answer only; a new token also gets warnings about scopes that match more than they
    seem to."""

    name: str
    scopes: list[str]
    created_at: float
    expires_at: float | None
    last_used: float | None
    token: str  # the secret
    warnings: list[str] | None = optional()  # create only

    @classmethod
    def of(cls, record: TokenRecord, secret: str, warnings: list[str] | None = None) -> TokenIssued:
        return cls(
            record.name, record.scopes, record.created_at, record.expires_at,
            record.last_used, secret, warnings,
        )  # fmt: skip


@dataclass(frozen=True)
class AuditEntry(Record):
    """One audit log entry (GET /v1/admin/audit): who changed what, when, with what."""

    at: float  # Unix seconds
    token: str  # token name (never the secret)
    action: str  # "METHOD /route/template"
    # The path as requested, without its query (issue 30: a 7 KB query was kept whole);
    # entries written before keep theirs.
    target: str
    status: int
    request_id: str
    # The request body's fields, bounded (PATCH, policy, tokens): arbitrary JSON. A bulk
    # delete lists what it deleted (api/audit.py `bulk_delete_details`).
    details: dict[str, Any] = field(default_factory=dict)
    route: str = ""  # the route's template, "/v1/admin/gc" ("" in entries before issue 30)
    # The query parameters the route acts on (dry_run, repair, namespace, to, ...), each
    # value capped at 256 characters; others are not kept.
    params: dict[str, str] = field(default_factory=dict)


@dataclass
class CodecShare(Record):
    """Chunks of one codec: how many, their stored (frame) bytes and plaintext bytes."""

    chunks: int = 0
    bytes: int = 0  # stored (frame) bytes
    plain: int = 0  # plaintext bytes


@dataclass
class Usage(Record):
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


@dataclass(frozen=True)
class TierTotals(Record):
    """Chunks in one place (`hot`, or a tier's name) and their stored bytes."""

    chunks: int
    bytes: int


@dataclass(frozen=True)
class DiskSpace(Record):
    """An LMDB environment's data file on disk: the blocks it takes (what `du` counts), the
    bytes of the pages on LMDB's free list, and the allocated bytes holding no page in use
    (free pages not yet given back, and what lies past the last page): what a shrink of the
    hot store gives back to the file system."""

    allocated_bytes: int
    free_bytes: int
    reclaimable_bytes: int


@dataclass(frozen=True)
class QuotaUse(Record):
    """A configured quota: the namespaces it covers (a glob), its limit and the logical
    bytes they hold; in a cluster, the shard that enforces it over its own namespaces."""

    glob: str
    limit: int
    used: int
    shard: int | None = optional()  # a cluster's stats only


@dataclass(frozen=True)
class ReplicationStatus(Record):
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


@dataclass(frozen=True)
class StandbyStatus(Record):
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


@dataclass(frozen=True)
class StatsReport(Record):
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
    by_namespace: dict[str, Usage] | None = optional()
    # The data dir's allocated bytes (st_blocks x 512 over every file: the environments,
    # the journal, the rest: what `du` shows) and how much of it a shrink gives back
    # (left out by servers from before them)
    disk_bytes: int | None = optional()
    reclaimable_bytes: int | None = optional()
    environments: dict[str, DiskSpace] | None = optional()  # "catalog", "frames"


@dataclass(frozen=True)
class Promotion(Record):
    """POST /v1/admin/promote: the epoch this server claimed (fencing the old primary),
    the replica generation and log segment it took over at, and its role now."""

    epoch: int
    generation: str
    fence: int  # the first log segment of the new epoch
    seconds: float
    role: str = "primary"


@dataclass(frozen=True)
class Health(Record):
    """GET /v1/health (no token): liveness, version and role; which process answered; to a
    caller on the same machine the local socket's path (it may hand files over); on a
    standby, its lag behind the replica (None until its first poll that found nothing
    newer)."""

    status: str
    version: str
    role: str = field(metadata={"schema": {"enum": ["primary", "standby", "fenced"]}})
    instance: str  # random per start: tells servers on one machine apart
    local_socket: str | None = optional()
    # Which of the service's processes answered: 0 the one that writes, 1.. its workers
    # (`ckpt serve --workers`); all of them share `instance`.
    worker: int | None = optional()
    # A standby's only: present (maybe null) exactly when `role` is "standby".
    lag_seconds: float | None = field(
        default=None, metadata={"optional": True, "schema": {"type": ["number", "null"]}}
    )

    def to_wire(self) -> dict[str, Any]:
        wire = wire_of(self)
        if self.role == "standby":
            wire["lag_seconds"] = self.lag_seconds
        return wire


@dataclass(frozen=True)
class CheckpointWritten(Record):
    """What a change answers a write-only token: only what it wrote, since metadata, file
    names, sizes and hashes are what such a token may not read."""

    id: str
    namespace: str


_COUNT: dict[str, Any] = {"schema": {"minimum": 0}}


@dataclass(frozen=True)
class NamespaceBytes(Record):
    """One namespace in a storage sample: its live checkpoints' logical bytes and the
    bytes their distinct chunks take at rest (from the last usage scan)."""

    logical_bytes: int = field(metadata=_COUNT)
    stored_bytes: int = field(metadata=_COUNT)


@dataclass(frozen=True)
class StorageSample(Record):
    """The vault's bytes at one moment (GET /v1/stats/history; the catalog keeps the same
    JSON): `disk_bytes` is what the data dir takes on the file system (allocated blocks,
    what `du` shows), which LMDB's free pages and the map's growth make differ from
    `stored_bytes`. The vault-wide totals are null to a token without admin."""

    at: float  # epoch seconds
    logical_bytes: int | None = field(metadata=_COUNT)
    stored_bytes: int | None = field(metadata=_COUNT)
    disk_bytes: int | None = field(metadata=_COUNT)
    namespaces: dict[str, NamespaceBytes] = field(default_factory=dict)
