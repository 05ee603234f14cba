"""What a route hands over to have one-request saves committed, and what it gets back.

The route holds a `SaveSink` (api/keys.py `SAVES`) and never asks which process it runs
in: each role's app factory puts its own sink there (api/sinks.py). Until issue 42 the
routes looked up the worker's channel (`app.get(WRITER)`) and branched on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from checkpoint_vault.vault import PreparedSave, StoredCheckpoint
from checkpoint_vault.vault.direct import SaveOptions

Saved = tuple[StoredCheckpoint, bool]  # the record, and whether this call created it


@dataclass
class PendingSave:
    """One save of a `POST /v1/saves` body on its way: what it asks, then what became of
    it (`outcome`: the record and whether it was created, or the error it met)."""

    namespace: str
    files: dict[str, bytes]
    options: SaveOptions | None = None
    prepared: PreparedSave | None = None
    outcome: Saved | Exception | None = None

    @property
    def size(self) -> int:
        return sum(len(data) for data in self.files.values())


class SaveSink(Protocol):
    """What a route needs to commit one-request saves."""

    async def save(
        self, request: web.Request, ns: str, files: dict[str, bytes], options: SaveOptions
    ) -> Saved:
        """One save: (record, created), or its error raised."""

    async def save_all(self, request: web.Request, saves: list[PendingSave]) -> None:
        """Each of `saves` (options checked) committed or refused: its `outcome` set."""
