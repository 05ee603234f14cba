"""`VaultClient.commit_all` and `commit_uploads` against a real server: several namespaces
committed as one, each upload with its own options, a retry by transaction id returning the
same checkpoints."""

from __future__ import annotations

import asyncio
import os
import uuid

import pytest

from checkpoint_vault.client import AsyncVaultClient, Forbidden, VaultClient

from ..serverproc import ServerProcess


def test_commit_all_saves_every_namespace_together(vault: VaultClient) -> None:
    run = uuid.uuid4().hex[:8]
    saves = {f"{run}/model": {"weights.bin": b"w" * 300_000}, f"{run}/data": {"pos": b"42"}}
    done = vault.commit_all(saves, metadata={"step": 7}, transaction="7" * 32)
    assert set(done) == set(saves)
    for ns, files in saves.items():
        assert done[ns].metadata == {"step": 7}
        for name, data in files.items():
            assert vault.read_range(ns, done[ns].id, name, 0, len(data)) == data
    again = vault.commit_all(saves, transaction="7" * 32)  # new uploads, same transaction:
    assert {c.id for c in again.values()} != {c.id for c in done.values()}  # a new commit


def test_commit_uploads_with_their_own_options(vault: VaultClient) -> None:
    run = uuid.uuid4().hex[:8]
    model = vault.begin_upload(f"{run}/model", metadata={"kind": "model"}, tags=["s1"])
    data = vault.begin_upload(f"{run}/data", metadata={"kind": "data"})
    committed = vault.commit_uploads(
        [
            (model, {"w": vault.send_file(model, "w", b"x" * 10_000)}),
            (data, {"d": vault.send_file(data, "d", b"y" * 100)}),
        ]
    )
    assert [c.metadata["kind"] for c in committed] == ["model", "data"]
    assert committed[0].tags == ["s1"]
    assert vault.get(f"{run}/data").id == committed[1].id


def test_a_namespace_the_token_may_not_write_commits_nothing(server: ServerProcess) -> None:
    run = uuid.uuid4().hex[:8]
    with VaultClient(server.url, server.token, progress=False) as admin:
        token = admin.create_token(f"c-{run}", [f"write:{run}/ok", f"read:{run}/*"]).token
        with VaultClient(server.url, token, progress=False) as vault, pytest.raises(Forbidden):
            vault.commit_all({f"{run}/ok": {"f": b"1"}, f"{run}/no": {"f": b"2"}})
        assert [n.name for n in admin.namespaces() if n.name.startswith(run)] in (
            [f"{run}/ok"],  # opened (empty), never committed
            [],
        )
        assert not admin.list(f"{run}/ok")


async def test_a_refused_namespace_leaves_no_other_upload_running(server: ServerProcess) -> None:
    """The refusal of one namespace's upload stops the others' staging before the call
    returns: with `gather` they ran on, on a loop the caller may close next (a pending task
    destroyed with it)."""
    run = uuid.uuid4().hex[:8]
    with VaultClient(server.url, server.token, progress=False) as admin:
        token = admin.create_token(f"c-{run}", [f"write:{run}/ok", f"read:{run}/*"]).token
    big = os.urandom(24 << 20)  # staged in pieces: still sending when the refusal comes
    async with AsyncVaultClient(server.url, token, progress=False) as vault:
        with pytest.raises(Forbidden):
            await vault.commit_all({f"{run}/ok": {"f": big}, f"{run}/no": {"f": b"2"}})
        staging = [
            t
            for t in asyncio.all_tasks()
            if not t.done() and "_stage" in t.get_coro().__qualname__  # type: ignore[union-attr]
        ]
        assert staging == []
