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
    # How long a committed part (vault/parts.py) is held for an owner to adopt it, unless
    # released first; then deleted, and collected by GC.
    part_ttl: float = 3600.0
    # seconds after a part's commit before its node ships it on its own (0: at once); an
    # owner that waits for shipping (wait_durable) asks for it at once whatever this says
    part_ship_delay: float = 0.0
    # Put before every upload id: a cluster's node names its shard there (`<shard>-`), so
    # a proxy routes `/v1/uploads/{id}` without a namespace in the path (cluster/shards.py).
    upload_id_prefix: str = ""
    # The tier every node of a cluster packs into, with the shared chunk index beside the
    # packs (vault/content/shared.py); "": none. `shared_writer` names this process in
    # that tier's object names (`<node>-s<shard>`, from [cluster]).
    shared_tier: str = ""
    shared_writer: str = ""
    # This process's shard and the cluster's shard count, for the shared tier's GC across
    # nodes (vault/content/sharedgc.py: a sweep needs a mark from every shard), and the
    # grace between condemning a pack and deleting it, in the store's time: takes check
    # the condemned packs at least every grace / 4, so it bounds how stale a view may be.
    shared_shard: int = 0
    shared_shards: int = 1
    shared_gc_grace: float = 600.0
    # Shared index segments of one size merged at once by a GC run (sharedcompact.py);
    # 0 or 1: never merged.
    shared_index_fanin: int = 16
    # How long a chunk whose reference count reached zero waits before GC may delete it.
    # Covers producers that learned "present" from a missing query answered before the
    # delete and commit after it, with margin for clock steps.
    gc_grace: float = 3600.0
    # Largest chunk a client may PUT (and the largest FastCDC max_size a profile may use).
    max_chunk_size: int = 4 << 20
    # Initial LMDB map size; the map grows by doubling (steps of at most 64 GiB) when full.
    map_size: int = 1 << 30
    # Upload sessions open at once (opened, not yet committed, aborted or expired); beyond
    # it opening one answers 429. One-request saves do not count. 0: no global cap, the
    # default: a shared cap is one that ten token names at their per-token cap could fill,
    # locking every other tenant out; each tenant is bounded by the per-token cap instead.
    max_upload_sessions: int = 0
    # The same, per token (by name): one token used to open 9,699 sessions in 23 s and lock
    # every other producer out with 429 for the sessions' 6 h lifetime.
    max_upload_sessions_per_token: int = 1_000
    # Bytes of new chunks one token's open sessions may hold before they commit or end
    # (120 MiB uploaded and never committed stayed for the sessions' 6 h otherwise).
    # Must exceed the largest checkpoint a producer writes; beyond it, 507.
    max_pending_bytes_per_token: int = 256 << 30
    # Logical bytes of one checkpoint (its files, inherited ones included), checked from
    # the sizes a commit lists before any chunk is read: one stored 4 MiB chunk listed
    # 200,000 times in a 13.6 MB body made a 781 GiB checkpoint. Beyond it, 413.
    max_checkpoint_bytes: int = 8 << 40
    # Chunk references one commit may list (all its files together), checked before any
    # lookup; 1,000,000 references of ~1 MiB make a 1 TiB checkpoint. Beyond it, 413.
    max_commit_chunks: int = 1_000_000
    # Bytes one commit may read back from the store to prove file hashes it could not
    # prove otherwise (not hashed as they arrived, not identical to a committed file).
    # Hashing runs on a worker thread at ~1-2 GB/s: 4 GiB holds one for a few seconds,
    # where 50,000 references to one 4 MiB chunk held one for over a minute. Beyond it,
    # 413 before anything is read (send the chunks positioned: they are hashed on arrival).
    max_commit_read_back_bytes: int = 4 << 30
    # Commits of one token (by name) reading back more than 256 MiB at once (smaller
    # read-backs, a fraction of a second each, are not counted); another is answered 429 with
    # Retry-After at once (the client retries), so one tenant's read-backs hold at most
    # this many workers: four at the 4 GiB limit made another tenant's listing wait 3.4 s.
    max_read_backs_per_token: int = 1
    # Storage quotas: logical bytes of live checkpoints per namespace glob (vault/quotas.py).
    quotas: tuple[Quota, ...] = ()
    # Profile for namespaces whose first upload does not ask for one.
    default_profile: str = "large"
    # Acknowledge one-request saves once their record in the save journal is synced (one
    # sequential write) instead of once the catalog's commit is (vault/journal.py).
    save_journal: bool = True
    # The audit log's retention (vault/audit.py): entries older than this many seconds, and
    # the oldest while its pages take more than this many bytes, are pruned as entries are
    # appended; 0 turns a bound off. It was never pruned, at ~4 MB/s per write token.
    audit_max_age: float = 90 * 86400.0
    audit_max_bytes: int = 64 << 20
    # Shrink the hot store (vault/shrink.py: give the pages LMDB freed back to the file
    # system) after compaction, GC or a tiering run when its reclaimable bytes are more
    # than this share of the bytes it holds in use. Punching costs ~0.1 s of paused
    # writes, so the bound only spares runs that would give back little; 0 shrinks
    # whenever anything is reclaimable, a large value (1000) never. 5%, not 10%: a fine-
    # tune (train.pt + safetensors) compacted after every save frees ~9% of what is in
    # use per run, so at 10% the shrink waited and `du` sat ~10% above the stored bytes
    # (1.64x against 1.81x; bench/bench_du.py, bench/README.md).
    shrink_above: float = 0.05
