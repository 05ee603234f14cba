"""Losing the machine: back up the catalog to SeaweedFS, destroy the data dir, restore it
from the bucket, and every checkpoint committed before the backup reads back bit-identical
(their chunks having been tiered). Encryption is on: the packs and the backup in the
bucket are sealed, and the restore opens the backup with the same key file."""

from __future__ import annotations

import asyncio
import random
import secrets
import shutil
import sys
from pathlib import Path
from typing import Any

from checkpoint_vault.api import Settings, create_app
from checkpoint_vault.vault import FakeClock, VaultConfig
from checkpoint_vault.vault.seal import add_key

from ..conftest import Api
from ..seaweed import SeaweedFS


def write_config(path: Path, url: str, seaweed: SeaweedFS, keys: Path) -> Path:
    opts = seaweed.options()
    path.write_text(
        f'[encryption]\nkey_file = "{keys}"\n'
        "[tiers.cold]\n"
        f'url = "{url}"\nendpoint = "{opts["endpoint"]}"\nregion = "{opts["region"]}"\n'
        f'access_key_id = "{opts["access_key_id"]}"\n'
        f'secret_access_key = "{opts["secret_access_key"]}"\nallow_http = true\n'
    )
    return path


async def test_catalog_backup_destroy_restore(
    aiohttp_client: Any, tmp_path: Path, seaweed: SeaweedFS, clock: FakeClock
) -> None:
    url = f"s3://vault/{secrets.token_hex(4)}"
    tiers = {"cold": {"url": url, **seaweed.options()}}
    keys = tmp_path / "keys"
    add_key(keys)
    first = Settings(
        data_dir=tmp_path / "first", vault=VaultConfig(map_size=4 << 20), tiers=tiers, key_file=keys
    )
    client = await aiohttp_client(create_app(first, clock))
    token = (first.data_dir / "admin.token").read_text().strip()
    api = Api(client, token, first.data_dir)
    rng = random.Random(9)
    saved: dict[str, tuple[str, str, bytes]] = {}
    for i in range(3):
        data = rng.randbytes(400_000)
        rec = await api.save("dr/run", {"model.bin": data}, metadata={"step": i})
        saved[rec["id"]] = ("dr/run", "model.bin", data)
    state = b'{"messages": ["hi"]}' * 200
    agent = await api.json(
        "POST",
        "/v1/namespaces/dr/agent/checkpoints",
        expect=201,
        data=_bundle(state),
        headers={"Content-Type": "application/x"},
    )
    saved[agent["id"]] = ("dr/agent", "state.json", state)
    await api.json(
        "PUT",
        "/v1/policy/default",
        json={"tiering": {"target": "cold", "demote_after": "0s", "keep_hot_last": 0}},
    )
    moved = await api.json("POST", "/v1/admin/tiering?dry_run=false")
    assert moved["moved"]["cold"]["chunks"] > 0
    backup = await api.json("POST", "/v1/admin/catalog/backup", expect=201)
    assert backup["tier"] == "cold"
    await client.close()
    shutil.rmtree(first.data_dir)  # the machine is gone

    second_dir = tmp_path / "second"
    config = write_config(tmp_path / "ckpt.toml", url, seaweed, keys)
    argv = [
        "catalog",
        "restore",
        "tier:cold",
        "--data",
        str(second_dir),
        "--config",
        str(config),
        "--json",
    ]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "checkpoint_vault.cli",
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, stderr.decode()
    second = Settings(
        data_dir=second_dir, vault=VaultConfig(map_size=4 << 20), tiers=tiers, key_file=keys
    )
    client2 = await aiohttp_client(create_app(second, clock))
    api2 = Api(client2, token, second_dir)  # tokens come back with the catalog
    for cid, (ns, name, data) in saved.items():
        assert await api2.read(ns, cid, name) == data
    check = await api2.json("POST", "/v1/admin/check")
    assert check["ok"] is True
    assert (await api2.json("POST", "/v1/admin/verify"))["corrupt"] == []
    after = await api2.save("dr/run", {"model.bin": b"life goes on"})  # new frames
    assert await api2.read("dr/run", after["id"], "model.bin") == b"life goes on"


def _bundle(state: bytes) -> bytes:
    from checkpoint_vault.protocol import encode_bundle

    return encode_bundle({"chunking": "small"}, [("state.json", state)])
