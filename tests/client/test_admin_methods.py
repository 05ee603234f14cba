"""The client's admin and catalog methods no other test calls, against a real server:
tags, forks, bulk deletes, uploads aborted, storage, policy and retention, tokens (created,
rotated with a grace, listed, revoked), the audit log, GC, verify, catalog backups, and
promote refused on a primary.

Each test checks the effect through another door (the checkpoint list, the HTTP API with
the token in question, a file on disk), so a method that answered but did nothing fails.
Admin answers are turning from dicts into typed records (protocol/); `wire()` reads either.
"""

from __future__ import annotations

import http.client
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from checkpoint_vault.client import VaultClient
from checkpoint_vault.client.errors import ClientError

from ..serverproc import ServerProcess, free_port

BOTH_TRANSPORTS = True  # conftest: the module's server with its local socket on, and off


@pytest.fixture(scope="module")
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """A server with a `[server] backup_dir` (where online catalog backups may go), no GC
    grace (an unreferenced chunk goes at the next GC) and no scheduled maintenance, so what
    the tests see is what they did."""
    root = tmp_path_factory.mktemp("admin")
    (root / "backups").mkdir()
    config = root / "ckpt.toml"
    config.write_text(
        f'[server]\nbackup_dir = "{root / "backups"}"\n[gc]\ngrace = "0s"\n'
        "[maintenance]\nretention_interval = 0\ngc_interval = 0\nscrub_interval = 0\n"
        "tiering_interval = 0\nbackup_interval = 0\ncompact_interval = 0\n"
    )
    local_socket = bool(getattr(request, "param", False))
    proc = ServerProcess(
        root / "data", free_port(), root / "server.log", config, local_socket=local_socket
    )
    try:
        proc.start()
        yield proc
    finally:
        proc.stop()


def wire(answer: Any) -> Any:
    """An admin answer as its wire JSON, whether the client gave a dict or a record (or a
    list of either)."""
    if isinstance(answer, list):
        return [wire(a) for a in answer]
    to_wire = getattr(answer, "to_wire", None)
    return to_wire() if callable(to_wire) else answer


def http_get(server: ServerProcess, path: str, token: str) -> tuple[int, Any]:
    """GET `path` with `token`: (status, JSON body); a door the client does not use."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def can_read(server: ServerProcess, token: str) -> bool:
    return http_get(server, "/v1/namespaces", token)[0] == 200


def test_tag_fork_storage_and_delete_many(vault: VaultClient) -> None:
    first = vault.save("m/tags", {"w.bin": os.urandom(200_000)})
    second = vault.save("m/tags", {"w.bin": os.urandom(200_000)})
    assert vault.tag("m/tags", first.id, ["best", "eval"]).tags == ["best", "eval"]
    assert vault.get("m/tags", first.id).tags == ["best", "eval"]

    forked = vault.fork("m/tags", first.id, "m/forked", metadata={"why": "ablation"})
    assert forked.namespace == "m/forked"
    assert vault.get("m/forked", "latest").metadata == {"why": "ablation"}
    storage = wire(vault.storage("m/forked", forked.id))
    assert storage["logical_bytes"] == 200_000

    vault.pin("m/tags", first.id)
    gone = vault.delete_many("m/tags", [first.id, second.id, "0" * 26])
    assert gone.deleted == [second.id]
    assert gone.pinned == [first.id]
    assert [c.id for c in vault.list("m/tags")] == [first.id]


def test_abort_drops_the_upload(server: ServerProcess, vault: VaultClient) -> None:
    upload = vault.begin_upload("m/abort")
    assert upload.id in json.dumps(http_get(server, "/v1/admin/uploads", server.token)[1])
    vault.abort(upload)
    assert upload.id not in json.dumps(http_get(server, "/v1/admin/uploads", server.token)[1])


def test_tokens_rotate_with_grace_and_revoke(server: ServerProcess, vault: VaultClient) -> None:
    made = wire(vault.create_token("rotated", ["read:m/*"]))
    old = made["token"]
    assert can_read(server, old)
    rotated = wire(vault.rotate_token("rotated", grace="1h"))
    new = rotated["token"]
    assert new != old
    assert can_read(server, new)
    assert can_read(server, old)  # within its grace
    wire(vault.rotate_token("rotated", grace="0s"))
    assert not can_read(server, new)  # no grace: gone at once
    assert "rotated" in {t["name"] for t in wire(vault.tokens())}
    vault.revoke_token("rotated")
    assert "rotated" not in {t["name"] for t in wire(vault.tokens())}

    actions = [(e["action"], e["token"]) for e in wire(vault.audit(limit=20))]
    assert actions[0] == ("DELETE /v1/admin/tokens/{name}", "admin")  # newest first
    assert ("POST /v1/admin/tokens/{name}/rotate", "admin") in actions
    assert len(wire(vault.audit(limit=1))) == 1


def test_policy_retention_gc_and_verify(server: ServerProcess, vault: VaultClient) -> None:
    ids = [vault.save("m/ret", {"f.bin": os.urandom(100_000)}).id for _ in range(3)]
    vault.set_policy("m/ret", {"retention": {"keep_last": 1}})
    assert wire(vault.policy("m/ret"))["retention"]["keep_last"] == 1
    plan = wire(vault.retention(dry_run=True, namespace="m/ret"))
    assert sorted(plan["delete"]) == sorted(ids[:2])
    assert [c.id for c in vault.list("m/ret")] == ids[::-1]  # a plan deletes nothing
    wire(vault.retention(dry_run=False, namespace="m/ret"))
    assert [c.id for c in vault.list("m/ret")] == [ids[2]]

    dry = wire(vault.gc(dry_run=True))
    assert dry["chunks_deleted"] > 0
    done = wire(vault.gc())
    assert done["chunks_deleted"] == dry["chunks_deleted"]
    assert wire(vault.gc(dry_run=True))["chunks_deleted"] == 0  # nothing left to collect

    verified = wire(vault.verify(namespace="m/ret"))
    assert verified["corrupt"] == []
    assert verified["chunks_checked"] >= 1


def test_catalog_backup_lands_in_backup_dir(server: ServerProcess, vault: VaultClient) -> None:
    vault.save("m/backup", {"f.bin": b"kept in the catalog"})
    out = wire(vault.catalog_backup("nightly.mdb"))
    backup: Path = server.data_dir.parent / "backups" / "nightly.mdb"
    assert backup.stat().st_size == out["bytes"] > 0
    with pytest.raises(ClientError, match="backup_dir"):
        vault.catalog_backup("/tmp/elsewhere.mdb")


def test_promote_is_refused_on_a_primary(vault: VaultClient) -> None:
    with pytest.raises(ClientError, match="not a standby"):
        vault.promote()
    assert vault.save("m/still", {"f": b"writable"}).id  # and the primary still takes writes
