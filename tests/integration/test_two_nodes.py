"""Two service nodes over one SeaweedFS: the object store is shared, the catalogs are not
(no `[cluster] shared_tier`: with one, tests/integration/test_cluster_shared.py).

Each node tiers the same checkpoint into its own prefix of one bucket. Both read back; the
bucket holds the bytes twice. That is what stops cross-node dedup today: a node finds a
chunk only through its own catalog (chunk id -> pack, offset), and pack names are random,
so node B cannot know that node A already stored a chunk, short of a shared chunk index
(docs/SCALING.md). Prefixes must differ: repacking deletes packs its own catalog does not
name, which in a shared prefix would be the other node's.
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint_vault.client import VaultClient
from checkpoint_vault.tiering import open_tier

from ..seaweed import SeaweedFS
from ..serverproc import ServerProcess, free_port


def _config(path: Path, prefix: str, seaweed: SeaweedFS) -> Path:
    opts = seaweed.options()
    path.write_text(
        "[maintenance]\ntiering_interval = 0\nbackup_interval = 0\n"
        "[tiers.cold]\n"
        f'url = "s3://vault/{prefix}"\nendpoint = "{opts["endpoint"]}"\n'
        f'region = "{opts["region"]}"\naccess_key_id = "{opts["access_key_id"]}"\n'
        f'secret_access_key = "{opts["secret_access_key"]}"\nallow_http = true\n'
    )
    return path


@pytest.fixture
def nodes(tmp_path: Path, seaweed: SeaweedFS) -> Iterator[list[tuple[ServerProcess, str]]]:
    run = secrets.token_hex(4)
    procs = []
    try:
        for name in ("a", "b"):
            prefix = f"{run}/node-{name}"
            config = _config(tmp_path / f"{name}.toml", prefix, seaweed)
            proc = ServerProcess(tmp_path / name, free_port(), tmp_path / f"{name}.log", config)
            proc.start()
            procs.append((proc, prefix))
        yield procs
    finally:
        for proc, _ in procs:
            proc.stop()


@pytest.mark.slow
def test_shared_object_store_no_cross_node_dedup(
    nodes: list[tuple[ServerProcess, str]], seaweed: SeaweedFS
) -> None:
    data = random.Random(11).randbytes(3_000_000)
    ids = []
    for proc, _ in nodes:
        with VaultClient(proc.url, proc.token, progress=False) as client:
            ids.append(client.save("shared/run", {"model.bin": data}).id)
            client.set_policy(None, {"tiering": {"target": "cold", "keep_hot_last": 0}})
            moved = client.tiering(dry_run=False).moved
            assert moved is not None
            assert moved["cold"].bytes >= len(data)
    stored = {}
    for _, prefix in nodes:
        tier = open_tier("cold", f"s3://vault/{prefix}", seaweed.options())
        stored[prefix] = sum(tier.head(k) or 0 for k in tier.list("packs/"))
    a, b = stored.values()
    assert a >= len(data)
    assert b >= len(data)  # the same chunks, stored again: no dedup across catalogs
    for (proc, _), ckpt_id in zip(nodes, ids, strict=True):
        with VaultClient(proc.url, proc.token, progress=False) as client:
            assert client.get("shared/run", ckpt_id).tier == "cold"
            with client.open("shared/run", ckpt_id, "model.bin") as f:
                assert f.read() == data
