"""Engine settings: the safety margins and limits, as one frozen, commented dataclass."""

from __future__ import annotations

from dataclasses import dataclass

from .quotas import Quota


@dataclass(frozen=True)
class VaultConfig:
    # How long an upload session lives. Chunks it reserved (told "present" by the missing
    # query, or uploaded) cannot be collected before it expires. A retried commit within
    # this window returns the same checkpoint.
    upload_ttl: float = 6 * 3600.0
    # How long a chunk whose reference count reached zero waits before GC may delete it.
    # Covers producers that learned "present" from a missing query answered before the
    # delete and commit after it, with margin for clock steps.
    gc_grace: float = 3600.0
    # Largest chunk a client may PUT (and the largest FastCDC max_size a profile may use).
    max_chunk_size: int = 4 << 20
    # Initial LMDB map size; the map grows by doubling (steps of at most 64 GiB) when full.
    map_size: int = 1 << 30
    # Upload sessions open at once (opened, not yet committed, aborted or expired); beyond
    # it opening one answers 429. One-request saves do not count.
    max_upload_sessions: int = 10_000
    # The same, per token (by name): one token used to open 9,699 sessions in 23 s and lock
    # every other producer out with 429 for the sessions' 6 h lifetime.
    max_upload_sessions_per_token: int = 1_000
    # Bytes of new chunks one token's open sessions may hold before they commit or end
    # (120 MiB uploaded and never committed stayed for the sessions' 6 h otherwise).
    # Must exceed the largest checkpoint a producer writes; beyond it, 507.
    max_pending_bytes_per_token: int = 256 << 30
    # Storage quotas: logical bytes of live checkpoints per namespace glob (vault/quotas.py).
    quotas: tuple[Quota, ...] = ()
    # Profile for namespaces whose first upload does not ask for one.
    default_profile: str = "large"
    # Acknowledge one-request saves once their record in the save journal is synced (one
    # sequential write) instead of once the catalog's commit is (vault/journal.py).
    save_journal: bool = True
