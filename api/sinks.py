"""The two save sinks (api/saving.py): the process that writes commits saves itself; a
worker prepares them (cuts, hashes, compresses) and hands them over its channel to the
process that writes (api/calls.py), which queues them on its writer at once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Future

from aiohttp import web
from checkpoint_vault.node.calls import CallClient

from checkpoint_vault.vault import PreparedSave, Vault
from checkpoint_vault.vault.direct import SaveOptions

from .http import run, run_small
from .saving import PendingSave, Saved


class LocalSink:
    """The process that writes: each save goes to its own writer, the first committing
    while the rest are prepared."""

    def __init__(self, vault: Vault) -> None:
        self._vault = vault

    async def save(
        self, request: web.Request, ns: str, files: dict[str, bytes], options: SaveOptions
    ) -> Saved:
        return await run(request, self._vault.save, ns, files, **options)

    async def save_all(self, request: web.Request, saves: list[PendingSave]) -> None:
        vault = self._vault
        size = sum(s.size for s in saves)
        committing = await run_small(
            request, size, prepare_all, vault, saves, vault.commit_prepared
        )
        outcomes = await asyncio.gather(
            *(asyncio.wrap_future(f) for _, f in committing), return_exceptions=True
        )
        for (save, _), outcome in zip(committing, outcomes, strict=True):
            if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
                raise outcome  # cancelled: the client went away
            save.outcome = outcome


def prepare_all(
    vault: Vault,
    saves: list[PendingSave],
    submit: Callable[[PreparedSave], Future[Saved]] | None,
) -> list[tuple[PendingSave, Future[Saved]]]:
    """Cut, hash and compress each save (all in one call: `run_small`); with `submit`,
    hand each to the writer as soon as it is ready (it commits the first while the rest
    are prepared), else keep it (`prepared`) for one hand-over of them all."""
    committing = []
    for s in saves:
        assert s.options is not None
        try:
            prepared = vault.prepare_save(s.namespace, s.files, **s.options)
        except Exception as e:  # noqa: BLE001 - this save's answer
            s.outcome = e
            continue
        if submit is None:
            s.prepared = prepared
        else:
            committing.append((s, submit(prepared)))
    return committing


class ChannelSink:
    """A worker: each save prepared here, on this process's cores, and committed by the
    process that writes; a `POST /v1/saves` goes over in one frame, for one writer batch."""

    def __init__(self, vault: Vault, calls: CallClient) -> None:
        self._vault = vault
        self._calls = calls

    async def save(
        self, request: web.Request, ns: str, files: dict[str, bytes], options: SaveOptions
    ) -> Saved:
        size = sum(len(data) for data in files.values())
        prepared = await run_small(request, size, self._vault.prepare_save, ns, files, **options)
        return await self._calls.save(prepared)

    async def save_all(self, request: web.Request, saves: list[PendingSave]) -> None:
        size = sum(s.size for s in saves)
        await run_small(request, size, prepare_all, self._vault, saves, None)
        ready = [s for s in saves if s.prepared is not None]
        if ready:
            answers = await self._calls.save_all([s.prepared for s in ready if s.prepared])
            for save, answer in zip(ready, answers, strict=True):
                save.outcome = answer
