"""The operator's `ckpt` commands test_cli.py does not run, as a user runs them (a
subprocess) against a real server with a local directory tier: `audit`, `token rotate`,
`catalog backup` (into `backup_dir` and into the tier, then restored), `tier plan/run` that
move checkpoints to the tier, `verify` on a frame damaged on disk, and `key add` (the newest
key seals, the older ones still open).

Assertions read the `--json` output and the effect (a token refused, a file in
`backup_dir`, bytes read back, a key id in a sealed object's header).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint_vault.vault.seal import BLOB_MAGIC

from ..serverproc import ServerProcess, free_port
from .test_cli import ckpt, js

BOTH_TRANSPORTS = True  # conftest: the module's server with its local socket on, and off
WORKERS = 2  # the default on this machine (one per CPU): admin calls are forwarded by a worker
QUIET = (  # no scheduled maintenance: what a test sees is what it ran
    "[maintenance]\nretention_interval = 0\ngc_interval = 0\nscrub_interval = 0\n"
    "tiering_interval = 0\nbackup_interval = 0\ncompact_interval = 0\n"
)


def configured_server(root: Path, extra: str = "", local_socket: bool = False) -> ServerProcess:
    """A (not yet started) server over `root`, with a local directory tier `cold` at
    `root/cold`, a `backup_dir` at `root/backups` and `extra` config lines."""
    (root / "backups").mkdir(parents=True, exist_ok=True)
    config = root / "ckpt.toml"
    config.write_text(
        f'[server]\nbackup_dir = "{root / "backups"}"\n'
        f'[tiers.cold]\nurl = "file://{root / "cold"}"\n' + QUIET + extra
    )
    return ServerProcess(
        root / "data", free_port(), root / "server.log", config, local_socket=local_socket
    )


@pytest.fixture(scope="module")
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    local_socket = bool(getattr(request, "param", False))
    proc = configured_server(tmp_path_factory.mktemp("cli-admin"), local_socket=local_socket)
    try:
        proc.start()
        yield proc
    finally:
        proc.stop()


def as_token(server: ServerProcess, token: str) -> ServerProcess:
    """The same server, addressed with another token (ckpt reads it from CKPT_TOKEN)."""
    other = ServerProcess(server.data_dir, server.port, server.log_path)
    other.token = token
    return other


@pytest.mark.slow
def test_token_rotate_and_audit(server: ServerProcess) -> None:
    old = ckpt(server, "token", "create", "rotor", "--scope", "read:cli/*").stdout.strip()
    new = js(server, "token", "rotate", "rotor", "--grace", "1h")["token"]
    assert new.startswith("ckpt_")
    assert new != old
    js(as_token(server, old), "ls")  # the old secret works for its grace
    js(as_token(server, new), "ls")
    newest = ckpt(server, "token", "rotate", "rotor", "--grace", "0s").stdout.strip()
    refused = ckpt(as_token(server, new), "ls", ok=False)  # no grace: refused at once
    assert refused.returncode == 1
    js(as_token(server, newest), "ls")

    entries = js(server, "audit", "--limit", "3")
    assert len(entries) == 3
    assert [e["action"] for e in entries[:2]] == ["POST /v1/admin/tokens/{name}/rotate"] * 2
    assert {e["token"] for e in entries[:2]} == {"admin"}
    assert entries[0]["target"] == "/v1/admin/tokens/rotor/rotate"
    table = ckpt(server, "audit").stdout
    assert "/v1/admin/tokens/rotor/rotate" in table
    assert entries[0]["request_id"] in table
    js(server, "gc", "--dry-run")
    (gc,) = js(server, "audit", "--limit", "1")
    assert (gc["target"], gc["route"], gc["params"]) == ("/v1/admin/gc",) * 2 + (
        {"dry_run": "true"},
    )
    assert "/v1/admin/gc?dry_run=true" in ckpt(server, "audit", "--limit", "1").stdout


@pytest.mark.slow
def test_catalog_backup_into_backup_dir_and_the_tier(server: ServerProcess, tmp_path: Path) -> None:
    src = tmp_path / "f.bin"
    src.write_bytes(os.urandom(50_000))
    js(server, "push", "cli/backup", str(src))
    to_file = js(server, "catalog", "backup", "nightly.mdb")
    backup = server.data_dir.parent / "backups" / "nightly.mdb"
    assert backup.stat().st_size == to_file["bytes"] > 0
    refused = ckpt(server, "catalog", "backup", str(tmp_path / "x.mdb"), ok=False)
    assert refused.returncode == 1
    assert "backup_dir" in refused.stderr

    to_tier = js(server, "catalog", "backup")  # no destination: the coldest tier
    assert (server.data_dir.parent / "cold" / to_tier["key"]).is_file()

    restored = js(server, "catalog", "restore", str(backup), "--data", str(tmp_path / "again"))
    assert restored["from"] == str(backup)
    report = js(server, "check", "--data", str(tmp_path / "again"))
    assert report["ok"] is True
    assert report["checkpoints"] >= 1  # the one pushed here, and the module's others


def test_compact_rate_in_the_size_grammar(server: ServerProcess, tmp_path: Path) -> None:
    """`--rate` takes the config's sizes (binary units); a decimal one is refused with an
    example that works (the help and the error said 50MB, which the grammar refuses)."""
    js(server, "push", "cli/rate", str(_file(tmp_path, "one.bin", 1000)))
    assert js(server, "compact", "--namespace", "cli/rate", "--rate", "50MiB")["checkpoints"] == 0
    refused = ckpt(server, "compact", "--rate", "50MB", ok=False)
    assert refused.returncode == 1
    assert "such as 50MiB" in refused.stderr


def _file(root: Path, name: str, size: int) -> Path:
    path = root / name
    path.write_bytes(os.urandom(size))
    return path


@pytest.mark.slow
def test_tier_plan_and_run_move_old_checkpoints(server: ServerProcess, tmp_path: Path) -> None:
    files = [_file(tmp_path, f"w{i}", 400_000) for i in range(3)]
    ids = [js(server, "push", "cli/tiered", str(f))["id"] for f in files]
    js(
        server,
        "tier",
        "set",
        "cli/tiered",
        "--target",
        "cold",
        "--demote-after",
        "0s",
        "--keep-hot-last",
        "1",
    )
    plan = js(server, "tier", "plan")
    assert sorted(plan["tiers"]["cold"]["checkpoints"]) == sorted(ids[:2])
    assert "cold" in ckpt(server, "tier", "plan").stdout
    assert js(server, "tier", "status")["cold"]["chunks"] == 0  # a plan moves nothing

    done = js(server, "tier", "run")
    assert done["moved"]["cold"]["chunks"] >= 2
    assert js(server, "tier", "status")["cold"]["chunks"] == done["moved"]["cold"]["chunks"]
    assert list((server.data_dir.parent / "cold").rglob("*"))  # packs in the directory
    tiers = {r["id"]: r["tier"] for r in js(server, "ls", "cli/tiered")}
    assert tiers == {ids[0]: "cold", ids[1]: "cold", ids[2]: "hot"}
    for cid, f in zip(ids, files, strict=True):
        js(server, "pull", "cli/tiered", cid, str(tmp_path / cid))
        assert (tmp_path / cid / f.name).read_bytes() == f.read_bytes()
    again = js(server, "tier", "plan")["tiers"]
    assert not again.get("cold", {}).get("checkpoints")  # nothing left to move
    assert js(server, "check")["ok"] is True


@pytest.mark.slow
def test_verify_finds_a_frame_damaged_on_disk(tmp_path: Path) -> None:
    from checkpoint_vault.vault import Vault

    from ..unit.vault.helpers import flip_last_byte

    server = ServerProcess(tmp_path / "data", free_port(), tmp_path / "server.log")
    server.start()
    try:
        big = _file(tmp_path, "bad.bin", 5 << 20)  # past one-request saves: a hot frame
        damaged = js(server, "push", "cli/verify", str(big))
        whole = js(server, "push", "cli/verify-ok", str(_file(tmp_path, "ok.bin", 100_000)))
        assert js(server, "verify")["corrupt"] == []
        assert server.terminate() == 0
        engine = Vault(server.data_dir / "vault")  # the server is stopped: ours alone
        try:
            _, files = engine.manifest("cli/verify", damaged["id"])
            victim = files["bad.bin"].chunks[0][0]
            flip_last_byte(engine, victim)
        finally:
            engine.close()
        server.start()

        found = ckpt(server, "verify", "--json", ok=False)
        assert found.returncode == 1  # corruption is a failure
        report = json.loads(found.stdout)
        assert report["corrupt"] == [victim.hex()]
        assert report["checkpoints_invalidated"] == [damaged["id"]]
        assert js(server, "show", "cli/verify", damaged["id"])["validity"]["state"] == "invalid"
        assert js(server, "show", "cli/verify-ok", whole["id"])["validity"]["state"] != "invalid"
        line = ckpt(server, "verify", ok=False).stdout
        assert "corrupt 1" in line
    finally:
        server.stop()


def _sealing_key(blob: bytes) -> int:
    """The key id in a sealed object's header (vault/seal.py: magic, then the key id)."""
    magic, key_id = struct.unpack_from("<4sH", blob)
    assert magic == BLOB_MAGIC
    return int(key_id)


@pytest.mark.slow
def test_key_add_rotates_the_sealing_key(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    server = configured_server(tmp_path, f'[encryption]\nkey_file = "{keys}"\n')
    first = js(server, "key", "add", str(keys))["key_id"]
    assert keys.stat().st_mode & 0o777 == 0o600
    server.start()
    try:
        before = _file(tmp_path, "before.bin", 100_000)
        old = js(server, "push", "cli/sealed", str(before))
        backup = js(server, "catalog", "backup")
        assert _sealing_key((tmp_path / "cold" / backup["key"]).read_bytes()) == first

        assert server.terminate() == 0
        out = ckpt(server, "key", "add", str(keys)).stdout
        second = int(out.split()[1])
        assert second != first
        assert len(keys.read_text().splitlines()) == 2
        server.start()
        backup = js(server, "catalog", "backup")
        assert _sealing_key((tmp_path / "cold" / backup["key"]).read_bytes()) == second
        js(server, "pull", "cli/sealed", old["id"], str(tmp_path / "out"))
        assert (tmp_path / "out" / "before.bin").read_bytes() == before.read_bytes()
    finally:
        server.stop()
