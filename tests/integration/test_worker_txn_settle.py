"""A change a worker forwards settles its namespace's decided transactions once, in the
process that writes (api/txn/resolving.py `txn_middleware`, node/worker.py): the worker
used to settle first, which for a decided upload meant waiting, up to READER_WAIT, for the
writing process to apply it; nothing there did but the resolver's next pass (every
RESOLVE_INTERVAL, 0.5 s), and then the writing process's own middleware found nothing.

A one-shard cluster whose store is a directory, served by `ckpt serve --workers 2` (the
writing process and one worker, which answers the port). Each round prepares an upload in
a transaction, decides `commit` in the store as a coordinator would, and at once opens
another upload in the namespace (a change: forwarded). The resolver logs each transaction
it applied: before, it applied every one (the worker waited for it); now the forwarded
request's own settling in the writing process applies them, the resolver only one whose
decision fell just before its pass."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from checkpoint_vault.cluster.txn import COMMIT, Decisions
from checkpoint_vault.tiering import open_tier

from ..serverproc import ServerProcess, free_port

ROUNDS = 5
NS = "agents/forwarded"


@pytest.fixture
def clustered(tmp_path: Path) -> Iterator[tuple[ServerProcess, str]]:
    port = free_port()
    store = (tmp_path / "cluster").as_uri()
    config = tmp_path / "server.toml"
    config.write_text(
        f'[cluster]\nnode = "solo"\nurl = "http://127.0.0.1:{port}"\nshards = 1\n'
        f'store = "{store}"\ntxn_timeout = "60s"\n'
    )
    server = ServerProcess(tmp_path / "data", port, tmp_path / "server.log", config, workers=2)
    try:
        server.start()
        yield server, store
    finally:
        server.stop()


def _call(server: ServerProcess, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(
        server.url + path,
        data=data,
        method=method,
        headers={"Authorization": f"Bearer {server.token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310 - our loopback server
        return json.loads(answer.read())


@pytest.mark.slow
def test_a_forwarded_change_settles_in_the_writing_process(
    clustered: tuple[ServerProcess, str],
) -> None:
    server, store = clustered
    decisions = Decisions(open_tier("cluster", store), "test")
    txns = [f"{i:02x}" * 16 for i in range(ROUNDS)]
    for i, txn in enumerate(txns):
        upload = _call(server, "POST", f"/v1/namespaces/{NS}/uploads", {})["upload_id"]
        _call(server, "PUT", f"/v1/uploads/{upload}/files/f", f"round {i}".encode())
        _call(
            server, "POST", f"/v1/uploads/{upload}/prepare", {"transaction": txn, "namespace": NS}
        )
        assert decisions.decide(txn, COMMIT) == COMMIT
        _call(server, "POST", f"/v1/namespaces/{NS}/uploads", {})  # forwarded: settles first
        latest = _call(server, "GET", f"/v1/namespaces/{NS}/checkpoints/latest")
        assert latest["files"]["f"]["size"] == len(f"round {i}")
    log = server.log_path.read_text(errors="replace")
    by_resolver = [t for t in txns if re.search(f"resolver: .*{t}", log)]
    assert len(by_resolver) <= ROUNDS // 2, by_resolver  # before: every one
