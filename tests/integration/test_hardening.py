"""Service hardening from issue 16: backups only into a configured directory (#6), private
files (#11), glob scopes that warn when they cross a segment (#12)."""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from checkpoint_vault.api import Settings, create_app
from checkpoint_vault.vault import FakeClock

from ..conftest import Api


async def test_backup_goes_only_into_the_configured_directory(
    api: Api, aiohttp_client: Any, settings: Settings, clock: FakeClock, tmp_path: Path
) -> None:
    """#6: `?to=/abs/path` wrote anywhere the server user could (an authorized_keys line)."""
    victim = tmp_path / "home" / ".ssh"
    victim.mkdir(parents=True)
    target = victim / "authorized_keys"
    resp = await api.call("POST", f"/v1/admin/catalog/backup?to={target}", expect=400)
    assert "backup_dir" in (await resp.json())["error"]["message"]
    assert not target.exists()
    await api.call("POST", "/v1/admin/catalog/backup?to=nightly.mdb", expect=400)
    await api.client.close()

    backups = tmp_path / "backups"
    backups.mkdir()
    client = await aiohttp_client(
        create_app(dataclasses.replace(settings, backup_dir=backups), clock)
    )
    admin = Api(client, api.token, api.data_dir)
    out = await admin.json("POST", "/v1/admin/catalog/backup?to=nightly.mdb", expect=201)
    assert out["path"] == str(backups / "nightly.mdb")
    assert stat.S_IMODE(os.stat(backups / "nightly.mdb").st_mode) == 0o600
    await admin.json("POST", f"/v1/admin/catalog/backup?to={backups}/b.mdb", expect=201)
    for bad in (str(target), f"{backups}/../x.mdb", "../x.mdb", "sub/x.mdb", ".hidden"):
        await admin.call("POST", "/v1/admin/catalog/backup", params={"to": bad}, expect=400)
    assert sorted(p.name for p in backups.iterdir()) == ["b.mdb", "nightly.mdb"]
    assert not target.exists()


async def test_data_dir_is_private_whatever_the_umask(
    aiohttp_client: Any, settings: Settings, clock: FakeClock
) -> None:
    """#11: under umask 022 the data dir was 0755 and the LMDB files 0644."""
    old = os.umask(0o022)
    try:
        client = await aiohttp_client(create_app(settings, clock))
        token = (settings.data_dir / "admin.token").read_text().strip()
        await Api(client, token, settings.data_dir).save("n", {"f": b"secret"})
    finally:
        os.umask(old)
    modes = {
        str(p.relative_to(settings.data_dir)): stat.S_IMODE(p.stat().st_mode)
        for p in [settings.data_dir, *settings.data_dir.rglob("*")]
    }
    assert any(name.endswith("data.mdb") for name in modes)
    wrong = {
        name: oct(mode)
        for name, mode in modes.items()
        if mode != (0o700 if (settings.data_dir / name).is_dir() else 0o600)
    }
    assert wrong == {}


async def test_glob_crossing_a_segment_warns(api: Api) -> None:
    """#12: `read:ns-a*` also grants `ns-archive/...`; the answer now says so."""
    await api.save("ns-archive/old", {"f": b"archived"})
    out = await api.json(
        "POST", "/v1/admin/tokens", 201, json={"name": "trap", "scopes": ["read:ns-a*"]}
    )
    assert len(out["warnings"]) == 1
    assert "ns-archive" in out["warnings"][0]
    # what the warning is about: the glob does grant the other namespace
    await api.call(
        "GET", "/v1/namespaces/ns-archive/old/checkpoints", token=out["token"], expect=200
    )
    good = await api.json(
        "POST",
        "/v1/admin/tokens",
        201,
        json={"name": "good", "scopes": ["read:ns-a", "read:ns-a/*", "write:*"]},
    )
    assert good["warnings"] == []
    await api.call(
        "GET", "/v1/namespaces/ns-archive/old/checkpoints", token=good["token"], expect=403
    )


async def test_token_expiry_last_use_and_rotation_without_downtime(
    api: Api, clock: FakeClock
) -> None:
    out = await api.json(
        "POST",
        "/v1/admin/tokens",
        201,
        json={"name": "short", "scopes": ["read:*"], "expires": "1h"},
    )
    short = out["token"]
    await api.call("GET", "/v1/namespaces", token=short, expect=200)
    listed = {t["name"]: t for t in (await api.json("GET", "/v1/admin/tokens"))["tokens"]}
    assert listed["short"]["last_used"] == clock.now()
    assert listed["short"]["expires_at"] == out["created_at"] + 3600

    producer = await api.token_for("read:*", "write:*", name="producer")
    rotated = await api.json("POST", "/v1/admin/tokens/producer/rotate", 201, json={"grace": "10m"})
    assert rotated["scopes"] == ["read:*", "write:*"]
    for token in (producer, rotated["token"]):  # both work during the grace period
        await api.call("GET", "/v1/namespaces", token=token, expect=200)
    clock.advance(3600)
    resp = await api.call("GET", "/v1/namespaces", token=short, expect=401)
    assert "expired" in (await resp.json())["error"]["message"]
    await api.call("GET", "/v1/namespaces", token=producer, expect=401)
    await api.call("GET", "/v1/namespaces", token=rotated["token"], expect=200)
    await api.call("DELETE", "/v1/admin/tokens/producer", expect=204)  # every secret of it
    await api.call("GET", "/v1/namespaces", token=rotated["token"], expect=401)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
async def test_backup_refuses_a_target_that_is_not_its_own_file(
    aiohttp_client: Any, settings: Settings, clock: FakeClock, tmp_path: Path
) -> None:
    """Issue 41: a backup replaces the file at its target; another user's file there, or a
    symlink, is refused (409) and left as it was."""
    backups = tmp_path / "backups"
    backups.mkdir(mode=0o700)
    client = await aiohttp_client(
        create_app(dataclasses.replace(settings, backup_dir=backups), clock)
    )
    token = (settings.data_dir / "admin.token").read_text().strip()
    admin = Api(client, token, settings.data_dir)
    theirs = backups / "theirs.mdb"
    theirs.write_bytes(b"theirs")
    os.chown(theirs, 65534, 65534)
    outside = tmp_path / "outside"
    outside.write_bytes(b"outside")
    (backups / "link.mdb").symlink_to(outside)
    for name in ("theirs.mdb", "link.mdb"):
        resp = await admin.call("POST", f"/v1/admin/catalog/backup?to={name}", expect=409)
        assert name in (await resp.json())["error"]["message"]
    assert theirs.read_bytes() == b"theirs"
    assert os.stat(theirs).st_uid == 65534
    assert (backups / "link.mdb").is_symlink()
    assert outside.read_bytes() == b"outside"
    await admin.json("POST", "/v1/admin/catalog/backup?to=ours.mdb", expect=201)
