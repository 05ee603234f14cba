"""Changes to committed checkpoints: validity, pins and tags, delete, fork.

Each is one writer transaction that re-resolves the checkpoint inside it, so concurrent
changes serialize and a delete racing a fork can never leave a fork pointing at freed chunks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from .catalog import Catalog
from .create import CreateParts, Draft, create, ensure_namespace
from .errors import Conflict, InvalidRequest, NotPermitted
from .manifest import distinct_chunks
from .names import check_namespace
from .records import VALIDITY_STATES, StoredCheckpoint, Validity
from .uploads import check_metadata, check_tags
from .writer import WriteTxn

if TYPE_CHECKING:
    from .catalog import Catalog
    from .clock import Clock
    from .writer import Writer


class LifecycleParts(CreateParts, Protocol):
    """What checkpoint changes need of the store: making a fork (`CreateParts`), the clock
    and the writer."""

    @property
    def clock(self) -> Clock: ...
    @property
    def writer(self) -> Writer: ...


MAX_REASON = 1024


def parse_validity(value: Any, source: str, now: float) -> Validity:
    if not isinstance(value, dict) or value.get("state") not in VALIDITY_STATES:
        raise InvalidRequest(f"validity needs a state, one of {', '.join(VALIDITY_STATES)}")
    reason = value.get("reason")
    if reason is not None and (not isinstance(reason, str) or len(reason) > MAX_REASON):
        raise InvalidRequest(f"validity reason must be a string of at most {MAX_REASON} chars")
    return Validity(value["state"], reason, source, now)


def _check_append_only(
    rec: StoredCheckpoint, by: str | None, validity: bool, tags: list[str] | None
) -> None:
    if (validity or tags is not None) and (rec.created_by is None or rec.created_by != by):
        raise NotPermitted(
            f"checkpoint {rec.id} was not created by token {by!r}: changing its validity or "
            "tags needs the delete scope"
        )
    if tags is not None and not set(rec.tags) <= set(tags):
        raise NotPermitted("removing tags needs the delete scope (it can make history deletable)")


class Lifecycle:
    def __init__(self, store: LifecycleParts) -> None:
        self._s = store

    @property
    def _catalog(self) -> Catalog:
        return self._s.catalog

    def patch(
        self,
        ns: str,
        cid: str,
        *,
        validity: Any = None,
        pinned: Any = None,
        tags: Any = None,
        by: str | None = None,
        append_only: bool = False,
    ) -> StoredCheckpoint:
        """Set validity, pinned or tags. `append_only` (a token without delete): validity
        and tags only on checkpoints `by` created, and tags only added, never removed;
        otherwise a write token could strip `release` (retention then deletes it) or mark
        others' checkpoints invalid (moving `latest-valid` back)."""
        now = self._s.clock.now()
        new_validity = parse_validity(validity, "producer", now) if validity is not None else None
        new_tags = check_tags(tags) if tags is not None else None
        if pinned is not None and not isinstance(pinned, bool):
            raise InvalidRequest("pinned must be true or false")

        def op(w: WriteTxn) -> StoredCheckpoint:
            txn = w.catalog
            rec = self._catalog.resolve(txn, ns, cid)
            if append_only:
                _check_append_only(rec, by, new_validity is not None, new_tags)
            if new_validity is not None:
                rec.validity = new_validity
            if pinned is not None:
                rec.pinned = pinned
            if new_tags is not None:
                self._catalog.retag(txn, rec, new_tags)
            self._catalog.put_record(txn, rec)
            return rec

        return self._s.writer.run(op)

    def delete(self, ns: str, cid: str) -> None:
        def op(w: WriteTxn) -> None:
            txn = w.catalog
            rec = self._catalog.resolve(txn, ns, cid)
            if rec.pinned:
                raise Conflict(f"checkpoint {cid} is pinned; unpin it before deleting")
            self._catalog.remove(txn, rec, self._s.clock.now())

        self._s.writer.run(op)

    def fork(
        self,
        ns: str,
        ref: str,
        target: Any,
        metadata: Any = None,
        tags: Any = None,
        by: str | None = None,
    ) -> StoredCheckpoint:
        if not isinstance(target, str):
            raise InvalidRequest("fork needs a target namespace")
        check_namespace(target)
        metadata = check_metadata(metadata)
        tags = check_tags(tags)

        def op(w: WriteTxn) -> StoredCheckpoint:
            txn = w.catalog
            now = self._s.clock.now()
            src = self._catalog.resolve(txn, ns, ref)
            profile = self._catalog.require_namespace(txn, ns).profile
            ensure_namespace(self._s, txn, target, profile, now)
            files = self._catalog.manifest(txn, src.id)
            draft = Draft(target, src.id, False, metadata, tags, files, by)
            return create(self._s, txn, draft, now)

        return self._s.writer.run(op)

    def note_promoted(self, ns: str, ckpt_id: str) -> set[bytes]:
        def op(w: WriteTxn) -> set[bytes]:
            rec = self._catalog.record(w.catalog, ckpt_id)
            if rec is None or rec.is_tombstone or rec.namespace != ns:
                return set()
            rec.promoted_at = self._s.clock.now()
            self._catalog.put_record(w.catalog, rec)
            return distinct_chunks(self._catalog.manifest(w.catalog, ckpt_id))

        return self._s.writer.run(op)

    def set_tiers(self, tiers: Mapping[str, str]) -> list[str]:
        def op(w: WriteTxn) -> list[str]:
            done = []
            for ckpt_id, tier in tiers.items():
                rec = self._catalog.record(w.catalog, ckpt_id)
                if rec is not None and not rec.is_tombstone:
                    rec.tier = tier
                    self._catalog.put_record(w.catalog, rec)
                    done.append(ckpt_id)
            return done

        return self._s.writer.run(op) if tiers else []
