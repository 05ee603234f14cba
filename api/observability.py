"""What operators see: request ids, JSON log lines, the access log and Prometheus metrics.

Every request gets an id (the caller's `X-Request-Id` if it sent a sane one), returned in the
`X-Request-Id` header and carried by its access-log line and any error logged for it. Logs
are one JSON object per line unless stderr is a terminal. Metrics live in a registry owned
by the app (no process-global state) and are rendered on a worker thread, because the
engine gauges read LMDB.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Handler, Middleware
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from checkpoint_vault.protocol import ReplicationStatus, StandbyStatus
from checkpoint_vault.vault import Vault

REQUEST_ID = web.RequestKey("request_id", str)
HANDED_OVER = web.RequestKey("handed_over", bool)  # its answer is another process's
_SANE_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class RareLog:
    """A warning logged a line a second at most, with how often it happened in all: a
    condition met per connection (descriptors running out) logged 6,120 lines before."""

    EVERY = 1.0  # seconds between two lines

    def __init__(self, what: str) -> None:
        self._what = what
        self._count = 0
        self._at = -self.EVERY

    def note(self, detail: object) -> None:
        self._count += 1
        now = time.monotonic()
        if now - self._at >= self.EVERY:
            self._at = now
            logging.getLogger("ckpt.api").warning(
                "%s: %d so far (the latest: %s)", self._what, self._count, detail
            )


def request_id(request: web.BaseRequest) -> str:
    rid = request.get(REQUEST_ID)
    return rid if isinstance(rid, str) else "-"


class RequestIds:
    """This process's request ids: a random prefix drawn once, then a counter. Drawing 8
    random bytes per request was a system call on the event loop, and each one handed the
    interpreter lock to whichever thread wanted it: 0.14 ms of the loop's wall time per
    request under load (cProfile of a server taking 16 agents' saves)."""

    def __init__(self) -> None:
        self._prefix = os.urandom(4).hex()
        self._count = itertools.count()

    def next(self) -> str:
        return f"{self._prefix}{next(self._count) & 0xFFFFFFFF:08x}"


def request_id_middleware(ids: RequestIds) -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        incoming = request.headers.get("X-Request-Id", "")
        request[REQUEST_ID] = incoming if _SANE_ID.fullmatch(incoming) else ids.next()
        return await handler(request)

    return middleware


async def add_request_id_header(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: also reaches streamed responses and error answers."""
    response.headers["X-Request-Id"] = request_id(request)


# One encoder for every line: `json.dumps(..., default=str)` built one per call (an access
# line per request).
_LINE = json.JSONEncoder(default=str).encode


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and any `extra` fields."""

    _STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}

    def __init__(self) -> None:
        super().__init__()
        self._second = (-1, "")  # the last whole second formatted, and its text

    def format(self, record: logging.LogRecord) -> str:
        extra = {k: v for k, v in record.__dict__.items() if k not in self._STANDARD}
        if record.exc_info:
            extra["exc"] = self.formatException(record.exc_info)
        msg = record.getMessage()
        return self.line(record.created, record.levelname.lower(), record.name, msg, extra)

    def stamp(self, created: float) -> str:
        """A record's `ts` (its milliseconds as `LogRecord.msecs` has them). An access line
        per request formats the same second many times: once is enough."""
        second = int(created)
        if self._second[0] != second:
            self._second = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
        return f"{self._second[1]}.{int((created - second) * 1000):03d}Z"

    def line(self, created: float, level: str, logger: str, msg: str, extra: dict[str, Any]) -> str:
        """A record's line from its parts: `format`'s, and the access log's without a record."""
        out: dict[str, Any] = {"ts": self.stamp(created), "level": level, "logger": logger}
        out["msg"] = msg
        out.update(extra)
        return _LINE(out)


UNPARSEABLE_EVERY = 1.0  # seconds: at most one line about unparseable requests per process


class UnparseableRequests(logging.Filter):
    """aiohttp answers a request it cannot parse (a bad byte in a header, an overlong line)
    with 400 and logs it at ERROR with its traceback, ~875 bytes, per request and before any
    token is asked for: anyone who can connect could fill the disk. On aiohttp's server
    logger, this filter makes those records one short warning a second at most, which
    counts the ones left out since; every other record passes as it is."""

    def __init__(self, every: float = UNPARSEABLE_EVERY) -> None:
        super().__init__()
        self.every = every
        self._last = -float("inf")  # time.monotonic() of the last line let through
        self._left_out = 0

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError) or not 400 <= exc.code < 500:
            return True
        now = time.monotonic()
        if now - self._last < self.every:
            self._left_out += 1
            return False
        self._last = now
        remote = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
        why = " ".join(str(exc.message).split())[:120]
        record.msg = "unparseable request from %s answered %d: %s (%d more not logged)"
        record.args = (remote, exc.code, why, self._left_out)
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info, record.exc_text = None, None
        self._left_out = 0
        return True


def configure_logging(fmt: str = "auto") -> None:
    """JSON lines for machines; readable text on a terminal (fmt: auto, json or text)."""
    server = logging.getLogger("aiohttp.server")
    for old in [f for f in server.filters if isinstance(f, UnparseableRequests)]:
        server.removeFilter(old)
    server.addFilter(UnparseableRequests())
    handler = logging.StreamHandler(sys.stderr)
    as_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    handler.setFormatter(
        JsonFormatter()
        if as_json
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


class AccessLogger(AbstractAccessLogger):
    """One line per request, with its id, route, status, size and duration. The record is
    made here rather than by `Logger.info`, which would also look up the calling frame; and
    while the line goes where `configure_logging` sends JSON lines and nowhere else (no
    handler or filter added since, as tests add), the line is formatted and written here,
    as the handler would, without a record: the record and logging's walk to its handler
    were ~8% of a worker's CPU per small save."""

    def __init__(self, logger: logging.Logger, log_format: str) -> None:
        super().__init__(logger, log_format)
        self._pid = os.getpid()  # a worker is started afresh (node/supervisor.py), not forked

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        logger = self.logger
        if not logger.isEnabledFor(logging.INFO) or request.get(HANDED_OVER):
            return  # a connection handed over: the writing process logs its answer
        method, path, status = request.method, request.path, response.status
        extra = {
            "request_id": request_id(request),
            "method": method,
            "path": path,
            "status": status,
            "bytes_out": response.body_length,
            "ms": round(time * 1000, 2),
            "remote": request.remote,
            "pid": self._pid,  # which of the service's processes answered
        }
        handler = _json_only(logger)
        if handler is None:
            record = logging.LogRecord(
                logger.name, logging.INFO, __file__, 0, "%s %s %s", (method, path, status), None
            )
            record.__dict__.update(extra)
            logger.handle(record)
            return
        formatter = handler.formatter
        assert isinstance(formatter, JsonFormatter)
        line = formatter.line(_wall(), "info", logger.name, f"{method} {path} {status}", extra)
        handler.acquire()
        try:
            handler.stream.write(line + handler.terminator)
            handler.stream.flush()
        except RecursionError:
            raise
        except Exception:  # noqa: BLE001 - as StreamHandler.emit: reported, not raised
            handler.handleError(logging.makeLogRecord({"msg": line}))
        finally:
            handler.release()


_wall = time.time  # `log` has a parameter named time


def _json_only(logger: logging.Logger) -> logging.StreamHandler[Any] | None:
    """The one handler an INFO record of `logger` would reach, if that is the plain JSON
    stream handler `configure_logging` installs and no filter stands in the way; else None
    (the record then goes through logging)."""
    root = logging.root
    if logger.parent is not root or logger.handlers or logger.filters or not logger.propagate:
        return None
    if logger.disabled or len(root.handlers) != 1:
        return None
    handler = root.handlers[0]
    if (
        type(handler) is not logging.StreamHandler
        or type(handler.formatter) is not JsonFormatter
        or handler.filters
        or handler.level > logging.INFO
    ):
        return None
    return handler


@dataclass
class JobLog:
    """Outcomes of retention, GC, verify and check runs, for metrics."""

    runs: dict[tuple[str, str], int] = field(default_factory=dict)
    last_seconds: dict[str, float] = field(default_factory=dict)
    last_at: dict[str, float] = field(default_factory=dict)
    totals: dict[str, float] = field(default_factory=dict)

    def record(self, job: str, seconds: float, ok: bool, numbers: dict[str, float]) -> None:
        key = (job, "ok" if ok else "error")
        self.runs[key] = self.runs.get(key, 0) + 1
        self.last_seconds[job] = seconds
        self.last_at[job] = time.time()
        for name, value in numbers.items():
            self.totals[f"{job}_{name}"] = self.totals.get(f"{job}_{name}", 0.0) + value


@contextmanager
def timed(jobs: JobLog, job: str) -> Iterator[dict[str, float]]:
    """Record a maintenance run: its duration, outcome, and the numbers the caller fills in."""
    numbers: dict[str, float] = {}
    started = time.perf_counter()
    ok = False
    try:
        yield numbers
        ok = True
    finally:
        jobs.record(job, time.perf_counter() - started, ok, numbers)


class _EngineCollector(Collector):
    """Engine gauges, read at scrape time (on a worker thread)."""

    def __init__(self, vault: Callable[[], Vault], jobs: JobLog) -> None:
        self._vault = vault
        self._jobs = jobs

    def collect(self) -> Iterator[Any]:
        o = self._vault().observe()
        s = o.stats
        yield _gauge("ckpt_logical_bytes", "Bytes of all live checkpoints", s.logical_bytes)
        yield _gauge("ckpt_stored_bytes", "Bytes of stored chunk frames", s.stored_bytes)
        yield _gauge("ckpt_chunks", "Stored chunks", s.chunks)
        yield _gauge("ckpt_checkpoints", "Live checkpoints", s.checkpoints)
        yield _gauge("ckpt_dedup_ratio", "Logical over stored bytes", s.dedup_ratio or 0)
        yield _gauge(
            "ckpt_disk_bytes", "Bytes the vault's files take on disk (du)", s.disk_bytes or 0
        )
        yield _by_kind(
            "ckpt_lmdb_disk_bytes",
            "LMDB data files on disk: allocated, on LMDB's free list, reclaimable by a shrink",
            "env",
            (s.environments or {}).items(),
            {
                "allocated": "allocated_bytes",
                "free": "free_bytes",
                "reclaimable": "reclaimable_bytes",
            },
        )
        yield _gauge(
            "ckpt_upload_sessions", "Upload sessions (open or retained)", o.upload_sessions
        )
        yield _gauge("ckpt_writer_queue_depth", "Operations waiting for the writer", o.writer_queue)
        tier_bytes = GaugeMetricFamily("ckpt_tier_bytes", "Stored bytes by tier", labels=["tier"])
        tier_chunks = GaugeMetricFamily("ckpt_tier_chunks", "Chunks by tier", labels=["tier"])
        for tier, t in s.tiers.items():
            tier_bytes.add_metric([tier], t.bytes)
            tier_chunks.add_metric([tier], t.chunks)
        yield tier_bytes
        yield tier_chunks
        yield _by_kind(
            "ckpt_codec_bytes",
            "Recoded chunks by codec",
            "codec",
            s.codecs.items(),
            {"stored": "bytes", "plain": "plain"},
        )
        yield _by_kind(
            "ckpt_namespace_bytes",
            "Bytes by namespace, as of the last usage scan (after each compaction)",
            "namespace",
            o.namespace_usage.items(),
            {"logical": "logical_bytes", "stored": "stored_bytes"},
        )
        per_token = GaugeMetricFamily(
            "ckpt_token_uploads",
            "Open upload sessions and their new bytes, per token",
            labels=["token", "kind"],
        )
        for kind, values in o.uploads_by_token.items():
            for token, value in values.items():
                per_token.add_metric([token, kind], value)
        yield per_token
        yield _by_kind(
            "ckpt_quota_bytes",
            "Logical bytes under a quota",
            "glob",
            ((q.glob, q) for q in s.quotas),
            {"used": "used", "limit": "limit"},
        )
        yield _by_kind(
            "ckpt_lmdb_map_bytes",
            "LMDB map use",
            "env",
            o.maps.items(),
            {"used": "used", "size": "size"},
        )
        for name in (
            "batches",
            "ops",
            "bytes",
            "map_growths",
            "chunks_written",
            "chunks_deduplicated",
            "journaled_batches",
            "journal_records",
            "journal_bytes",
        ):
            yield CounterMetricFamily(
                f"ckpt_writer_{name}", f"Writer {name} since start", value=getattr(o.writer, name)
            )
        yield _gauge(
            "ckpt_save_journal_on",
            "1 while one-request saves may be acknowledged by their journal record",
            float(o.save_journal),
        )
        hashes = CounterMetricFamily(
            "ckpt_commit_file_hashes",
            "Committed files by how their hash was proven (read_back: a pass over the file)",
            labels=["how"],
        )
        for how, n in o.commit_file_hashes.items():
            hashes.add_metric([how], n)
        yield hashes
        bases = CounterMetricFamily(
            "ckpt_small_file_bases",
            "Small files saved as a new version, by how the process that framed them found "
            "their parent's version (read: read back and decoded; summed over processes)",
            labels=["how"],
        )
        for how, n in o.small_file_bases.items():
            bases.add_metric([how], n)
        yield bases
        for what, n in o.handed_over.items():
            restored = what.startswith("restored_")
            counted = "Files" if what.endswith("files") else "Bytes of files"
            purpose = "to restore into" if restored else "to save from"
            yield CounterMetricFamily(
                f"ckpt_handed_over_{what}",
                f"{counted} clients on this machine handed over by descriptor {purpose}",
                value=n,
            )
        rpo = GaugeMetricFamily(
            "ckpt_recovery_point_seconds",
            "Seconds since the newest (valid) checkpoint",
            labels=["namespace", "which"],
        )
        for ns, (newest, valid) in o.recovery_seconds.items():
            if newest is not None:
                rpo.add_metric([ns, "newest"], newest)
            if valid is not None:
                rpo.add_metric([ns, "valid"], valid)
        yield rpo
        yield from _replication_metrics(s.replication)
        yield from _standby_metrics(s.standby)
        role = GaugeMetricFamily(
            "ckpt_role", "This server's role (1 for the current one)", labels=["role"]
        )
        for name in ("primary", "standby", "fenced"):
            role.add_metric([name], 1.0 if s.role == name else 0.0)
        yield role
        yield from self._job_metrics()

    def _job_metrics(self) -> Iterator[Any]:
        runs = CounterMetricFamily(
            "ckpt_maintenance_runs", "Maintenance runs", labels=["job", "outcome"]
        )
        for (job, outcome), n in self._jobs.runs.items():
            runs.add_metric([job, outcome], n)
        yield runs
        last = GaugeMetricFamily(
            "ckpt_maintenance_last_seconds", "Duration of the last run", labels=["job"]
        )
        for job, s in self._jobs.last_seconds.items():
            last.add_metric([job], s)
        yield last
        totals = CounterMetricFamily(
            "ckpt_maintenance_result", "Summed results of runs", labels=["what"]
        )
        for what, v in self._jobs.totals.items():
            totals.add_metric([what], v)
        yield totals


def _by_kind(
    name: str,
    doc: str,
    label: str,
    items: Iterable[tuple[str, object]],
    kinds: Mapping[str, str],
) -> GaugeMetricFamily:
    """A gauge labelled (`label`, kind): per item (a record), one sample per kind (kind ->
    the record's field)."""
    gauge = GaugeMetricFamily(name, doc, labels=[label, "kind"])
    for key, record in items:
        for kind, field_name in kinds.items():
            gauge.add_metric([key, kind], getattr(record, field_name))
    return gauge


def _replication_metrics(r: ReplicationStatus | None) -> Iterator[Any]:
    """Lag of the continuous replica (vault/replication/), if on: alert on lag_seconds above
    the budget; failures counts uploads that failed (the store down), each retried."""
    if r is None:
        return
    yield _gauge(
        "ckpt_replication_lag_seconds",
        "Age of the oldest commit the replica lacks (0: caught up)",
        r.lag_seconds,
    )
    yield _gauge("ckpt_replication_lag_bytes", "Bytes of log queued for the replica", r.lag_bytes)
    yield _gauge("ckpt_replication_lag_budget_seconds", "Configured lag budget", r.lag_budget)
    yield from _quantiles(r.lag_p50, r.lag_p99, "ckpt_replication_lag", "commit-to-replica time")
    for name in ("segments", "bases", "shipped_bytes", "failures", "overflows"):
        yield CounterMetricFamily(
            f"ckpt_replication_{name}", f"Replication {name} since start", value=getattr(r, name)
        )
    yield _gauge("ckpt_replication_epoch", "Epoch this primary replicates under", r.epoch)
    yield _gauge(
        "ckpt_replication_fenced",
        "1 once a promotion past this primary's epoch was found: it refuses writes",
        1.0 if r.fenced_by is not None else 0.0,
    )


def _standby_metrics(s: StandbyStatus | None) -> Iterator[Any]:
    """A standby's distance from its replica (vault/replication/follow.py), if one."""
    if s is None:
        return
    if s.lag_seconds is not None:
        yield _gauge(
            "ckpt_standby_lag_seconds",
            "Seconds since the standby last held everything its replica held",
            s.lag_seconds,
        )
    yield from _quantiles(
        s.apply_lag_p50,
        s.apply_lag_p99,
        "ckpt_standby_apply_lag",
        "time from commit on the primary to applied",
    )
    for name in ("segments", "batches", "rebases", "failures"):
        yield CounterMetricFamily(
            f"ckpt_standby_{name}", f"Standby {name} since start", value=getattr(s, name)
        )


def _quantiles(p50: float | None, p99: float | None, name: str, what: str) -> Iterator[Any]:
    """p50 and p99 gauges (absent before samples)."""
    for q, value in (("p50", p50), ("p99", p99)):
        if value is not None:
            yield _gauge(f"{name}_{q}_seconds", f"{q} of {what} over recent batches", value)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


class Metrics:
    def __init__(self, vault: Callable[[], Vault], jobs: JobLog) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter(
            "ckpt_http_requests",
            "HTTP requests",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "ckpt_http_request_seconds",
            "HTTP request latency",
            ["route", "method"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.bytes_in = Counter(
            "ckpt_http_request_bytes", "Request body bytes", ["route"], registry=self.registry
        )
        self.bytes_out = Counter(
            "ckpt_http_response_bytes", "Response body bytes", ["route"], registry=self.registry
        )
        self.registry.register(_EngineCollector(vault, jobs))
        # Routes are templates and statuses few, so this stays small.
        self._children: dict[tuple[str, str, int], tuple[Any, Any, Any, Any]] = {}

    def observe(self, request: web.Request, status: int, seconds: float, sent: int) -> None:
        route = _route(request)
        key = (route, request.method, status)
        children = self._children.get(key)
        if children is None:  # prometheus' labels() hashes and locks on every call
            children = self._children[key] = (
                self.requests.labels(route, request.method, str(status)),
                self.latency.labels(route, request.method),
                self.bytes_in.labels(route),
                self.bytes_out.labels(route),
            )
        requests, latency, bytes_in, bytes_out = children
        requests.inc()
        latency.observe(seconds)
        bytes_in.inc(request.content_length or 0)
        bytes_out.inc(sent)


# The families every process counts on its own (requests, bytes; small files' bases).
SUMMED = ("ckpt_http_", "ckpt_small_file_bases")


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def merged_metrics(own: bytes, others: Sequence[str]) -> bytes:
    """This process's metrics with its workers' request counters added in, so one scrape
    sees the whole service: the `ckpt_http_` families are summed sample by sample (a
    `_created` time: the earliest); the others are this process's alone (a worker's
    engine gauges read the same data dir and would count it twice)."""
    if not others:
        return own
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for i, text in enumerate([own.decode(), *others]):
        for family in text_string_to_metric_families(text):
            if i and not family.name.startswith(SUMMED):
                continue
            if family.name not in families:
                families[family.name] = Metric(family.name, family.documentation, family.type)
                values[family.name] = {}
            seen = values[family.name]
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                if key in seen and sample.name.endswith("_created"):
                    seen[key] = min(seen[key], sample.value)
                else:
                    seen[key] = seen.get(key, 0.0) + sample.value
    for name, family in families.items():
        for (sample_name, labels), value in values[name].items():
            family.add_sample(sample_name, dict(labels), value)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(families.values())))
    return generate_latest(registry)


def metrics_middleware(key: web.AppKey[Metrics]) -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        response = await handler(request)
        request.app[key].observe(
            request, response.status, time.perf_counter() - started, response.body_length
        )
        return response

    return middleware


def _route(request: web.Request) -> str:
    info = request.match_info
    resource = info.route.resource if info.route is not None else None
    return resource.canonical if resource is not None else "unmatched"
