"""The engine's error tree.

Every error a caller can act on is a subclass of `VaultError` carrying the stable wire `code`
it maps to and the HTTP status the protocol's error table (protocol) gives that code;
api/ turns them into JSON in exactly one middleware. Corruption
is its own branch (`ChunkCorrupt`), never a not-found, so that a damaged chunk is never
mistaken for an absent one.
"""

from __future__ import annotations

from collections.abc import Sequence

from checkpoint_vault.protocol import TabledError


class VaultError(TabledError):
    """Root of every expected engine error.

    A class declares only its wire `code`; its HTTP `status` comes from the protocol's error
    table (a code missing from it fails at import: `TabledError`).
    """

    code = "internal"

    def details(self) -> dict[str, object]:
        """Extra machine-readable fields for the JSON error body."""
        return {}


class InvalidName(VaultError):
    code = "invalid_name"


class InvalidRequest(VaultError):
    code = "invalid_request"


class HashMismatch(VaultError):
    code = "hash_mismatch"


class TooLarge(VaultError):
    code = "too_large"


class NotFound(VaultError, KeyError):
    """Something named by the caller does not exist (or was deleted)."""

    code = "not_found"

    def __str__(self) -> str:
        return self.message


class NamespaceNotFound(NotFound):
    pass


class CheckpointNotFound(NotFound):
    pass


class UploadNotFound(NotFound):
    pass


class BlockNotFound(NotFound):
    pass


class ReplicaNotFound(NotFound):
    """The tier holds no replica yet: no base copy ever completed there."""


class Conflict(VaultError):
    """The request is well formed but contradicts current state (pinned, committed, ...)."""

    code = "conflict"


class UploadPrepared(Conflict):
    """The upload is prepared in a commit across namespaces (vault/txn.py): only that
    transaction's decision commits or aborts it; nothing may be added to it."""


class TransactionAborted(Conflict):
    """A commit across namespaces was decided `abort` (a participant refused, or one
    stayed undecided past its timeout): none of its checkpoints exists; its uploads are
    open again, for a commit in a new transaction."""

    code = "transaction_aborted"


class MissingChunks(Conflict):
    code = "missing_chunks"

    def __init__(self, chunks: Sequence[str]) -> None:
        shown = ", ".join(list(chunks)[:3])
        more = f" and {len(chunks) - 3} more" if len(chunks) > 3 else ""
        super().__init__(f"{len(chunks)} chunk(s) are not stored: {shown}{more}")
        self.chunks = list(chunks)

    def details(self) -> dict[str, object]:
        return {"missing": self.chunks}


class MaintenanceBusy(Conflict):
    """Another maintenance operation (gc, check, verify, retention, tiering, repack, catalog
    backup or restore) holds the vault's maintenance lock, in this process or another, and
    the caller asked not to wait (or waited its limit). Retry later."""


class VaultInUse(Conflict):
    """The vault's directory is open in another process (a running server, say): the
    engine assumes it is the only one writing, so a second opener is refused at once."""


class UnsafePath(Conflict):
    """A file or directory the server would use is not its own: it belongs to another
    user, is writable by group or others, or is a symlink (vault/ownership.py). Refused,
    never repaired: another local user who could put it there could read the admin token
    or redirect a write."""


class PromotionConflict(Conflict):
    """A promotion cannot go ahead: this vault is not a standby, or another node claimed
    the next epoch first (vault/replication/layout.py, "Fencing")."""


class Fenced(Conflict):
    """This vault was the primary of a replica prefix, and a standby has been promoted to a
    newer epoch there: it must not write any more, or two writers would diverge (split
    brain). Permanent for this process; the new primary takes the writes."""

    code = "fenced"


class ReadOnlyStandby(Conflict):
    """This vault is a standby following a replica (`ckpt serve --follow`): it serves reads
    and changes only by applying the replica's log. A conflict with the server's state, not
    a 503: retrying here does not help until an operator promotes it."""

    code = "read_only"


class NotPermitted(VaultError):
    """The caller's token may act on the namespace, but not this way: a write-only
    (append-only) token changing a checkpoint it did not create, or removing tags."""

    code = "forbidden"


class QuotaExceeded(VaultError):
    """A checkpoint would take a namespace group past its storage quota (vault/quotas.py)."""

    code = "quota_exceeded"


class TooManyUploads(VaultError):
    code = "too_many_uploads"


class UploadExpired(VaultError):
    code = "upload_expired"


class Unavailable(VaultError):
    code = "unavailable"


class PartUnavailable(Unavailable):
    """A part of a commit across hosts (vault/parts.py) cannot be had now: its node does
    not answer, or its chunks are not in the shared tier yet. Nothing was committed; the
    same commit may succeed later."""

    code = "part_unavailable"
    retry_after = 1


class PartNotShipped(PartUnavailable):
    """A part's chunks are neither on the owner nor listed in the shared index."""


class PartGone(Conflict):
    """A part named by a commit is not held by its node (released, expired, or its node
    lost it): nothing was committed, and retrying the same commit cannot succeed."""

    code = "part_gone"


class NotTheWriter(Unavailable):
    """A change reached a process that only reads the data dir (a worker of `ckpt serve
    --workers`); workers forward changes to the process that writes, so this is a read
    path that would also have written. Retrying is safe."""


class MaintenanceStopped(Unavailable):
    """The server is shutting down: a maintenance task still queued was dropped, or a
    running one (a paced compaction or scrub) stopped at its next step. What it finished
    stays done (each step commits on its own); run it again after the restart."""


class ChunkCorrupt(VaultError):
    """A stored chunk no longer hashes to its id: integrity failure, not a miss."""

    code = "corrupt_chunk"

    def __init__(self, chunk_id: str) -> None:
        super().__init__(f"chunk {chunk_id} is corrupt")
        self.chunk_id = chunk_id


class KeyUnavailable(Unavailable):
    """Data is encrypted with a key this server was not given: an operator must fix the
    key file; the data itself is fine, so nothing is flagged damaged."""

    code = "key_unavailable"


class SealBroken(VaultError):
    """Encrypted data failed authentication: changed, truncated or moved. For a chunk frame
    the reader turns this into ChunkCorrupt (the chunk is damaged)."""

    code = "corrupt_object"


class TierError(VaultError):
    """A tier (filesystem or object store) failed in a way retrying will not fix."""

    code = "tier_error"


class ObjectNotFound(TierError, KeyError):
    """A tier holds no object under the key: data the catalog points to is missing."""

    code = "tier_object_missing"

    def __str__(self) -> str:
        return self.message


class ObjectExists(TierError):
    """A create-if-absent put found the key taken."""

    code = "conflict"


class TierUnavailable(TierError, Unavailable):
    """The tier did not answer (down, unreachable, timing out): retry later."""

    code = "unavailable"
