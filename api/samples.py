"""When storage samples are taken (vault/samples.py keeps them): at each usage scan, and at
a bounded interval when no scan happens.

A usage scan (`Vault.usage`: `GET /v1/stats?namespaces=true`, or the scheduler after a
compaction that recoded) is the only time per-namespace stored bytes are known, so every
scan is sampled; the sampler notices one by `Vault.last_usage` being a new object (each
scan replaces it), which costs an attribute read per poll and no hook in the engine. With
no scan for `SAMPLE_INTERVAL`, the sampler runs one itself, so the chart has a point at
least that often. A standby takes none: the primary's samples reach it by replication.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web

from vault import Vault, VaultError
from vault.samples import NamespaceBytes, StorageSample, StorageSamples, allocated_bytes

from .keys import RUNTIME, SETTINGS, VAULT

log = logging.getLogger("ckpt.api")

SAMPLE_INTERVAL = 3600.0  # seconds: the longest gap between samples (each costs a scan)
POLL_SECONDS = 1.0  # how often the sampler looks for a scan someone else ran

SAMPLES = web.AppKey("samples", StorageSamples)


def take_sample(vault: Vault, data_dir: Path, samples: StorageSamples) -> StorageSample:
    """Record the vault's totals now, its data dir's allocated bytes, and each namespace's
    bytes from the usage scan that just ran (`vault.last_usage`)."""
    stats = vault.stats()
    sample = StorageSample(
        at=vault.store.clock.now(),
        logical_bytes=stats.logical_bytes,
        stored_bytes=stats.stored_bytes,
        disk_bytes=allocated_bytes(data_dir),
        namespaces={
            ns: NamespaceBytes(u.logical_bytes, u.stored_bytes)
            for ns, u in vault.last_usage.items()
        },
    )
    samples.append(sample)
    return sample


def _scan_and_sample(vault: Vault, data_dir: Path, samples: StorageSamples) -> None:
    vault.usage()
    take_sample(vault, data_dir, samples)


async def _loop(app: web.Application) -> None:
    vault, samples = app[VAULT], app[SAMPLES]
    data_dir = app[SETTINGS].data_dir
    loop = asyncio.get_running_loop()
    seen: object = vault.last_usage
    due = 0.0  # monotonic time of the next interval sample: at once, at start
    while True:
        if vault.writable:
            scanned = vault.last_usage is not seen
            if scanned or time.monotonic() >= due:
                work = take_sample if scanned else _scan_and_sample
                try:
                    await loop.run_in_executor(app[RUNTIME].io, work, vault, data_dir, samples)
                except (VaultError, OSError) as e:  # fenced, stopping, a disk error: next time
                    log.warning("storage sample not taken: %s", e)
                seen = vault.last_usage
                due = time.monotonic() + SAMPLE_INTERVAL
        await asyncio.sleep(POLL_SECONDS)  # pacing a background poll, not synchronisation


async def sampling_context(app: web.Application) -> AsyncIterator[None]:
    """Start the sampler once the vault is open (after `_vault_context`); stop it first."""
    app[SAMPLES] = StorageSamples(app[VAULT].store)
    task = asyncio.create_task(_loop(app), name="storage-samples")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
