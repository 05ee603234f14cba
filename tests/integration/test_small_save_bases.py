"""Small saves of one agent spread over a server's workers (`--workers 2`): the base each
new version patches against is found in memory, never read back and decoded, whichever
worker prepared the parent (vault/smallfile.py: a worker that lacks it leaves the frame to
the process that writes, which holds every small file it committed lately)."""

from __future__ import annotations

import http.client
import json

import pytest

from checkpoint_vault.client import VaultClient

from ..serverproc import ServerProcess

VERSIONS = 16  # P(every save on one worker) = 2^-15: the chain crosses workers


def _bases(server: ServerProcess) -> dict[str, float]:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
    try:
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {server.token}"})
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    prefix = 'ckpt_small_file_bases_total{how="'
    return {
        line[len(prefix) :].split('"', 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(prefix)
    }


@pytest.mark.slow
def test_each_version_patches_against_its_parent_held_in_memory(
    two_processes: ServerProcess,
) -> None:
    states: list[bytes] = []
    ids: list[str] = []
    messages: list[dict[str, str]] = [{"role": "system", "content": "plan " * 400}]
    for step in range(VERSIONS):
        messages.append({"role": "tool", "content": f"step {step}: " + "result " * 60})
        state = json.dumps({"step": step, "messages": messages}).encode()
        # A new client each: its connection lands on either worker.
        with VaultClient(two_processes.url, two_processes.token, local_files=False) as c:
            parent = ids[-1] if ids else None
            ids.append(
                c.save("agents/t", {"state.json": state}, chunking="small", parent=parent).id
            )
        states.append(state)
    found = _bases(two_processes)
    assert found.get("read") == 0, found
    # Every version but the first and each one that starts a new chain (MAX_CHAIN, 8).
    assert found["recent"] + found["writer"] == VERSIONS - 1 - (VERSIONS - 1) // 9, found
    assert found["writer"] >= 1, found  # some version came to the other worker
    assert found["writer_missed"] == 0, found
    with VaultClient(two_processes.url, two_processes.token, local_files=False) as c:
        for ckpt, state in zip(ids, states, strict=True):
            assert c.read_range("agents/t", ckpt, "state.json", 0, 1 << 20) == state
        assert c.stats().stored_bytes < sum(len(s) for s in states) / 4  # patches
