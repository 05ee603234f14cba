"""The `ckpt` command end to end, as a user runs it: a subprocess against a real server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from checkpoint_vault.client import VaultClient

from ..serverproc import ServerProcess

BOTH_TRANSPORTS = True  # conftest: each test against a server with its local socket on, and off
WORKERS = 2  # the default on this machine (one per CPU): the commands go through a worker


def ckpt(server: ServerProcess, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CKPT_URL": server.url, "CKPT_TOKEN": server.token}
    result = subprocess.run(
        [sys.executable, "-m", "checkpoint_vault.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    if ok:
        assert result.returncode == 0, result.stderr
    return result


def js(server: ServerProcess, *args: str) -> Any:
    return json.loads(ckpt(server, *args, "--json").stdout)


@pytest.mark.slow
def test_push_pull_and_catalog_commands(server: ServerProcess, tmp_path: Path) -> None:
    src = tmp_path / "run"
    (src / "opt").mkdir(parents=True)
    (src / "model.bin").write_bytes(os.urandom(300_000))
    (src / "opt" / "state.bin").write_bytes(os.urandom(5000))
    first_id = ckpt(
        server,
        "push",
        "cli/run",
        str(src),
        "--meta",
        "step=100",
        "--meta",
        "note=warmup",
        "--tag",
        "nightly",
    ).stdout.strip()
    (src / "model.bin").write_bytes(os.urandom(300_000))
    second = js(
        server, "push", "cli/run", str(src / "model.bin"), "--parent", "latest", "--inherit"
    )
    assert second["parent"] == first_id
    assert sorted(second["files"]) == ["model.bin", "opt/state.bin"]

    listed = js(server, "ls", "cli/run")
    assert [r["id"] for r in listed] == [second["id"], first_id]
    # one node: every checkpoint is durable when answered (the cluster's parts are not)
    assert [r["id"] for r in js(server, "ls", "cli/run", "--durable")] == [second["id"], first_id]
    assert js(server, "show", "cli/run", "latest", "--durable")["id"] == second["id"]
    assert any(n["name"] == "cli/run" for n in js(server, "ls"))
    shown = js(server, "show", "cli/run", first_id)
    assert shown["metadata"] == {"step": 100, "note": "warmup"}
    assert shown["tags"] == ["nightly"]
    assert "model.bin" in ckpt(server, "show", "cli/run", first_id).stdout
    assert [r["id"] for r in js(server, "lineage", "cli/run", "latest")] == [second["id"], first_id]

    js(server, "mark", "cli/run", second["id"], "invalid", "--reason", "NaN loss")
    dest = tmp_path / "restored"
    pulled = js(server, "pull", "cli/run", "latest-valid", str(dest), "--durable")
    assert pulled["id"] == first_id
    assert (dest / "opt" / "state.bin").read_bytes() == (src / "opt" / "state.bin").read_bytes()
    marked = js(server, "mark", "cli/run", second["id"], "valid")
    assert marked["validity"]["state"] == "valid"
    assert js(server, "show", "cli/run", "latest-valid")["id"] == second["id"]
    js(server, "mark", "cli/run", second["id"], "invalid", "--reason", "NaN loss")

    assert js(server, "pin", "cli/run", first_id)["pinned"] is True
    refused = ckpt(server, "rm", "cli/run", first_id, ok=False)
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1
    assert "pinned" in refused.stderr
    js(server, "unpin", "cli/run", first_id)
    assert js(server, "rm", "cli/run", first_id)["deleted"] is True
    assert [r["id"] for r in js(server, "ls", "cli/run")] == [second["id"]]


def test_push_hands_a_file_over_when_the_server_offers_its_socket(
    server: ServerProcess, tmp_path: Path
) -> None:
    """With the server's default (its local socket on), `ckpt push` on the server's machine
    hands a file past the one-request size over by descriptor; with the socket off, its
    bytes go over HTTP. The checkpoint reads back the same either way."""
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(6 << 20))
    before = server.handed_over().get("files", 0)
    pushed = js(server, "push", "cli/handed", str(big))
    assert server.handed_over().get("files", 0) - before == (1 if server.local_socket else 0)
    js(server, "pull", "cli/handed", pushed["id"], str(tmp_path / "out"))
    assert (tmp_path / "out" / "big.bin").read_bytes() == big.read_bytes()


@pytest.mark.slow
def test_operator_commands(server: ServerProcess, tmp_path: Path) -> None:
    stats = js(server, "stats")
    assert {"chunks", "stored_bytes", "logical_bytes", "dedup_ratio"} <= set(stats)
    secret = ckpt(server, "token", "create", "reader", "--scope", "read:cli/*").stdout.strip()
    assert secret.startswith("ckpt_")
    assert "reader" in {t["name"] for t in js(server, "token", "ls")}
    env_server = ServerProcess(server.data_dir, server.port, server.log_path)
    env_server.token = secret
    denied = ckpt(env_server, "push", "cli/other", str(tmp_path), ok=False)
    assert denied.returncode == 1
    js(server, "token", "revoke", "reader")
    assert js(server, "gc", "--dry-run")["dry_run"] is True
    assert js(server, "check")["ok"] is True


def test_second_server_on_one_data_dir_is_refused(server: ServerProcess) -> None:
    other = subprocess.run(
        [
            sys.executable,
            "-m",
            "checkpoint_vault.cli",
            "serve",
            "--data",
            str(server.data_dir),
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert other.returncode == 1
    assert "in use by another vault process" in other.stderr
    assert "Traceback" not in other.stderr


def test_errors_are_one_line_and_nonzero(server: ServerProcess) -> None:
    missing = ckpt(server, "show", "cli/none", "latest", ok=False)
    assert missing.returncode == 1
    assert missing.stderr.startswith("ckpt show: ")
    assert missing.stderr.count("\n") == 1
    usage = ckpt(server, "mark", "ns", "id", "maybe", ok=False)
    assert usage.returncode == 2


@pytest.mark.slow
def test_retention_verify_and_check_commands(server: ServerProcess, tmp_path: Path) -> None:
    ids = [js(server, "push", "cli/ret", str(_file(tmp_path, f"f{i}", i)))["id"] for i in range(3)]
    policy = js(
        server, "retention", "set", "cli/ret", "--keep-last", "1", "--keep-best", "step:max:1"
    )
    assert policy["retention"]["keep_last"] == 1
    assert js(server, "retention", "get", "cli/ret")["retention"]["keep_best"]["mode"] == "max"
    plan = js(server, "retention", "plan", "--namespace", "cli/ret")
    assert plan["delete"] == [ids[1], ids[0]]
    table = ckpt(server, "retention", "plan", "--namespace", "cli/ret").stdout
    assert "kept because" in table
    assert "last" in table
    applied = js(server, "retention", "apply", "--namespace", "cli/ret")
    assert applied["deleted"] == [ids[1], ids[0]]
    assert [r["id"] for r in js(server, "ls", "cli/ret")] == [ids[2]]
    verified = js(server, "verify", "--namespace", "cli/ret")
    assert verified["corrupt"] == []
    assert verified["chunks_checked"] >= 1
    busy = ckpt(server, "check", "--data", str(server.data_dir), ok=False)
    assert busy.returncode == 1
    assert "in use" in busy.stderr


def test_offline_check_of_a_stopped_data_dir(server: ServerProcess, tmp_path: Path) -> None:
    from checkpoint_vault.vault import Vault

    engine = Vault(tmp_path / "data" / "vault")
    session, _ = engine.open_upload("offline")
    ingest = engine.ingest(session.id, "f")
    ingest.feed(b"offline bytes" * 1000, final=True)
    ingest.finish()
    engine.committer.commit(session.id)
    engine.close()
    report = js(server, "check", "--data", str(tmp_path / "data"))
    assert report["ok"] is True
    assert report["checkpoints"] == 1
    missing = ckpt(server, "check", "--data", str(tmp_path / "nothing"), ok=False)
    assert missing.returncode == 1


def _file(root: Path, name: str, i: int) -> Path:
    path = root / name
    path.write_bytes(os.urandom(2000) + bytes([i]))
    return path


@pytest.mark.slow
def test_tier_commands(server: ServerProcess, tmp_path: Path) -> None:
    js(server, "push", "cli/tier", str(_file(tmp_path, "t", 1)))
    settings = js(
        server,
        "tier",
        "set",
        "cli/tier",
        "--demote-after",
        "7d",
        "--keep-hot-last",
        "2",
        "--pinned-stay-hot",
        "false",
    )
    assert settings == {"demote_after": "7d", "keep_hot_last": 2, "pinned_stay_hot": False}
    assert js(server, "tier", "get", "cli/tier")["keep_hot_last"] == 2
    status = js(server, "tier", "status")
    assert status["hot"]["chunks"] >= 1
    assert js(server, "tier", "plan")["tiers"] == {}  # no target, no tier configured
    assert "hot" in ckpt(server, "tier", "status").stdout
    out = js(server, "tier", "set", "--hot-high-watermark", "1GiB", "--repack-below", "0.3")
    assert out == {"hot_high_watermark": "1GiB", "repack_below": 0.3}
    assert "to repack: 0 packs" in ckpt(server, "tier", "plan").stdout
    assert "repacked 0 packs" in ckpt(server, "tier", "run").stdout
    bad = ckpt(server, "tier", "set", "--hot-high-watermark", "lots", ok=False)
    assert bad.returncode == 1
    assert "hot_high_watermark must be a size" in bad.stderr
    staged = js(server, "tier", "set", "cli/tier", "--stage", "cold:30d", "--stage", "deep:90d")
    assert staged["stages"] == [{"tier": "cold", "after": "30d"}, {"tier": "deep", "after": "90d"}]
    assert "expected TIER:AFTER" in ckpt(server, "tier", "set", "--stage", "cold", ok=False).stderr
    with VaultClient(server.url, server.token, progress=False) as vault:  # no such tiers here
        vault.set_policy("cli/tier", {"tiering": {"stages": None}})


@pytest.mark.slow
def test_compact_stores_older_tensor_checkpoints_as_deltas(
    server: ServerProcess, tmp_path: Path
) -> None:
    """Three safetensors versions of one model, every float changed a little: compaction
    stores the older two as deltas, `show` says so, and every version reads back."""
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(5)
    w = {"a": rng.standard_normal((512, 512)).astype(np.float32)}
    paths = []
    for step in range(3):
        path = tmp_path / f"v{step}" / "model.safetensors"
        path.parent.mkdir()
        save_file(w, str(path))
        paths.append(path)
        w = {"a": (w["a"] * (1 + 1e-4 * rng.standard_normal((512, 512)))).astype(np.float32)}
    ids = [js(server, "push", "cli/compact", str(p.parent))["id"] for p in paths]
    before = js(server, "show", "cli/compact", ids[0], "--storage")["storage"]
    assert set(before["codecs"]) <= {"raw", "zstd"}

    report = js(server, "compact", "--namespace", "cli/compact")
    assert report["checkpoints"] == 2
    assert report["deltas"] > 0
    assert report["saved_bytes"] > 0
    after = js(server, "show", "cli/compact", ids[0], "--storage")["storage"]
    assert after["codecs"]["delta"]["chunks"] > 0
    assert after["stored_bytes"] < before["stored_bytes"] * 0.8
    assert 1 <= after["max_chain"] <= 2
    assert "delta" in ckpt(server, "show", "cli/compact", ids[0]).stdout
    newest = js(server, "show", "cli/compact", ids[2], "--storage")["storage"]
    assert set(newest["codecs"]) <= {"raw", "zstd"}  # the newest is stored as it came
    usage = js(server, "stats", "--namespaces")["by_namespace"]["cli/compact"]
    assert usage["stored_bytes"] < usage["logical_bytes"] / 1.5
    for ckpt_id, path in zip(ids, paths, strict=True):
        dest = tmp_path / f"out-{ckpt_id}"
        js(server, "pull", "cli/compact", ckpt_id, str(dest))
        assert (dest / "model.safetensors").read_bytes() == path.read_bytes()
    assert js(server, "check")["ok"] is True


def test_local_admin_token_goes_only_to_the_local_server(
    server: ServerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 16 #13: ./ckpt-data/admin.token was sent to whatever --url was given."""
    (tmp_path / "ckpt-data").mkdir()
    (tmp_path / "ckpt-data" / "admin.token").write_text(server.token + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPT_")}
    result = subprocess.run(
        [sys.executable, "-m", "checkpoint_vault.cli", "--url", server.url, "ls", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode != 0  # the server is not the local default: no token sent
    assert "401" in result.stderr or "token" in result.stderr.lower()
    from checkpoint_vault.client.endpoint import PlainHttpWarning, default_token, is_local_default

    assert is_local_default("http://127.0.0.1:8470")
    assert not is_local_default(server.url.replace("127.0.0.1", "203.0.113.9"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CKPT_TOKEN", raising=False)
    assert default_token("http://localhost:8470") == server.token
    assert default_token(server.url) is None
    with pytest.warns(PlainHttpWarning, match="plain HTTP"):
        VaultClient("http://203.0.113.9:8470", "ckpt_x_y", progress=False).close()
