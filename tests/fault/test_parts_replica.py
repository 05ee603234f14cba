"""A part is acknowledged once durable on its node, not on the shard's sync replica (issue
44; vault/writer.py `local`), and what that leaves when the node is lost.

One server replicating in sync mode to the session's SeaweedFS, its local socket on (the
part's file is handed over by descriptor, as a host's ranks do). SeaweedFS is killed, so
the replica's uploads stall (a plain save now waits for them): a part still saves, and the
replica owes its batches (`ckpt_replication_lag_bytes` > 0). The server is then SIGKILLed
with the part acknowledged and not replicated:
- a data dir restored from the replica (what a standby that took the shard over holds)
  lacks the part: the commit naming it fails cleanly (409 `part_gone`, nothing visible),
  and after the part is saved again the commit succeeds and reads back;
- the node restarted on its own disk still holds the part, and the commit succeeds.
Before the change the part's save waited for the replica, so with SeaweedFS down it never
finished (the first assertion).
"""

from __future__ import annotations

import json
import secrets
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint_vault.client import VaultClient
from checkpoint_vault.client.errors import NotFound, PartGone
from checkpoint_vault.client.parts import Part
from checkpoint_vault.client.transport import RetryPolicy
from checkpoint_vault.tiering import open_tier
from checkpoint_vault.vault.replication import restore_replica

from ..seaweed import SeaweedFS
from ..serverproc import ServerProcess, free_port
from .test_replication import _metric, _wait_metric

pytestmark = pytest.mark.slow

SAVE_BOUND = 30.0  # seconds for a 4 MiB part's save with the replica stalled (~0.1 s idle)
SIZE = 4 << 20


def _config(path: Path, seaweed: SeaweedFS | None, prefix: str) -> Path:
    """Sync replication to `prefix` of SeaweedFS; None: no replication (a node restarted
    on its own disk, which must not write into the replica the restored copy continues)."""
    lines = ["[maintenance]", "tiering_interval = 0", "backup_interval = 0"]
    if seaweed is not None:
        opts = seaweed.options()
        lines += [
            "[tiers.cold]",
            f'url = "s3://vault/{prefix}"',
            *(f"{k} = {json.dumps(v)}" for k, v in opts.items()),
            "[replication]",
            'tier = "cold"',
            'mode = "sync"',
        ]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def weed(seaweed: SeaweedFS) -> Iterator[SeaweedFS]:
    """The session's SeaweedFS, running again after the test whatever happened."""
    try:
        yield seaweed
    finally:
        if not seaweed.running():
            seaweed.start()


def _client(server: ServerProcess, token: str) -> VaultClient:
    return VaultClient(server.url, token, progress=False, retry=RetryPolicy(attempts=1))


def _save_part_bounded(server: ServerProcess, ns: str, path: Path) -> Part:
    """`save_part` on a thread, bounded: before the change it never returned here."""
    out: list[Part | BaseException] = []

    def run() -> None:
        try:
            with _client(server, server.token) as c:
                out.append(c.save_part(ns, {path.name: path}))
        except BaseException as e:  # noqa: BLE001 - handed to the test below
            out.append(e)

    thread = threading.Thread(target=run, daemon=True)  # left behind if it never returns
    thread.start()
    thread.join(SAVE_BOUND)
    assert out, f"the part's save did not finish in {SAVE_BOUND} s with the replica stalled"
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


def test_a_part_is_acknowledged_with_the_replica_stalled_and_lost_only_to_a_takeover(
    tmp_path: Path, weed: SeaweedFS
) -> None:
    prefix = f"parts-replica-{secrets.token_hex(4)}"
    ns = "parts/replica"
    source = tmp_path / "rank0.bin"
    source.write_bytes(secrets.token_bytes(SIZE))
    node = ServerProcess(
        tmp_path / "node",
        free_port(),
        tmp_path / "node.log",
        _config(tmp_path / "node.toml", weed, prefix),
        local_socket=True,
    )
    taken_over = ServerProcess(
        tmp_path / "standby",
        free_port(),
        tmp_path / "standby.log",
        _config(tmp_path / "standby.toml", weed, prefix),
        local_socket=True,
    )
    try:
        node.start()
        token = node.token
        with _client(node, token) as c:
            before = c.save("parts/other", {"a.bin": b"in the replica"})  # acked: replicated
        assert _wait_metric(node, "ckpt_replication_lag_bytes", lambda v: v == 0)

        weed.kill()  # the replica's uploads stall from here on
        part = _save_part_bounded(node, ns, source)
        assert part.files == ("rank0.bin",)
        assert _metric(node.url, token, "ckpt_replication_lag_bytes") > 0  # owed: not there
        node.kill()  # acknowledged here, never replicated

        # What a standby taking the shard over holds: the replica, without the part.
        weed.start()
        tier = open_tier("cold", f"s3://vault/{prefix}", weed.options())
        restore_replica(tier, taken_over.data_dir / "vault")
        shutil.copy(node.data_dir / "admin.token", taken_over.data_dir / "admin.token")
        taken_over.start()
        with _client(taken_over, token) as c:
            assert c.get("parts/other", before.id).id == before.id
            with pytest.raises(PartGone):
                c.commit_parts(ns, [part], metadata={"step": 1})
            with pytest.raises(NotFound):
                c.get(ns, "latest")
            again = c.save_part(ns, {source.name: source})  # the writer saves it again
            ckpt = c.commit_parts(ns, [again], metadata={"step": 1})
            assert [x.id for x in c.list(ns)] == [ckpt.id]
            assert c.open(ns, ckpt.id, "rank0.bin").read() == source.read_bytes()
        taken_over.stop()

        # The node back on its own disk: the part was durable there when acknowledged.
        node.config = _config(tmp_path / "node.toml", None, prefix)
        node.start()
        with _client(node, token) as c:
            ckpt = c.commit_parts(ns, [part], metadata={"step": 1})
            assert c.open(ns, ckpt.id, "rank0.bin").read() == source.read_bytes()
    finally:
        node.stop()
        taken_over.stop()
