"""A worker's save sink (api/saving.py): it prepares saves (cuts, hashes, compresses) and
hands them over its channel to the process that writes (node/calls.py), which queues them
on its writer at once."""

from __future__ import annotations

from aiohttp import web

from checkpoint_vault.api.http import run_small
from checkpoint_vault.api.saving import PendingSave, Saved, prepare_all
from checkpoint_vault.vault import Vault
from checkpoint_vault.vault.direct import SaveOptions

from .calls import CallClient


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
