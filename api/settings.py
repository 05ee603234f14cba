"""Service settings, read and validated once at start-up.

Sources, later ones winning: built-in defaults, the TOML file (`--config`), environment
variables `CKPT_<SECTION>_<KEY>`, command-line flags. An unknown key or a bad value stops
the start with a message naming it.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from checkpoint_vault.cluster import ClusterConfig
from checkpoint_vault.cluster.shards import upload_prefix
from checkpoint_vault.maintenance import MIN_RATE
from checkpoint_vault.protocol import (
    DEFAULT_DATA_DIR,
    DEFAULT_PORT,
    LOCAL_SOCKET_FILE,
    parse_duration,
    parse_size,
)
from checkpoint_vault.vault import PROFILES, Keyring, VaultConfig, VaultError
from checkpoint_vault.vault.quotas import Quota
from checkpoint_vault.vault.replication import FollowConfig, ReplicationConfig
from checkpoint_vault.vault.replication.shipper import MODES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


class SettingsError(ValueError):
    """A configuration value is unknown or invalid; the message names the key."""


def _port(value: object) -> int:
    port = int(str(value))
    if not 0 <= port <= 65535:
        raise ValueError(f"port out of range: {port}")
    return port


def _optional_port(value: object) -> int | None:
    """A port, or none (0 or empty): the S3 endpoint is off."""
    if value in (None, "", 0, "0"):
        return None
    return _port(value)


def _profile(value: object) -> str:
    if value not in PROFILES:
        raise ValueError(f"unknown profile {value!r}; known: {sorted(PROFILES)}")
    return str(value)


def _log_format(value: object) -> str:
    if value not in ("auto", "json", "text"):
        raise ValueError(f"must be auto, json or text, got {value!r}")
    return str(value)


def _optional_path(value: object, ok: Callable[[Path], bool], need: str) -> Path | None:
    """Empty: none. Otherwise a path that passes `ok` now (not at first use)."""
    if value in ("", None):
        return None
    path = Path(str(value))
    if not ok(path):
        raise ValueError(f"must be {need}, got {value!r}")
    return path


def _optional_dir(value: object) -> Path | None:
    """An absolute directory (backups land only there)."""
    return _optional_path(value, Path.is_absolute, "an absolute directory")


def _optional_file(value: object) -> Path | None:
    """A file that exists (TLS certificates and keys)."""
    return _optional_path(value, Path.is_file, "an existing file")


def _key_file(value: object) -> Path | None:
    """Empty: no encryption. Otherwise the file must load now, not at the first demotion."""
    if value in ("", None):
        return None
    path = Path(str(value))
    try:
        Keyring.load(path)
    except VaultError as e:
        raise ValueError(str(e)) from None
    return path


def _replication_mode(value: object) -> str:
    if value not in MODES:
        raise ValueError(f"must be one of {', '.join(MODES)}")
    return str(value)


def _follow(value: object) -> str:
    """The tier whose replica a standby follows: `replica:NAME` (as `ckpt catalog restore`
    spells it), `tier:NAME` or `NAME`."""
    text = str(value)
    for prefix in ("replica:", "tier:"):
        text = text.removeprefix(prefix)
    if not text:
        raise ValueError("name a configured tier, e.g. replica:cold")
    return text


def _positive_duration(value: object) -> float:
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"must be more than 0, got {value!r}")
    return seconds


def _bool(value: object) -> bool:
    """A TOML boolean, or its text from an environment variable."""
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "1", "yes"):
        return True
    if str(value).lower() in ("false", "0", "no"):
        return False
    raise ValueError(f"must be true or false, got {value!r}")


def _non_negative_int(value: object) -> int:
    """A count where 0 turns the bound off."""
    n = int(str(value))
    if n < 0:
        raise ValueError(f"must be 0 or more, got {n}")
    return n


def _rate(value: object) -> int:
    """A maintenance rate: 0 (no limit) or at least `maintenance.MIN_RATE` (1 MiB/s), the
    floor the admin routes hold too: slower, a scheduled run holds the lock for days."""
    rate = parse_size(value)
    if 0 < rate < MIN_RATE:
        raise ValueError(f"must be 0 (no limit) or at least 1MiB per second, got {value!r}")
    return rate


def _positive_int(value: object) -> int:
    n = int(str(value))
    if n < 1:
        raise ValueError(f"must be at least 1, got {n}")
    return n


def _share(value: object) -> float:
    """A share of a whole, 0 or more (`[storage] shrink_above`)."""
    share = float(str(value))
    if not share >= 0.0:  # NaN too
        raise ValueError(f"must be 0 or more, got {value!r}")
    return share


@dataclass(frozen=True)
class Maintenance:
    """Intervals in seconds; 0 disables the job."""

    retention_interval: float = 3600.0
    gc_interval: float = 3600.0
    scrub_interval: float = 86400.0
    scrub_rate: float = 50e6  # bytes per second the background scrub may read
    tiering_interval: float = 3600.0
    compact_interval: float = 600.0  # deltas for what was saved since the last run
    compact_rate: float = 100e6  # bytes per second compaction may read
    backup_interval: float = 6 * 3600.0  # catalog backup to the coldest tier (when one exists)
    sample_interval: float = 3600.0  # usage scan and storage sample (the console's chart)


# (section, key) -> (attribute on Settings, "vault.<field>" or "maintenance.<field>", parser)
ENGINE_SOCKET_FILE = "ckpt-engine.sock"  # workers forward changes here (node/forward.py)
CALLS_SOCKET_FILE = "ckpt-calls.sock"  # and hand over the saves they prepared (node/calls.py)
HANDOFF_SOCKET_FILE = "ckpt-handoff.sock"  # and connections with a large body (node/handoff.py)
# Beyond this many processes the writer, not the HTTP work, bounds saves (docs/SCALING.md).
MAX_AUTO_WORKERS = 8
_SUN_PATH_MAX = 108  # bytes of a Unix socket's path, its terminating NUL included

_KEYS: dict[tuple[str, str], tuple[str, Any]] = {
    ("server", "host"): ("host", str),
    ("server", "port"): ("port", _port),
    ("server", "data_dir"): ("data_dir", Path),
    ("server", "workers"): ("workers", _non_negative_int),
    ("server", "worker_threads"): ("worker_threads", _positive_int),
    ("server", "max_json_body"): ("max_json_body", parse_size),
    ("server", "shutdown_timeout"): ("shutdown_timeout", parse_duration),
    ("server", "body_timeout"): ("body_timeout", parse_duration),
    ("server", "body_min_rate"): ("body_min_rate", parse_size),
    ("server", "receivers_per_token"): ("receivers_per_token", _positive_int),
    ("server", "workers_per_token"): ("workers_per_token", _non_negative_int),
    ("server", "handovers_per_token"): ("handovers_per_token", _positive_int),
    ("server", "header_timeout"): ("header_timeout", _positive_duration),
    ("server", "spare_descriptors"): ("spare_descriptors", _positive_int),
    ("server", "headless_per_client"): ("headless_per_client", _positive_int),
    ("server", "headless_connections"): ("headless_connections", _positive_int),
    ("server", "forwards_per_token"): ("forwards_per_token", _positive_int),
    ("server", "forwards_per_worker"): ("forwards_per_worker", _positive_int),
    ("server", "adopted_per_token"): ("adopted_per_token", _positive_int),
    ("server", "adopted_connections"): ("adopted_connections", _positive_int),
    ("server", "max_batch_body"): ("max_batch_body", parse_size),
    ("server", "backup_dir"): ("backup_dir", _optional_dir),
    ("server", "tls_cert"): ("tls_cert", _optional_file),
    ("server", "tls_key"): ("tls_key", _optional_file),
    ("server", "tls_client_ca"): ("tls_client_ca", _optional_file),
    ("server", "local_socket"): ("local_socket", _bool),
    ("server", "tls_key_shared"): ("tls_key_shared", _bool),
    ("log", "format"): ("log_format", _log_format),
    ("encryption", "key_file"): ("key_file", _key_file),
    ("storage", "map_size"): ("vault.map_size", parse_size),
    ("storage", "max_chunk_size"): ("vault.max_chunk_size", parse_size),
    ("storage", "default_profile"): ("vault.default_profile", _profile),
    ("storage", "save_journal"): ("vault.save_journal", _bool),
    ("storage", "shrink_above"): ("vault.shrink_above", _share),
    ("uploads", "ttl"): ("vault.upload_ttl", parse_duration),
    ("uploads", "part_ttl"): ("vault.part_ttl", parse_duration),
    ("uploads", "part_ship_delay"): ("vault.part_ship_delay", parse_duration),
    ("uploads", "max_sessions"): ("vault.max_upload_sessions", _non_negative_int),
    ("uploads", "max_sessions_per_token"): ("vault.max_upload_sessions_per_token", _positive_int),
    ("uploads", "max_pending_bytes_per_token"): ("vault.max_pending_bytes_per_token", parse_size),
    ("uploads", "max_checkpoint_bytes"): ("vault.max_checkpoint_bytes", parse_size),
    ("uploads", "max_commit_chunks"): ("vault.max_commit_chunks", _positive_int),
    ("uploads", "max_commit_read_back_bytes"): ("vault.max_commit_read_back_bytes", parse_size),
    ("uploads", "max_read_backs_per_token"): ("vault.max_read_backs_per_token", _positive_int),
    ("limits", "requests_per_second"): ("requests_per_second", float),
    ("limits", "burst"): ("request_burst", float),
    ("gc", "grace"): ("vault.gc_grace", parse_duration),
    ("audit", "max_age"): ("vault.audit_max_age", parse_duration),
    ("audit", "max_bytes"): ("vault.audit_max_bytes", parse_size),
    ("maintenance", "retention_interval"): ("maintenance.retention_interval", parse_duration),
    ("maintenance", "gc_interval"): ("maintenance.gc_interval", parse_duration),
    ("maintenance", "scrub_interval"): ("maintenance.scrub_interval", parse_duration),
    ("maintenance", "scrub_rate"): ("maintenance.scrub_rate", _rate),
    ("maintenance", "tiering_interval"): ("maintenance.tiering_interval", parse_duration),
    ("maintenance", "backup_interval"): ("maintenance.backup_interval", parse_duration),
    ("maintenance", "compact_interval"): ("maintenance.compact_interval", parse_duration),
    ("maintenance", "compact_rate"): ("maintenance.compact_rate", _rate),
    ("maintenance", "sample_interval"): ("maintenance.sample_interval", parse_duration),
    ("cluster", "node"): ("cluster.node", str),
    ("cluster", "url"): ("cluster.url", str),
    ("cluster", "s3_url"): ("cluster.s3_url", str),
    ("cluster", "shard"): ("cluster.shard", int),
    ("cluster", "shards"): ("cluster.shards", int),
    ("cluster", "store"): ("cluster.store", str),
    ("cluster", "tier"): ("cluster.tier", str),
    ("cluster", "shared_tier"): ("cluster.shared_tier", str),
    ("cluster", "shared_gc_grace"): ("cluster.shared_gc_grace", parse_duration),
    ("cluster", "shared_index_fanin"): ("cluster.shared_index_fanin", int),
    ("cluster", "beat_interval"): ("cluster.beat_interval", parse_duration),
    ("cluster", "lease_ttl"): ("cluster.lease_ttl", parse_duration),
    ("cluster", "txn_timeout"): ("cluster.txn_timeout", parse_duration),
    ("replication", "tier"): ("replication.tier", str),
    ("replication", "mode"): ("replication.mode", _replication_mode),
    ("replication", "lag_budget"): ("replication.lag_budget", parse_duration),
    ("replication", "max_backlog"): ("replication.max_backlog", parse_size),
    ("replication", "base_interval"): ("replication.base_interval", parse_duration),
    ("replication", "base_after"): ("replication.base_after_bytes", parse_size),
    ("s3", "port"): ("s3_port", _optional_port),
    ("s3", "commit_after"): ("s3_commit_after", _positive_duration),
    ("standby", "follow"): ("follow.tier", _follow),
    ("standby", "poll_interval"): ("follow.poll_interval", _positive_duration),
}


@dataclass(frozen=True)
class Settings:
    data_dir: Path = Path(DEFAULT_DATA_DIR)
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    # Server processes answering on the port (node/supervisor.py). One: it also writes the data
    # dir. More: each is a worker that reads the data dir and forwards changes, and one
    # process more writes it without answering on the port, so its interpreter lock is
    # the writer's. 0: one per CPU, at most MAX_AUTO_WORKERS. One process for a standby
    # and with TLS (`processes`).
    workers: int = 0
    worker_threads: int = 16  # blocking vault calls in flight; most wait on the writer
    # A commit listing 160k chunks (a 10 GiB file at 64 KiB) is ~11 MB of JSON; anything
    # bigger streams files or commits in parts. Parsed on the worker pool (api/http.py).
    max_json_body: int = 16 << 20
    shutdown_timeout: float = 30.0
    # Longest wait for the next byte of a request body; then 408 and the connection closes.
    body_timeout: float = 60.0
    # And a body must arrive whole within body_timeout plus its Content-Length at this many
    # bytes per second (0: no bound), or 408: the idle timer alone let a byte every minute
    # hold a thread for ever (mod_reqtimeout's MinRate). Small bodies too: each one a byte
    # per 20 s held a worker's connection and, forwarded, one of the writer's.
    body_min_rate: int = 64 << 10
    # Receiver threads (of 64) and hand-over threads (of 8) one token may hold at once;
    # past that its next large body or descriptor is refused with 429 and Retry-After, so
    # one tenant's slow or dripped bodies never leave another's waiting for a thread.
    receivers_per_token: int = 16
    handovers_per_token: int = 2
    # Worker threads (of worker_threads) one token's engine calls may hold at once; past
    # that they wait in the token's own queue (api/turns.py), so one tenant's many calls
    # never leave another's waiting for a worker. 0: half the pool.
    workers_per_token: int = 0
    # A connection's request head must be whole this long after it opened or got its last
    # answer, or it is closed (idle keep-alive connections too): connections that never
    # finished their headers were kept, and 1,050 of them used up the descriptors.
    header_timeout: float = 30.0
    # TCP connections are refused at accept while fewer than this many descriptors would
    # remain under RLIMIT_NOFILE: kept for receivers' and senders' dups (192), hand-overs,
    # LMDB and logs, so the limit itself is never reached.
    spare_descriptors: int = 320
    # Connections of one process that have not yet sent a whole request head, per client
    # address and in all: past either, the oldest such connection (of that address, else
    # of any) is closed for the new one. 1,500 idle connections left the workers
    # resetting every new one for the 30 s of header_timeout. Kept under the descriptor
    # bound (half of what it leaves at most, node/serve.py `Unheaded`).
    headless_per_client: int = 32
    headless_connections: int = 256
    # Requests a worker passes to the writing process at once (forwarded, or being handed
    # over), per token name and in all: past them 429 / 503 with Retry-After, so a
    # tenant's dripped bodies never hold the writer's descriptors (node/forward.py).
    forwards_per_token: int = 32
    forwards_per_worker: int = 128
    # Connections the writing process holds after its workers handed them over, per token
    # and in all (node/handoff.py): past them 429 on the connection / 503 from the worker.
    adopted_per_token: int = 16
    adopted_connections: int = 256
    max_batch_body: int = 64 << 20  # chunk batches and one-request saves are read whole
    log_format: str = "auto"  # JSON lines unless stderr is a terminal
    # The only directory `POST /v1/admin/catalog/backup?to=` may write files into; None:
    # backups go to tiers only (an admin token must not write arbitrary server paths).
    backup_dir: Path | None = None
    # Per token (by name; admin exempt): average requests per second and burst; then 429
    # with Retry-After. 0 turns it off. A 2 MiB chunk batch per request at 300 MB/s is
    # ~150 requests per second, so the default leaves producers alone.
    requests_per_second: float = 500.0
    request_burst: float = 1000.0
    # HTTPS: certificate (chain) and key, PEM; with tls_client_ca clients must also present
    # a certificate that CA signed (mTLS). All None: plain HTTP (keep it on loopback).
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    # A TLS key other users may read is refused at start (anyone on the host could then
    # pose as this server); true: served anyway, with a warning (a key in a shared group).
    tls_key_shared: bool = False
    # Also serve on a Unix-domain socket in the data dir (`socket_path`), where a client on
    # this machine hands files over by descriptor instead of sending their bytes.
    local_socket: bool = True
    # Seals everything written to other tiers (AES-256-GCM); None: stored plain.
    key_file: Path | None = None
    # The S3-compatible endpoint (api/s3/) listens on this port of `host`; None: off. A
    # port of its own, not a path under this one: S3 clients sign and build the path from
    # the bucket, and several SDKs drop a path an endpoint URL carries (docs/API.md).
    s3_port: int | None = None
    # An open S3 checkpoint no object was written into for this long is committed even
    # without its completion marker (frameworks that write none); a namespace's policy
    # may set its own (`s3.commit_after`).
    s3_commit_after: float = 60.0
    vault: VaultConfig = field(default_factory=VaultConfig)
    maintenance: Maintenance = field(default_factory=Maintenance)
    # [tiers.<name>]: url plus backend options (endpoint, region, access_key_id, ...).
    # Credentials may instead come from each provider's usual environment variables.
    tiers: dict[str, dict[str, Any]] = field(default_factory=dict)
    # [replication]: continuous copy to one of the tiers (vault/replication/); None: off.
    replication: ReplicationConfig | None = None
    # [standby] follow (`ckpt serve --follow replica:NAME`): serve read-only, following the
    # replica in that tier, until promoted. A tier of "" (only poll_interval set, say in a
    # file the primary shares): not a standby; see `following`.
    follow: FollowConfig | None = None
    # [cluster]: this process serves one shard of a cluster (cluster/, api/cluster/context.py).
    cluster: ClusterConfig | None = None

    @property
    def socket_path(self) -> Path | None:
        """Where the local socket listens: None when off, with TLS (the socket speaks plain
        HTTP, so it would be a way around TLS and client certificates), or when the data
        dir's path is too long for a socket address (108 bytes on Linux)."""
        if not self.local_socket or self.tls_cert is not None:
            return None
        path = self.data_dir.absolute() / LOCAL_SOCKET_FILE
        return path if len(os.fsencode(path)) < _SUN_PATH_MAX else None

    @property
    def engine_socket(self) -> Path | None:
        """Where the process that writes listens for what its workers forward (mode 0600,
        in the data dir); None when the data dir's path is too long for a socket address
        (then there are no workers)."""
        path = self.data_dir.absolute() / ENGINE_SOCKET_FILE
        return path if len(os.fsencode(path)) < _SUN_PATH_MAX else None

    @property
    def calls_socket(self) -> Path | None:
        """Where the process that writes takes the saves its workers prepared (node/calls.py);
        None with no engine socket."""
        engine = self.engine_socket
        path = engine.with_name(CALLS_SOCKET_FILE) if engine is not None else None
        return path if path is not None and len(os.fsencode(path)) < _SUN_PATH_MAX else None

    @property
    def handoff_socket(self) -> Path | None:
        """Where the process that writes adopts connections its workers hand over whole
        (node/handoff.py); None with no engine socket."""
        engine = self.engine_socket
        path = engine.with_name(HANDOFF_SOCKET_FILE) if engine is not None else None
        return path if path is not None and len(os.fsencode(path)) < _SUN_PATH_MAX else None

    @property
    def answering(self) -> int:
        """How many server processes answer on the port: `workers`, or one per CPU (at
        most MAX_AUTO_WORKERS); one for a standby (its follower writes as the replica's log
        arrives), with TLS (aiohttp would serve the engine socket with TLS too) and where
        the engine socket cannot be had."""
        if self.following is not None or self.tls_cert is not None or self.handoff_socket is None:
            return 1
        if self.workers:
            return self.workers
        return max(1, min(usable_cpus(), MAX_AUTO_WORKERS))

    @property
    def processes(self) -> int:
        """How many server processes run: one that answers and writes, or the `answering`
        workers and one that writes. Measured on 2 cores, 16 agents saving (docs/SCALING.md):
        two workers and a writer that answers nothing beat a writer that also answers
        beside one worker, whose HTTP work took the interpreter lock from the writer
        (apply 1.1 ms of wall time per save against 0.6)."""
        answering = self.answering
        return 1 if answering == 1 else answering + 1

    @property
    def following(self) -> FollowConfig | None:
        """The replica this server follows as a standby, or None."""
        return self.follow if self.follow is not None and self.follow.tier else None

    def with_values(self, values: Mapping[tuple[str, str], object], origin: str) -> Settings:
        top: dict[str, Any] = {}
        inner: dict[str, Any] = {}
        jobs: dict[str, Any] = {}
        repl: dict[str, Any] = {}
        follow: dict[str, Any] = {}
        clustered: dict[str, Any] = {}
        for (section, key), raw in values.items():
            if (section, key) not in _KEYS:
                raise SettingsError(f"{origin}: unknown setting [{section}] {key}")
            attr, parse = _KEYS[(section, key)]
            try:
                value = parse(raw)
            except (TypeError, ValueError) as e:
                raise SettingsError(f"{origin}: [{section}] {key}: {e}") from None
            if attr.startswith("vault."):
                inner[attr[6:]] = value
            elif attr.startswith("maintenance."):
                jobs[attr[12:]] = value
            elif attr.startswith("replication."):
                repl[attr[12:]] = value
            elif attr.startswith("follow."):
                follow[attr[7:]] = value
            elif attr.startswith("cluster."):
                clustered[attr[8:]] = value
            else:
                top[attr] = value
        replication = self.replication
        if repl:
            replication = replace(replication or ReplicationConfig(tier=""), **repl)
        standby = self.follow
        if follow:
            standby = replace(standby or FollowConfig(tier=""), **follow)
        return replace(
            self,
            cluster=_cluster(self.cluster, clustered),
            vault=replace(self.vault, **inner),
            maintenance=replace(self.maintenance, **jobs),
            replication=replication,
            follow=standby,
            **top,
        )


def _cluster(current: ClusterConfig | None, values: dict[str, Any]) -> ClusterConfig | None:
    """[cluster] with `values` set (checked once every source is in: `_with_cluster`)."""
    if not values:
        return current
    return replace(current or ClusterConfig(), **values)


def _with_cluster(settings: Settings) -> Settings:
    """A cluster's tier must exist, and its uploads name their shard (cluster/shards.py)."""
    cluster = settings.cluster
    if cluster is None:
        return settings
    try:
        cluster.check()
        cluster = cluster.with_s3(settings.s3_port)
    except ValueError as e:
        raise SettingsError(str(e)) from None
    if cluster.tier not in ("", *settings.tiers):
        raise SettingsError(f"[cluster] tier {cluster.tier!r}: no such [tiers.<name>]")
    if cluster.shared_tier and cluster.shared_tier not in settings.tiers:
        raise SettingsError(
            f"[cluster] shared_tier {cluster.shared_tier!r}: no such [tiers.<name>]"
        )
    prefix = upload_prefix(cluster.shard)
    vault = replace(settings.vault, upload_id_prefix=prefix)
    if cluster.shared_tier:
        writer = f"{cluster.node}-s{cluster.shard}"
        vault = replace(
            vault,
            shared_tier=cluster.shared_tier,
            shared_writer=writer,
            shared_shard=cluster.shard,
            shared_shards=cluster.shards,
            shared_gc_grace=cluster.shared_gc_grace,
            shared_index_fanin=cluster.shared_index_fanin,
        )
    return replace(settings, vault=vault, cluster=cluster)


REDACTED_KEYS = frozenset({"token", "secret", "password", "key", "credentials"})


def usable_cpus(cgroup: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """The CPUs this process may use: those it may run on (a cpuset, `taskset`), fewer if
    a cgroup's CPU quota allows less (a container's `--cpus`, a pod's CPU limit), where
    `os.cpu_count()` would name every CPU of the host."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        quota, period = cgroup.read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus or 1, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass  # no cgroup v2 limit to read
    return cpus or 1


def effective_config(settings: Settings) -> dict[str, dict[str, Any]]:
    """Every setting by [section] key, as the service would run with it; values of keys
    whose name says secret are shown as "<redacted>"."""
    out: dict[str, dict[str, Any]] = {}
    for name, spec in settings.tiers.items():
        out[f"tiers.{name}"] = {
            k: "<redacted>" if any(w in k for w in REDACTED_KEYS) else v for k, v in spec.items()
        }
    if settings.vault.quotas:
        out["quotas"] = {q.glob: q.logical_bytes for q in settings.vault.quotas}
    for (section, key), (attr, _) in _KEYS.items():
        if section == "replication" and settings.replication is None:
            continue
        if section == "standby" and settings.follow is None:
            continue
        if section == "cluster" and settings.cluster is None:
            continue
        holder: Any = settings
        for part in attr.split("."):
            holder = getattr(holder, part)
        value = str(holder) if isinstance(holder, Path) else holder
        if any(word in key for word in REDACTED_KEYS) and key != "key_file":
            value = "<redacted>"
        out.setdefault(section, {})[key] = value
    return out


_TIER_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")


def _tiers(table: object, origin: str) -> dict[str, dict[str, Any]]:
    """[tiers.<name>] sections: a `url` (file://, s3://, gs://, az://) and backend options."""
    if not isinstance(table, dict):
        raise SettingsError(f"{origin}: tiers must be [tiers.<name>] sections")
    out: dict[str, dict[str, Any]] = {}
    for name, spec in table.items():
        if not _TIER_NAME.fullmatch(name) or name == "hot":
            raise SettingsError(f"{origin}: [tiers.{name}]: bad tier name (hot is LMDB)")
        if not isinstance(spec, dict) or not isinstance(spec.get("url"), str):
            raise SettingsError(f"{origin}: [tiers.{name}] needs a url")
        out[name] = dict(spec)
    return out


def _quotas(table: object, origin: str) -> tuple[Quota, ...]:
    """[quotas]: namespace glob = size (logical bytes of live checkpoints, vault/quotas.py)."""
    if not isinstance(table, dict):
        raise SettingsError(f"{origin}: [quotas] must be a table of glob = size")
    out = []
    for glob, size in table.items():
        try:
            out.append(Quota(str(glob), parse_size(size)))
        except (TypeError, ValueError) as e:
            raise SettingsError(f"{origin}: [quotas] {glob!r}: {e}") from None
    return tuple(out)


def load_settings(
    config_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[tuple[str, str], object] | None = None,
) -> Settings:
    settings = Settings()
    if config_file is not None:
        try:
            doc = tomllib.loads(config_file.read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise SettingsError(f"{config_file}: {e}") from None
        flat: dict[tuple[str, str], object] = {}
        tiers = _tiers(doc.pop("tiers", {}), str(config_file))
        quotas = _quotas(doc.pop("quotas", {}), str(config_file))
        for section, table in doc.items():
            if not isinstance(table, dict):
                raise SettingsError(f"{config_file}: top-level key {section!r} is not a section")
            flat.update({(section, k): v for k, v in table.items()})
        settings = replace(settings.with_values(flat, str(config_file)), tiers=tiers)
        settings = replace(settings, vault=replace(settings.vault, quotas=quotas))
    env = os.environ if environ is None else environ
    from_env = {}
    for name, value in env.items():
        if name.startswith("CKPT_") and name not in ("CKPT_URL", "CKPT_TOKEN"):
            section, _, key = name[5:].lower().partition("_")
            from_env[(section, key)] = value
    settings = settings.with_values(from_env, "environment")
    settings = settings.with_values(overrides or {}, "command line")
    if (settings.tls_cert is None) != (settings.tls_key is None):
        raise SettingsError("[server] tls_cert and tls_key go together: give both or neither")
    if settings.tls_client_ca is not None and settings.tls_cert is None:
        raise SettingsError("[server] tls_client_ca needs tls_cert and tls_key")
    repl, follow = settings.replication, settings.following
    if repl is not None and repl.tier not in settings.tiers:
        raise SettingsError(f"[replication] tier {repl.tier!r}: no such [tiers.<name>]")
    if follow is not None and follow.tier not in settings.tiers:
        raise SettingsError(f"[standby] follow {follow.tier!r}: no such [tiers.<name>]")
    if follow is not None and repl is not None and repl.tier != follow.tier:
        raise SettingsError(
            f"[standby] follow {follow.tier!r} and [replication] tier {repl.tier!r} differ: "
            "a promoted standby replicates to the replica it followed"
        )
    return _with_cluster(settings)
