"""A process's side of commits across namespaces: its engine part, the cluster's decisions,
the resolver that finishes decided transactions, and reads that never see half of one.

- `txn_context`: `TxnService` under `TXN` in every process; in a cluster, the decisions'
  store (`[cluster] store`) and, in the process that writes, the resolver: every
  `RESOLVE_INTERVAL` it brings each prepared upload of its shard to its decision
  (cluster/txn.py `resolve`), which finishes what a SIGKILLed coordinator or owner left,
  and aborts what stayed undecided past `[cluster] txn_timeout`.
- `txn_middleware`: before a request about a namespace (or the namespace listing) is
  answered, any upload prepared there whose transaction is decided is brought to it: a
  read that could see another namespace of a transaction committed sees this one too.
  An undecided one is left alone (nothing of it is visible, and the transaction is not
  committed yet, so the read comes before it). A process that only reads (a worker)
  waits, bounded, for the process that writes to apply it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from checkpoint_vault.cluster.txn import ABORT, COMMIT, Decisions, resolve
from checkpoint_vault.vault import VaultError
from checkpoint_vault.vault.clock import Clock
from checkpoint_vault.vault.errors import Conflict, TransactionAborted, Unavailable
from checkpoint_vault.vault.records import StoredCheckpoint
from checkpoint_vault.vault.txn import PreparedUpload, Transactions

from ..cluster import CLUSTER
from ..keys import ROLE, SETTINGS, VAULT

log = logging.getLogger("ckpt.txn")
T = TypeVar("T")

RESOLVE_INTERVAL = 0.5  # seconds between the resolver's looks at its prepared uploads
READER_WAIT = 10.0  # seconds a worker waits for the writing process to apply a decision
LISTING = "/v1/namespaces"  # the whole listing: every prepared upload of the shard settles


@dataclass
class TxnService:
    txns: Transactions
    decisions: Decisions | None  # None: one node, where commit_all is one transaction
    timeout: float  # [cluster] txn_timeout
    writes: bool  # this process writes the vault (else: a worker, which waits)
    pool: ThreadPoolExecutor  # the store's and the engine's blocking calls
    clock: Clock  # the vault's: prepared uploads are timed by it

    async def call(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def resolve_one(self, upload: PreparedUpload) -> str | None:
        assert self.decisions is not None
        return resolve(self.txns, self.decisions, upload, self.clock.now(), self.timeout)

    def settle_upload(self, transaction: str, upload_id: str) -> tuple[StoredCheckpoint, bool]:
        """The coordinator's apply (blocking): the upload's checkpoint if `transaction` is
        decided `commit` (read from the store, never taken from the caller)."""
        if self.decisions is None:
            raise Conflict("this server is not part of a cluster: POST /v1/commits")
        decision = self.decisions.read(transaction)
        if decision == COMMIT:
            return self.txns.apply(transaction, upload_id)
        if decision == ABORT:
            self.txns.abort(transaction, upload_id)
            raise TransactionAborted(f"transaction {transaction} was aborted")
        raise Conflict(f"transaction {transaction} is not decided yet")

    async def settle(self, namespace: str | None) -> None:
        """Bring `namespace`'s (None: every) prepared upload with a decision to it."""
        # One LMDB prefix seek on the loop (microseconds): every namespace request asks.
        pending = self.txns.pending(namespace)
        if not pending or self.decisions is None:
            return
        for upload in pending:
            if self.writes:
                await self.call(self.resolve_one, upload)
            elif await self.call(self.decisions.read, upload.transaction) is not None:
                await self._wait_applied(upload)

    async def _wait_applied(self, upload: PreparedUpload) -> None:
        deadline = time.monotonic() + READER_WAIT
        while any(p.upload_id == upload.upload_id for p in self.txns.pending(upload.namespace)):
            if time.monotonic() > deadline:
                raise Unavailable(
                    f"namespace {upload.namespace!r}: transaction {upload.transaction} is "
                    "being applied; retry shortly"
                )
            await asyncio.sleep(0.02)  # polling the catalog for the writer's apply, bounded


TXN = web.AppKey("txn", TxnService)


async def txn_context(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    config = settings.cluster
    vault = app[VAULT]
    writes = not app[ROLE].reader
    pool = ThreadPoolExecutor(2, thread_name_prefix="vault-txn")
    node = app.get(CLUSTER)  # cluster_context runs first: one client of the store
    decisions = None if node is None else Decisions(node.store, f"{node.config.node}-s{node.shard}")
    txns = Transactions(vault.store, vault.uploads, vault.committer)
    timeout = config.txn_timeout if config is not None else 0.0
    service = TxnService(txns, decisions, timeout, writes, pool, vault.clock)
    app[TXN] = service
    task = None
    if decisions is not None and writes:
        task = asyncio.create_task(_resolving(app, service))
    try:
        yield
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        pool.shutdown(wait=True)


async def _resolving(app: web.Application, service: TxnService) -> None:
    """The resolver: finishes transactions whose coordinator or owner died, at start
    (a restart, a takeover) and every RESOLVE_INTERVAL after, while this process owns
    its shard."""
    node = app[CLUSTER]
    while True:
        try:
            if node.owns():
                for upload in service.txns.pending():
                    decision = await service.call(service.resolve_one, upload)
                    if decision is not None:  # what a coordinator or owner left behind
                        log.info(
                            "resolver: %s of transaction %s in %s: %s",
                            upload.upload_id, upload.transaction, upload.namespace, decision,
                        )  # fmt: skip
        except VaultError as e:  # the store or the writer for a moment: the next pass
            log.warning("resolving prepared uploads: %s", e.message)
        except Exception:  # a bug: keep resolving, transactions depend on it
            log.exception("resolving prepared uploads failed")
        await asyncio.sleep(RESOLVE_INTERVAL)  # the resolver's period, not a wait on work


def txn_middleware() -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        service = request.app.get(TXN)
        if service is not None and service.decisions is not None:
            ns = request.match_info.get("ns")
            if ns is not None or (request.path == LISTING and request.method == "GET"):
                await service.settle(ns)
        return await handler(request)

    return middleware
