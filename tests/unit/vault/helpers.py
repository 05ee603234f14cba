"""Engine-level helpers: save a checkpoint the way a client-chunking producer would."""

from __future__ import annotations

import threading
from typing import Any

from checkpoint_vault.protocol import CommitFile
from checkpoint_vault.vault import StoredCheckpoint, Vault
from checkpoint_vault.vault.content import HotFrame
from checkpoint_vault.vault.content.chunks import seq_key
from checkpoint_vault.vault.frame import chunk_id
from checkpoint_vault.vault.writer import WriteTxn


def client_save(
    vault: Vault, ns: str, files: dict[str, bytes], chunk_size: int = 1000, **opts: Any
) -> StoredCheckpoint:
    """Cut each file into fixed `chunk_size`-byte chunks, send the missing ones, commit the
    listing."""
    session, _ = vault.open_upload(ns, **opts)
    listing: dict[str, CommitFile] = {}
    for name, data in files.items():
        pieces = [data[i : i + chunk_size] for i in range(0, len(data), chunk_size)]
        ids = [chunk_id(p).hex() for p in pieces]
        missing = set(vault.uploads.missing(session.id, ids))
        for cid, piece in zip(ids, pieces, strict=True):
            if cid in missing:
                vault.uploads.put_chunk(session.id, cid, piece)
        listing[name] = CommitFile(len(data), chunk_id(data).hex(), ids)
    record, created = vault.committer.commit(session.id, listing)
    assert created
    return record


def stream_save(vault: Vault, ns: str, files: dict[str, bytes], **opts: Any) -> StoredCheckpoint:
    """Let the engine chunk each file, fed in 100 kB pieces."""
    session, _ = vault.open_upload(ns, **opts)
    for name, data in files.items():
        ingest = vault.ingest(session.id, name)
        for i in range(0, max(len(data), 1), 100_000):
            ingest.feed(data[i : i + 100_000], final=i + 100_000 >= len(data))
        ingest.finish()
    record, created = vault.committer.commit(session.id)
    assert created
    return record


def read_file(vault: Vault, ns: str, ref: str, name: str) -> bytes:
    _, files = vault.manifest(ns, ref)
    return b"".join(vault.reader.chunks([c for c, _ in files[name].chunks]))


def flip_last_byte(vault: Vault, cid: bytes) -> None:
    """Damage a hot chunk's frame in place, behind the engine's back (a disk that lied)."""

    def damage(w: WriteTxn) -> None:
        meta = vault.store.chunks.meta(w.catalog, cid)
        assert meta is not None
        assert isinstance(meta.where, HotFrame)
        frame = bytearray(vault.store.chunks.hot_frame(w.frames, meta.where) or b"")
        frame[-1] ^= 1
        w.frames.put(seq_key(meta.where.seq), bytes(frame), db=vault.store.frames_env.db["frames"])

    vault.store.writer.run(damage)


class StopAfter(threading.Event):
    """A server's stop event that SIGTERM sets after `looks` looks at it: where a long
    task stops in the middle of its work."""

    def __init__(self, looks: int) -> None:
        super().__init__()
        self.looks = looks

    def is_set(self) -> bool:
        self.looks -= 1
        return self.looks < 0
