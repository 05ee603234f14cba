"""The parts every engine operation needs, opened together and closed together.

Threads come from the runtime (vault/runtime.py): the writer's and the syncer's, and the
pools that decode chains and store handed-over pieces. A store opened without a runtime
makes its own and closes it; the service passes the process's runtime and closes it itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from .catalog import TAG_INDEX_BUILT, Catalog
from .clock import Clock
from .config import VaultConfig
from .content.chunks import Chunks
from .content.shared import SharedIndex
from .counters import Counters
from .domains import NSREFS_BUILT
from .env import CATALOG_DBS, FRAME_DBS, Env
from .ids import IdGenerator
from .journal import JOURNAL_DIR
from .runtime import Runtime
from .seal import Keyring
from .syncer import DURABLE_FILE, Syncer, recover
from .tier import Tier
from .writer import NoWriter, Writer


@dataclass
class Store:
    catalog_env: Env  # records, manifests, chunk metadata, everything but hot frames
    frames_env: Env  # hot chunk frames
    writer: Writer
    counters: Counters
    chunks: Chunks
    catalog: Catalog
    clock: Clock
    config: VaultConfig
    ids: IdGenerator
    tiers: Mapping[str, Tier]  # by name; hot (LMDB) is not among them
    keyring: Keyring | None  # seals what goes to other tiers; None: stored plain
    # The process's pools and dedicated threads; `owns_runtime`: made by `open`, closed by
    # `close` (a vault opened without a service).
    runtime: Runtime
    owns_runtime: bool = False
    # With replication on: waits (up to the seconds given) until the replica holds every
    # change committed so far; False on timeout. Pack deletion waits on it (no replica may
    # name a deleted pack). None: no replica to wait for.
    replica_barrier: Callable[[float], bool] | None = None
    # In a cluster with a shared tier: the chunks every node has shipped there
    # (vault/content/shared.py). None: dedup stops at this vault's own catalog.
    shared: SharedIndex | None = None

    @classmethod
    def open(
        cls,
        path: Path,
        clock: Clock,
        config: VaultConfig,
        tiers: Mapping[str, Tier] | None = None,
        keyring: Keyring | None = None,
        runtime: Runtime | None = None,
        refuse: Callable[[], Exception] | None = None,
    ) -> Store:
        """`refuse`: open to read beside the process that writes (a worker): nothing is
        recovered, locked or written here, and every change raises `refuse()`."""
        if refuse is not None:
            return cls._reader(path, clock, config, tiers, keyring, runtime, refuse)
        own = runtime is None
        rt = runtime if runtime is not None else Runtime()
        env_dirs = [path / "catalog", path / "frames"]
        durable = path / DURABLE_FILE
        with ExitStack() as undo:  # closes what was opened if a later step fails
            catalog_env = Env(  # recovery under the catalog's lock, before LMDB reads a file
                env_dirs[0], config.map_size, CATALOG_DBS, False, lambda: recover(durable, env_dirs)
            )
            undo.callback(catalog_env.close)
            frames_env = Env(env_dirs[1], config.map_size, FRAME_DBS, False)
            undo.callback(frames_env.close)
            # The syncer starts first: what opening writes directly (keys, indexes built for
            # older catalogs) is committed over a pinned, durable state, and made durable
            # before the writer starts.
            if own:
                undo.callback(rt.close)
            syncer = Syncer(durable, [catalog_env, frames_env], path / JOURNAL_DIR, rt.thread)
            undo.callback(syncer.close)
            store = cls._parts(catalog_env, frames_env, syncer, clock, config, tiers, keyring, rt)
            store.owns_runtime = own
            undo.pop_all()
            return store

    @classmethod
    def _reader(
        cls,
        path: Path,
        clock: Clock,
        config: VaultConfig,
        tiers: Mapping[str, Tier] | None,
        keyring: Keyring | None,
        runtime: Runtime | None,
        refuse: Callable[[], Exception],
    ) -> Store:
        catalog_env = Env(path / "catalog", config.map_size, CATALOG_DBS, False, reader=True)
        try:
            frames_env = Env(path / "frames", config.map_size, FRAME_DBS, False, reader=True)
        except BaseException:
            catalog_env.close()
            raise
        counters = Counters(catalog_env)
        chunks = Chunks(catalog_env, frames_env, counters)
        return cls(
            catalog_env=catalog_env,
            frames_env=frames_env,
            writer=NoWriter(refuse),
            counters=counters,
            chunks=chunks,
            catalog=Catalog(catalog_env, chunks),
            clock=clock,
            config=config,
            ids=IdGenerator(None),  # makes no checkpoint
            tiers=dict(tiers or {}),
            keyring=keyring,
            runtime=runtime if runtime is not None else Runtime(),
            owns_runtime=runtime is None,
        )

    @classmethod
    def _parts(
        cls,
        catalog_env: Env,
        frames_env: Env,
        syncer: Syncer,
        clock: Clock,
        config: VaultConfig,
        tiers: Mapping[str, Tier] | None,
        keyring: Keyring | None,
        runtime: Runtime,
    ) -> Store:
        if keyring is not None:
            _remember_keys(catalog_env, keyring)
        counters = Counters(catalog_env)
        chunks = Chunks(catalog_env, frames_env, counters)
        catalog = Catalog(catalog_env, chunks)
        with catalog_env.read() as txn:
            indexed = counters.get(txn, TAG_INDEX_BUILT)
            refs_indexed = counters.get(txn, NSREFS_BUILT)
        if not indexed:  # a catalog from before the tag index (or restored from one)
            with catalog_env.lmdb.begin(write=True) as txn:
                catalog.build_tag_index(txn)
        if not refs_indexed:  # likewise for the dedup domains' index (vault/domains.py)
            with catalog_env.lmdb.begin(write=True) as txn:
                catalog.build_nsrefs(txn)
                counters.add(txn, NSREFS_BUILT, 1)
        syncer.sync_now()
        return cls(
            catalog_env=catalog_env,
            frames_env=frames_env,
            writer=Writer(
                catalog_env, frames_env, syncer, runtime.thread, journaling=config.save_journal
            ),
            counters=counters,
            chunks=chunks,
            catalog=catalog,
            clock=clock,
            config=config,
            ids=IdGenerator(_newest_id(catalog_env)),
            tiers=dict(tiers or {}),
            keyring=keyring,
            runtime=runtime,
        )

    def take_over(self) -> None:
        """Number new checkpoints and frames after what the catalog holds now: a standby
        becoming the primary has been applying the replica's log beneath both counters."""
        self.ids = IdGenerator(_newest_id(self.catalog_env))
        self.chunks.reset_sequence()

    def now_ms(self) -> int:
        return int(self.clock.now() * 1000)

    def close(self) -> None:
        """With its own runtime: the runtime's order (vault/runtime.py), this as its last
        step; with the service's, the service's runtime closed the pools already."""
        if self.owns_runtime:
            self.owns_runtime = False
            self.runtime.close(self.close)
            return
        self.writer.close()  # and its syncer: everything committed is durable
        self.catalog_env.close()
        self.frames_env.close()


def _newest_id(catalog_env: Env) -> str | None:
    with catalog_env.read() as txn:
        cur = txn.cursor(db=catalog_env.db["checkpoints"])
        return bytes(cur.key()).decode() if cur.last() else None


def _remember_keys(env: Env, keyring: Keyring) -> None:
    """Record each key's check value at first sight; refuse a key file whose key id now
    names another key (before the writer starts, so a plain transaction is fine)."""
    db = env.db["keys"]
    with env.read() as txn:
        known = {int.from_bytes(k, "big"): bytes(v) for k, v in txn.cursor(db=db)}
    new = keyring.unknown_to(known)
    if new:
        with env.lmdb.begin(write=True) as txn:
            for kid, check in new.items():
                txn.put(kid.to_bytes(2, "big"), check, db=db)
