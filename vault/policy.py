"""Namespace policies: retention rules and tiering settings.

A policy is stored per namespace, with a default for namespaces that have none. A PUT may
give only some keys; the others keep their values. A retention rule left unset does not
apply; a policy with no rule at all keeps everything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any

import lmdb

from checkpoint_vault import protocol as protocol
from checkpoint_vault.protocol import format_duration

from .errors import InvalidRequest

DEFAULT_KEY = b"\0default"  # namespaces cannot start with NUL
COUNT_RULES = ("keep_last", "keep_hourly", "keep_daily", "keep_weekly", "keep_monthly")
# Tiering keys and how each is checked; what they mean is tiering/policy.py's business.
TIERING_KEYS = {
    "target": "tier",
    "demote_after": "duration",
    "keep_hot_last": "count",
    "pinned_stay_hot": "bool",
    "promote_on_read": "bool",
    "hot_high_watermark": "size",
    "hot_low_watermark": "size",
    "repack_below": "fraction",
    "stages": "stages",
}
MAX_STAGES = 8


def parse_duration(value: Any, key: str) -> float:
    """Seconds, in the protocol's grammar (`500ms`, `90s`, `36h`, `7d`, or a number)."""
    try:
        return protocol.parse_duration(value)
    except ValueError:
        raise InvalidRequest(
            f"{key} must be a duration like 90s, 36h or 7d, at most 100 years"
        ) from None


def parse_size(value: Any, key: str) -> int:
    """Bytes, in the protocol's grammar (an integer, or like `512MiB`, `40GiB`)."""
    try:
        return protocol.parse_size(value)
    except ValueError:
        raise InvalidRequest(
            f"{key} must be a size in bytes, or like 512MiB or 40GiB, at most 1 EiB"
        ) from None


def check_tiering(settings: dict[str, Any]) -> None:
    """Refuse unknown keys and malformed values when a policy is set, not at the next run
    (null clears a key)."""
    unknown = set(settings) - set(TIERING_KEYS)
    if unknown:
        raise InvalidRequest(f"unknown tiering keys: {sorted(unknown)}")
    for key, value in settings.items():
        kind = TIERING_KEYS[key]
        if value is None:
            continue
        if kind == "tier" and not isinstance(value, str):
            raise InvalidRequest("tiering target must be a tier name")
        if kind == "duration":
            parse_duration(value, key)
        if kind == "count":
            _count(key, value)
        if kind == "bool" and not isinstance(value, bool):
            raise InvalidRequest(f"{key} must be true or false")
        if kind == "size":
            parse_size(value, key)
        if kind == "stages":
            _check_stages(value, settings.get("demote_after", 0))
        if kind == "fraction" and not (
            isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1
        ):
            raise InvalidRequest(f"{key} must be a fraction between 0 and 1")
    high, low = settings.get("hot_high_watermark"), settings.get("hot_low_watermark")
    if high is not None and low is not None and parse_size(low, "") > parse_size(high, ""):
        raise InvalidRequest("hot_low_watermark must not exceed hot_high_watermark")


def _check_stages(stages: Any, first_after: Any) -> None:
    """Later demotions: [{"tier", "after"}, ...], each colder stage later than the last."""
    if not isinstance(stages, list) or len(stages) > MAX_STAGES:
        raise InvalidRequest(f'stages must be a list of at most {MAX_STAGES} {{"tier", "after"}}')
    last = parse_duration(first_after, "demote_after")
    for stage in stages:
        if not (isinstance(stage, dict) and set(stage) == {"tier", "after"}):
            raise InvalidRequest('each stage is {"tier": <tier name>, "after": <duration>}')
        if not isinstance(stage["tier"], str):
            raise InvalidRequest("a stage's tier must be a tier name")
        after = parse_duration(stage["after"], "stages.after")
        if after <= last:
            raise InvalidRequest("each stage's after must be later than the one before")
        last = after


@dataclass(frozen=True)
class KeepBest:
    metric: str
    mode: str  # "min" or "max"
    n: int


@dataclass(frozen=True)
class Retention:
    keep_last: int | None = None
    keep_hourly: int | None = None
    keep_daily: int | None = None
    keep_weekly: int | None = None
    keep_monthly: int | None = None
    keep_within: float | None = None  # seconds
    keep_tags: tuple[str, ...] = ()
    keep_best: KeepBest | None = None
    keep_valid_min: int = 1

    @property
    def has_rules(self) -> bool:
        counts = any(getattr(self, r) is not None for r in COUNT_RULES)
        return (
            counts or self.keep_within is not None or bool(self.keep_tags) or bool(self.keep_best)
        )

    def to_record(self) -> protocol.RetentionRules:
        best = self.keep_best
        return protocol.RetentionRules(
            **{r: getattr(self, r) for r in COUNT_RULES},
            keep_within=format_duration(self.keep_within) if self.keep_within is not None else None,
            keep_tags=list(self.keep_tags),
            keep_best=protocol.KeepBestRule(best.metric, best.mode, best.n) if best else None,
            keep_valid_min=self.keep_valid_min,
        )

    def updated(self, changes: Any) -> Retention:
        """This policy with the keys in `changes` replaced (null clears a rule)."""
        if not isinstance(changes, dict):
            raise InvalidRequest("retention must be an object")
        known = {f.name for f in fields(self)}
        unknown = set(changes) - known
        if unknown:
            raise InvalidRequest(f"unknown retention keys: {sorted(unknown)}")
        values: dict[str, Any] = {}
        for key, value in changes.items():
            values[key] = _parse_rule(key, value)
        merged = {**{f.name: getattr(self, f.name) for f in fields(self)}, **values}
        return Retention(**merged)


def _count(key: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidRequest(f"{key} must be a non-negative integer")
    return value


def _parse_rule(key: str, value: Any) -> Any:
    if key == "keep_valid_min":
        return 1 if value is None else _count(key, value)
    if value is None:
        return () if key == "keep_tags" else None
    if key in COUNT_RULES:
        return _count(key, value)
    if key == "keep_within":
        return parse_duration(value, key)
    if key == "keep_tags":
        if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
            raise InvalidRequest("keep_tags must be a list of strings")
        return tuple(value)
    best = value if isinstance(value, dict) else {}
    if not (isinstance(best.get("metric"), str) and best.get("mode") in ("min", "max")):
        raise InvalidRequest('keep_best needs {"metric": <metadata key>, "mode": min|max, "n"}')
    return KeepBest(best["metric"], best["mode"], _count("keep_best.n", best.get("n")))


@dataclass(frozen=True)
class Policy:
    retention: Retention = field(default_factory=Retention)
    tiering: dict[str, Any] = field(default_factory=dict)  # as given, checked keys

    def to_record(self) -> protocol.PolicyRecord:
        """The policy as the routes answer it (and as it is stored)."""
        return protocol.PolicyRecord(self.retention.to_record(), dict(self.tiering))

    def updated(self, body: Any) -> Policy:
        if not isinstance(body, dict) or set(body) - {"retention", "tiering"}:
            raise InvalidRequest('a policy is {"retention": {...}, "tiering": {...}}')
        tiering = self.tiering
        if "tiering" in body:
            if not isinstance(body["tiering"], dict):
                raise InvalidRequest("tiering must be an object")
            tiering = {
                k: v for k, v in {**self.tiering, **body["tiering"]}.items() if v is not None
            }
            check_tiering(tiering)
        retention = self.retention.updated(body.get("retention", {}))
        return Policy(retention, tiering)

    def to_json(self) -> bytes:
        return json.dumps(self.to_record().to_wire()).encode()

    @classmethod
    def from_json(cls, raw: bytes | memoryview) -> Policy:
        d = json.loads(bytes(raw))
        return cls().updated({"retention": d.get("retention", {}), "tiering": d.get("tiering", {})})


class Policies:
    def __init__(self, db: Any) -> None:
        self._db = db

    def get(self, txn: lmdb.Transaction, ns: str | None) -> Policy | None:
        raw = txn.get(DEFAULT_KEY if ns is None else ns.encode(), db=self._db)
        return Policy.from_json(raw) if raw is not None else None

    def effective(self, txn: lmdb.Transaction, ns: str) -> Policy:
        return self.get(txn, ns) or self.get(txn, None) or Policy()

    def put(self, txn: lmdb.Transaction, ns: str | None, policy: Policy) -> None:
        txn.put(DEFAULT_KEY if ns is None else ns.encode(), policy.to_json(), db=self._db)
