"""A one-node cluster in one process: what `[cluster]` adds to a server on its own (the
suite runs against this with CKPT_TEST_CLUSTER=1, tests/conftest.py)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from checkpoint_vault.api import Settings, create_app
from checkpoint_vault.cluster import ClusterConfig
from checkpoint_vault.cluster.shards import upload_prefix

from ..conftest import Api


async def test_a_one_node_cluster_owns_its_shard(
    aiohttp_client: Any, settings: Settings, tmp_path: Path
) -> None:
    cluster = ClusterConfig(
        node="solo", url="http://127.0.0.1:9", shards=1, store=(tmp_path / "c").as_uri()
    )
    settings = replace(
        settings, cluster=cluster, vault=replace(settings.vault, upload_id_prefix=upload_prefix(0))
    )
    client = await aiohttp_client(create_app(settings))
    api = Api(client, (settings.data_dir / "admin.token").read_text().strip(), settings.data_dir)

    state = await api.json("GET", "/v1/cluster")
    assert [n["node"] for n in state["nodes"]] == ["solo"]
    assert state["shard_owners"] == [
        {
            "shard": 0,
            "owner": "solo",
            "url": "http://127.0.0.1:9",
            "epoch": 0,
            "lag_seconds": None,
            "checkpoints": 0,
            "logical_bytes": 0,
            "stored_bytes": 0,
            "standbys": [],
        }
    ]
    primary = await client.get("/v1/cluster/primary")  # the proxy's check: no token
    assert primary.status == 200
    opened = await api.open("one/ns")
    assert opened["upload_id"].startswith("0-")
    saved = await api.save("one/ns", {"a.txt": b"hello"})
    assert (await api.json("GET", f"/v1/namespaces/one/ns/checkpoints/{saved['id']}"))["id"]
    assert list((tmp_path / "c" / "tokens").iterdir())  # the admin token, mirrored


async def test_a_single_server_is_no_cluster(api: Api) -> None:
    clustered = bool(os.environ.get("CKPT_TEST_CLUSTER"))  # the suite's 1-node cluster run
    state = await api.json("GET", "/v1/cluster")
    assert state["cluster"] is clustered
    primary = await api.client.get("/v1/cluster/primary")
    assert primary.status == 200  # the primary of its own data
