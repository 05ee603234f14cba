"""What a route hands over to have one-request saves committed, and what it gets back.

The route holds a `SaveSink` (api/keys.py `SAVES`) and never asks which process it runs
in: the process that writes puts a `LocalSink` there (api/app.py), a worker its channel to
that process (node/sinks.py). Until issue 42 the routes looked up the worker's channel
(`app.get(WRITER)`) and branched on it.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from checkpoint_vault.vault import PreparedSave, StoredCheckpoint, Vault
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
