"""`ckpt import` from an fsspec URL: a Trainer series in a real S3 server (SeaweedFS on
loopback) read through s3fs, with the endpoint given either way s3fs takes it; and series
held by fsspec's memory filesystem for the problem checks (a truncated archive, a missing
prefix, an unknown scheme)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import fsspec  # type: ignore[import-untyped]  # fsspec has no type hints
import pytest
import s3fs  # type: ignore[import-untyped]  # s3fs has no type hints
import torch

from checkpoint_vault.client import VaultClient
from checkpoint_vault.client.importers import BadSource, export_series, import_series

from ..seaweed import ACCESS_KEY, SECRET_KEY, SeaweedFS
from ..serverproc import ServerProcess

BUCKET = "moving-in"
STEPS = [5, 10, 15, 20]
BIG_STEP = 15  # its weights pass the client's one-request limit (4 MiB): streamed
HALF = 25  # a checkpoint dir the job died writing: no trainer_state.json


def ckpt(
    server: ServerProcess, env: dict[str, str], *args: str, ok: bool = True
) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "CKPT_URL": server.url, "CKPT_TOKEN": server.token, **env}
    result = subprocess.run(
        [sys.executable, "-m", "checkpoint_vault.cli", *args],
        capture_output=True,
        text=True,
        env=full,
        timeout=120,
    )
    if ok:
        assert result.returncode == 0, result.stderr
    return result


@pytest.fixture
def s3(seaweed: SeaweedFS) -> Any:
    fs = s3fs.S3FileSystem(
        key=ACCESS_KEY, secret=SECRET_KEY, endpoint_url=seaweed.endpoint, skip_instance_cache=True
    )
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    return fs


def upload_trainer_series(fs: Any, prefix: str) -> dict[str, bytes]:
    """Trainer checkpoint dirs under `prefix`, as `Trainer._save_checkpoint` leaves them
    (stand-in weights); every object's bytes by its key below `prefix`."""
    objects: dict[str, bytes] = {}
    for step in STEPS:
        size = (5 << 20) if step == BIG_STEP else 20_000
        state = {
            "global_step": step,
            "epoch": step / 10,
            "log_history": [{"loss": 1.0 / step, "step": step}],
            "best_model_checkpoint": f"out/checkpoint-{10}",
            "best_metric": 0.1,
        }
        objects[f"checkpoint-{step}/model.safetensors"] = os.urandom(size)
        objects[f"checkpoint-{step}/trainer_state.json"] = json.dumps(state).encode()
    objects[f"checkpoint-{HALF}/model.safetensors"] = os.urandom(1000)
    fs.pipe({f"{prefix}/{key}": data for key, data in objects.items()})
    return objects


@pytest.mark.slow
def test_a_trainer_series_in_s3_imports_in_order_once(
    server: ServerProcess, vault: VaultClient, seaweed: SeaweedFS, s3: Any, tmp_path: Path
) -> None:
    prefix = f"{BUCKET}/run-a"
    objects = upload_trainer_series(s3, prefix)
    url = f"s3://{prefix}"
    creds = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    endpoint = ["--storage-option", f"endpoint_url={seaweed.endpoint}"]

    dry = json.loads(
        ckpt(server, creds, "import", url, "s3/a", *endpoint, "--dry-run", "--json").stdout
    )
    assert [(e["step"], e["action"]) for e in dry["entries"]] == [
        *[(s, "create") for s in STEPS],
        (HALF, "skip"),
    ]
    assert (
        dry["entries"][-1]["reason"] == f"checkpoint-{HALF}: half-written (no trainer_state.json)"
    )
    assert dry["entries"][2]["bytes"] == (5 << 20) + len(
        objects["checkpoint-15/trainer_state.json"]
    )
    assert "s3/a" not in [n.name for n in vault.namespaces()]

    report = json.loads(ckpt(server, creds, "import", url, "s3/a", *endpoint, "--json").stdout)
    assert (report["layout"], report["source"], report["created"]) == ("hf", url, len(STEPS))
    chain = list(reversed(vault.list("s3/a", limit=100)))
    assert [c.metadata["step"] for c in chain] == STEPS
    assert [c.parent for c in chain] == [None, *(c.id for c in chain[:-1])]
    assert [c.metadata["loss"] for c in chain] == [1.0 / s for s in STEPS]
    assert [c.metadata["checkpoint_dir"] for c in vault.list("s3/a", tag="best")] == [
        "checkpoint-10"
    ]
    origin = chain[0].metadata["imported"]
    assert (origin["from"], origin["key"], origin["place"]) == (url, "checkpoint-5", "checkpoint-5")
    listed = s3.info(f"{prefix}/checkpoint-5/model.safetensors")["LastModified"]
    assert origin["mtimes"]["model.safetensors"] == int(listed.timestamp()) * 10**9

    out = tmp_path / "out"
    export_series(vault, "s3/a", out, progress=False)
    back = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert back == {k: v for k, v in objects.items() if not k.startswith(f"checkpoint-{HALF}/")}

    # Again, the endpoint now from the environment (AWS_ENDPOINT_URL, as botocore reads it).
    again_env = {**creds, "AWS_ENDPOINT_URL": seaweed.endpoint}
    again = json.loads(ckpt(server, again_env, "import", url + "/", "s3/a", "--json").stdout)
    assert (again["created"], again["present"]) == (0, len(STEPS))
    assert len(vault.list("s3/a", limit=100)) == len(STEPS)


def test_s3_sources_it_cannot_list_are_named(
    vault: VaultClient, seaweed: SeaweedFS, s3: Any
) -> None:
    options = {"key": ACCESS_KEY, "secret": SECRET_KEY, "endpoint_url": seaweed.endpoint}
    wrong = {**options, "secret": "not-the-secret"}
    with pytest.raises(BadSource, match=r"s3://moving-in/x: cannot list \(PermissionError"):
        import_series(vault, f"s3://{BUCKET}/x", "s3/bad", storage_options=wrong)
    with pytest.raises(BadSource, match="bucket does not exist"):
        import_series(vault, "s3://no-such-bucket/x", "s3/bad", storage_options=options)
    with pytest.raises(BadSource, match="not a directory"):
        import_series(vault, f"s3://{BUCKET}/nothing-here", "s3/bad", storage_options=options)
    assert "s3/bad" not in [n.name for n in vault.namespaces()]


def test_an_s3_source_without_s3fs_names_the_extra(server: ServerProcess) -> None:
    """Run as if s3fs were not installed (a None in sys.modules makes its import fail)."""
    code = (
        "import sys; sys.modules['s3fs'] = None; "
        "from checkpoint_vault import cli; sys.exit(cli.main(sys.argv[1:]))"
    )
    env = {**os.environ, "CKPT_URL": server.url, "CKPT_TOKEN": server.token}
    result = subprocess.run(
        [sys.executable, "-c", code, "import", "s3://bucket/run", "s3/none"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 1
    assert "s3:// sources need s3fs: pip install 'checkpoint-vault[import]'" in result.stderr


def test_memory_sources_report_their_problems(vault: VaultClient) -> None:
    mem = fsspec.filesystem("memory")
    buffer = _torch_bytes(torch.arange(4096.0))
    mem.pipe(
        {
            "/plain/model_100.pt": buffer,
            "/plain/model_200.pt": buffer[: len(buffer) // 2],  # cut short while being written
            "/plain/notes.txt": b"no step here",
        }
    )
    try:
        report = import_series(vault, "memory://plain", "mem/plain", progress=False)
        assert report.layout == "plain"
        assert [(e.key, e.action, e.reason) for e in report.entries] == [
            ("notes.txt", "skip", "notes.txt: no step in its name"),
            ("step-100", "create", None),
            ("step-200", "skip", "model_200.pt: truncated archive (no zip directory)"),
        ]
        (only,) = vault.list("mem/plain")
        assert only.metadata["imported"]["from"] == "memory:///plain"
        assert only.files["model_100.pt"].size == len(buffer)
        with pytest.raises(BadSource, match="not a directory"):
            import_series(vault, "memory://nothing-here", "mem/none")
        with pytest.raises(BadSource, match="nosuch"):
            import_series(vault, "nosuch://bucket/run", "mem/none")
    finally:
        mem.rm("/plain", recursive=True)


def _torch_bytes(tensor: torch.Tensor) -> bytes:
    import io

    buffer = io.BytesIO()
    torch.save({"w": tensor}, buffer)
    return buffer.getvalue()
