"""Which chunks should leave the hot tier, and which should come back: a pure plan over the
catalog, like retention.

Per namespace (its policy's `tiering` object, else the default policy's):
- `target`: the tier to demote to (no target: nothing moves, and packed chunks come back);
- `demote_after`: only checkpoints older than this (duration, e.g. `7d`); a checkpoint
  promoted by a read ages from that read instead of its creation;
- `keep_hot_last`: the newest N checkpoints always stay hot (default 1);
- `pinned_stay_hot`: pinned checkpoints stay hot (default true);
- `promote_on_read`: a read of a checkpoint with cold bytes brings them back (api/);
- `stages`: later demotions, e.g. `[{"tier": "cold", "after": "30d"}]`: a checkpoint goes
  to the last stage its age has reached, so its chunks move on from warm to cold;
- `hot_high_watermark` / `hot_low_watermark`: when hot bytes exceed the high mark, the
  oldest checkpoints that no rule holds hot are demoted early until the low mark is reached.
  In a namespace's own policy they bound that namespace's hot bytes; in the default policy,
  the whole hot store's.

A chunk used by any checkpoint that stays hot stays hot, whatever other checkpoints share
it; a chunk wanted in two tiers goes to the one declared first (the warmer), and a packed
chunk only ever moves to a colder tier here (back to hot is promotion). Checkpoints
that a rule holds hot (newest N, pinned, no target, recently promoted) get their packed
chunks back: promotion by policy. Checkpoints merely younger than `demote_after` are left
where they are, so the watermark and the age rule never undo each other.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from checkpoint_vault.protocol import HotBytes, PromotePlan, RepackSummary, TieringReport, TierPlan
from checkpoint_vault.vault import PARTS, Vault
from checkpoint_vault.vault.content import Packed
from checkpoint_vault.vault.content.chunks import ChunkMeta
from checkpoint_vault.vault.errors import InvalidRequest
from checkpoint_vault.vault.manifest import distinct_chunks
from checkpoint_vault.vault.policy import Policy, parse_duration, parse_size
from checkpoint_vault.vault.snapshot import Snapshot


@dataclass
class _Checkpoint:
    id: str
    namespace: str
    age_from: float
    chunks: set[bytes]
    target: str | None
    held: bool  # a rule keeps it hot: never demoted, its packed chunks come back
    hot: bool  # stays hot in this plan


@dataclass
class TieringPlan:
    moves: dict[str, set[bytes]] = field(default_factory=dict)  # target tier -> hot chunks
    # target tier -> packed chunks (and where they are) moving on from a warmer tier
    transfers: dict[str, list[tuple[bytes, Packed]]] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)  # target tier -> stored bytes
    checkpoints: dict[str, list[str]] = field(default_factory=dict)  # target -> ids
    by_watermark: list[str] = field(default_factory=list)  # demoted early for capacity
    promote: set[bytes] = field(default_factory=set)
    promote_bytes: int = 0
    promote_checkpoints: list[str] = field(default_factory=list)
    hot_bytes: int = 0
    hot_bytes_after: int = 0

    def report(self, dry_run: bool, repack: RepackSummary) -> TieringReport:
        """The plan as a tiering run answers it (a dry run: all it answers)."""
        return TieringReport(
            dry_run=dry_run,
            tiers={
                t: TierPlan(
                    chunks=len(self.moves.get(t, ())) + len(self.transfers.get(t, ())),
                    from_other_tiers=len(self.transfers.get(t, ())),
                    bytes=self.sizes.get(t, 0),
                    checkpoints=self.checkpoints.get(t, []),
                )
                for t in sorted(set(self.moves) | set(self.transfers))
            },
            by_watermark=self.by_watermark,
            promote=PromotePlan(len(self.promote), self.promote_bytes, self.promote_checkpoints),
            hot=HotBytes(self.hot_bytes, self.hot_bytes_after),
            repack=repack,
        )


class _Planner:
    """Holds the per-chunk counts the plan needs: how many staying-hot checkpoints use each
    chunk, and each chunk's metadata, read once."""

    def __init__(self, snap: Snapshot, checkpoints: list[_Checkpoint]) -> None:
        self._snap = snap
        self.checkpoints = checkpoints
        self.users: Counter[bytes] = Counter()
        for c in checkpoints:
            if c.hot:
                self.users.update(c.chunks)
        self._meta: dict[bytes, ChunkMeta | None] = {}

    def meta(self, cid: bytes) -> ChunkMeta | None:
        if cid not in self._meta:
            self._meta[cid] = self._snap.chunk(cid)
        return self._meta[cid]

    def movable(self, cid: bytes) -> bool:
        meta = self.meta(cid)
        return meta is not None and meta.hot and not meta.damaged

    def location(self, cid: bytes) -> Packed | None:
        """Where a packed, undamaged chunk is; None for any other."""
        meta = self.meta(cid)
        if meta is None or meta.damaged or not isinstance(meta.where, Packed):
            return None
        return meta.where

    def hot_size(self, chunks: Iterable[bytes]) -> int:
        """Stored bytes of those chunks that are hot now."""
        return sum(m.stored for m in map(self.meta, chunks) if m is not None and m.hot)

    def demote(self, c: _Checkpoint) -> int:
        """Mark a staying-hot checkpoint cold; the hot bytes that frees."""
        c.hot = False
        freed = 0
        for cid in c.chunks:
            self.users[cid] -= 1
            if self.users[cid] == 0 and self.movable(cid):
                freed += self.meta(cid).stored  # type: ignore[union-attr]
        return freed


def plan(vault: Vault, now: float) -> TieringPlan:
    rank = {name: i for i, name in enumerate(vault.tiers)}  # declared first = warmer
    with vault.snapshot() as snap:
        default = snap.own_policy(None) or Policy()
        own: dict[str, Policy | None] = {}
        checkpoints: list[_Checkpoint] = []
        for ns in snap.namespaces():
            if ns == PARTS:  # parts stay hot until shipped to the shared tier (vault/parts.py)
                checkpoints += _namespace(vault, snap, ns, Policy(), now)
                continue
            own[ns] = snap.own_policy(ns)
            checkpoints += _namespace(vault, snap, ns, own[ns] or default, now)
        planner = _Planner(snap, checkpoints)
        out = TieringPlan(hot_bytes=snap.tier_totals()["hot"]["bytes"])
        for ns, policy in own.items():
            if policy is not None:
                _watermark(planner, policy, [c for c in checkpoints if c.namespace == ns], out)
        _watermark(planner, default, checkpoints, out, whole_store=True)
        _settle(planner, rank, out)
    return out


def _namespace(
    vault: Vault, snap: Snapshot, ns: str, policy: Policy, now: float
) -> list[_Checkpoint]:
    settings = policy.tiering
    target = settings.get("target")
    after = parse_duration(settings.get("demote_after", 0), "demote_after")
    stages = [(target, after)] + [
        (s["tier"], parse_duration(s["after"], "after")) for s in settings.get("stages", [])
    ]
    for tier, _ in stages:
        if tier is not None and tier not in vault.tiers:
            raise InvalidRequest(f"namespace {ns}: tier {tier!r} is not configured")
    keep = int(settings.get("keep_hot_last", 1))
    pinned_hot = bool(settings.get("pinned_stay_hot", True))
    out = []
    for i, rec in enumerate(snap.live_records(ns)):
        if not rec.durable:  # a commit of parts not adopted: no chunk of it is here yet
            continue
        age_from = max(rec.created_at, rec.promoted_at or 0.0)
        recently_read = rec.promoted_at is not None and rec.promoted_at > now - after
        held = target is None or i < keep or (rec.pinned and pinned_hot) or recently_read
        hot = held or age_from > now - after
        chunks = distinct_chunks(snap.manifest(rec.id))
        reached = [tier for tier, at in stages if age_from <= now - at]
        where = reached[-1] if reached and target is not None else target
        out.append(_Checkpoint(rec.id, ns, age_from, chunks, where, held, hot))
    return out


def _watermark(
    planner: _Planner,
    policy: Policy,
    scope: list[_Checkpoint],
    out: TieringPlan,
    whole_store: bool = False,
) -> None:
    """Demote the oldest unheld checkpoints of `scope` while its hot bytes are above the
    high mark, down to the low mark (the high mark if no low one is set)."""
    high = policy.tiering.get("hot_high_watermark")
    if high is None:
        return
    high_bytes = parse_size(high, "hot_high_watermark")
    low = policy.tiering.get("hot_low_watermark")
    low_bytes = parse_size(low, "hot_low_watermark") if low is not None else high_bytes
    if whole_store:
        hot = out.hot_bytes - _planned_freed(planner)
    else:
        hot = planner.hot_size(
            {cid for c in scope if c.hot for cid in c.chunks if planner.users[cid] > 0}
        )
    if hot <= high_bytes:
        return
    for c in sorted(scope, key=lambda c: c.age_from):
        if hot <= low_bytes:
            break
        if c.hot and not c.held and c.target is not None:
            hot -= planner.demote(c)
            out.by_watermark.append(c.id)


def _planned_freed(planner: _Planner) -> int:
    """Hot bytes the age rules alone already move out."""
    cold = {cid for c in planner.checkpoints if not c.hot for cid in c.chunks}
    return planner.hot_size(cid for cid in cold if planner.users[cid] == 0 and planner.movable(cid))


def _settle(planner: _Planner, rank: dict[str, int], out: TieringPlan) -> None:
    """Turn the hot/cold decisions into chunk moves and promotions."""
    where: dict[bytes, str] = {}
    for c in planner.checkpoints:
        if c.hot or c.target is None:
            continue
        out.checkpoints.setdefault(c.target, []).append(c.id)
        for cid in c.chunks:
            warmer = cid not in where or rank[c.target] < rank[where[cid]]
            if warmer and planner.users[cid] == 0:
                where[cid] = c.target
    for cid, target in where.items():
        if planner.movable(cid):
            out.moves.setdefault(target, set()).add(cid)
        else:
            now_in = planner.location(cid)
            if now_in is None or rank.get(now_in.tier, len(rank)) >= rank[target]:
                continue  # gone, damaged, or already as cold as wanted
            out.transfers.setdefault(target, []).append((cid, now_in))
        out.sizes[target] = out.sizes.get(target, 0) + planner.meta(cid).stored  # type: ignore[union-attr]
    for c in planner.checkpoints:
        packed = {cid for cid in c.chunks if _is_packed(planner.meta(cid))} if c.held else set()
        if packed - out.promote:
            out.promote_checkpoints.append(c.id)
            for cid in packed - out.promote:
                out.promote.add(cid)
                out.promote_bytes += planner.meta(cid).stored  # type: ignore[union-attr]
    out.hot_bytes_after = out.hot_bytes - sum(out.sizes.values()) + out.promote_bytes


def _is_packed(meta: ChunkMeta | None) -> bool:
    return meta is not None and isinstance(meta.where, Packed) and not meta.damaged
