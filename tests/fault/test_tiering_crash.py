"""SIGKILL a real server in the middle of a tiering run to SeaweedFS: after a restart every
checkpoint reads back bit-identical, check is clean (or repairs unnamed hot frames only),
and a second run finishes the move."""

from __future__ import annotations

import asyncio
import io
import random
import secrets
from pathlib import Path

import aiohttp
import pytest

from ..seaweed import SeaweedFS
from ..serverproc import ServerProcess, free_port


def config_for(path: Path, seaweed: SeaweedFS) -> Path:
    o = seaweed.options()
    path.write_text(
        "[maintenance]\ntiering_interval = 0\nbackup_interval = 0\n"
        f'[tiers.cold]\nurl = "s3://vault/{secrets.token_hex(4)}"\n'
        f'endpoint = "{o["endpoint"]}"\nregion = "{o["region"]}"\n'
        f'access_key_id = "{o["access_key_id"]}"\n'
        f'secret_access_key = "{o["secret_access_key"]}"\nallow_http = true\n'
    )
    return path


@pytest.mark.slow
async def test_sigkill_during_tiering_run(tmp_path: Path, seaweed: SeaweedFS) -> None:
    server = ServerProcess(
        tmp_path / "data",
        free_port(),
        tmp_path / "server.log",
        config_for(tmp_path / "ckpt.toml", seaweed),
    )
    server.start()
    try:
        rng = random.Random(11)
        files = {f"f{i}": rng.randbytes(6 << 20) for i in range(12)}  # ~3 packs
        headers = {"Authorization": f"Bearer {server.token}"}
        ids: dict[str, str] = {}
        async with aiohttp.ClientSession(server.url, headers=headers) as http:
            for name, data in files.items():
                async with http.post("/v1/namespaces/tc/uploads", json={}) as resp:
                    up = (await resp.json())["upload_id"]
                async with http.put(
                    f"/v1/uploads/{up}/files/{name}", data=io.BytesIO(data)
                ) as resp:
                    assert resp.status < 300, await resp.text()
                async with http.post(f"/v1/uploads/{up}/commit", json={}) as resp:
                    ids[name] = (await resp.json())["id"]
            async with http.put(
                "/v1/namespaces/tc/policy",
                json={"tiering": {"target": "cold", "demote_after": "0s", "keep_hot_last": 0}},
            ) as resp:
                assert resp.status == 200
            run = asyncio.ensure_future(http.post("/v1/admin/tiering?dry_run=false"))
            for _ in range(1000):  # bounded: kill as soon as the first pack has switched
                async with http.get("/v1/stats") as resp:
                    cold = (await resp.json())["tiers"].get("cold", {}).get("chunks", 0)
                if cold or run.done():
                    break
                await asyncio.sleep(0.01)
            # Readers see a commit a sync cycle before it is durable; any acknowledged write
            # after it makes it durable too (acknowledgements come in commit order).
            async with http.post("/v1/namespaces/barrier/uploads", json={}) as resp:
                assert resp.status == 201, await resp.text()
            server.kill()
            answered: int | None = None  # the run's status, if it answered before the kill
            try:
                response = await run
            except aiohttp.ClientError:
                pass  # the run died with the server: the kill landed in it
            else:
                answered = response.status
                response.release()
            assert answered is None, f"the run answered {answered} before the kill"
        server.start()
        headers = {"Authorization": f"Bearer {server.token}"}
        async with aiohttp.ClientSession(server.url, headers=headers) as http:
            async with http.get("/v1/stats") as resp:
                tiers = (await resp.json())["tiers"]
            assert tiers["cold"]["chunks"] > 0, tiers  # killed mid-run: some moved...
            assert tiers["hot"]["chunks"] > 0, tiers  # ...and some not yet
            for name, data in files.items():
                async with http.get(
                    f"/v1/namespaces/tc/checkpoints/{ids[name]}/files/{name}"
                ) as resp:
                    assert resp.status == 200
                    assert await resp.read() == data, name
            async with http.post("/v1/admin/check?repair=true") as resp:
                assert resp.status == 200, await resp.text()
                report = await resp.json()
            assert report["ok"], report
            assert report["drift"] == []
            async with http.post("/v1/admin/tiering?dry_run=false") as resp:
                assert resp.status == 200
            async with http.post("/v1/admin/check") as resp:
                assert resp.status == 200, await resp.text()
                clean = await resp.json()
            assert clean["ok"]
            assert clean["orphan_frames"] == 0
            for name, data in files.items():
                async with http.get(f"/v1/namespaces/tc/checkpoints/{ids[name]}") as resp:
                    assert (await resp.json())["tier"] == "cold"
                async with http.get(
                    f"/v1/namespaces/tc/checkpoints/{ids[name]}/files/{name}"
                ) as resp:
                    assert await resp.read() == data, name
    finally:
        server.stop()
