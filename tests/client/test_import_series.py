"""`ckpt import` / `ckpt export` of directory series against a real server: plain files
named by step, DCP directories, half-written entries, dry runs, resuming and the exact
round trip back out (bytes, names, modification times, metadata)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from checkpoint_vault.client import VaultClient
from checkpoint_vault.client.importers import BadSource, export_series, import_series

from ..serverproc import ServerProcess
from .conftest import loaded_by


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


def tree(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under `root`: its bytes and mtime (ns)."""
    return {
        p.relative_to(root).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def plain_series(root: Path, steps: list[int]) -> None:
    """torch.save files by step, a model and an optimizer file per step, each step's
    weights a small change of the one before (as training makes them), distinct mtimes."""
    root.mkdir(parents=True)
    torch.manual_seed(0)
    weights = torch.randn(64, 1024)
    for i, step in enumerate(steps):
        weights[i] += 1.0
        torch.save({"w": weights.clone()}, root / f"model_{step}.pt")
        (root / f"optim_{step}.bin").write_bytes(os.urandom(2000))
        for name in (f"model_{step}.pt", f"optim_{step}.bin"):
            os.utime(root / name, ns=(1_700_000_000_000_000_000 + i * 10**9,) * 2)
    (root / "README.txt").write_text("notes without a step")


def chain_of(vault: VaultClient, namespace: str) -> list[Any]:
    return list(reversed(vault.list(namespace, limit=1000)))


@pytest.mark.slow
def test_plain_files_import_in_step_order_and_export_back_exactly(
    server: ServerProcess, vault: VaultClient, tmp_path: Path
) -> None:
    src = tmp_path / "run"
    plain_series(src, [1000, 200, 30])
    dry = js(server, "import", str(src), "imp/plain", "--dry-run")
    assert [(e["step"], e["action"]) for e in dry["entries"]] == [
        (-1, "skip"),
        (30, "create"),
        (200, "create"),
        (1000, "create"),
    ]
    assert dry["entries"][0]["reason"] == "README.txt: no step in its name"
    assert vault.namespaces() == [] or "imp/plain" not in [n.name for n in vault.namespaces()]

    report = js(server, "import", str(src), "imp/plain")
    assert report["layout"] == "plain"
    assert report["created"] == 3
    chain = chain_of(vault, "imp/plain")
    assert [c.metadata["step"] for c in chain] == [30, 200, 1000]
    assert [c.parent for c in chain] == [None, chain[0].id, chain[1].id]
    assert sorted(chain[2].files) == ["model_1000.pt", "optim_1000.bin"]
    mtime = chain[0].metadata["imported"]["mtimes"]["model_30.pt"]
    assert mtime == (src / "model_30.pt").stat().st_mtime_ns

    again = js(server, "import", src.as_uri(), "imp/plain")  # the same source, as a URL
    assert again["created"] == 0
    assert again["present"] == 3
    assert len(vault.list("imp/plain")) == 3

    out = tmp_path / "out"
    exported = js(server, "export", "imp/plain", str(out))
    assert exported["written"] == ["", "", ""]
    source = tree(src)
    del source["README.txt"]  # not a checkpoint: never imported
    assert tree(out) == source

    import_series(vault, out, "imp/plain-again", progress=False)
    back = chain_of(vault, "imp/plain-again")
    strip = lambda c: {k: v for k, v in c.metadata.items() if k != "imported"}  # noqa: E731
    assert [strip(c) for c in back] == [strip(c) for c in chain]
    assert [c.metadata["imported"]["mtimes"] for c in back] == [
        c.metadata["imported"]["mtimes"] for c in chain
    ]
    assert [c.files for c in back] == [c.files for c in chain]


def dcp_series(root: Path, steps: list[int]) -> None:
    root.mkdir(parents=True)
    for step in steps:
        state = {"w": torch.full((256, 256), float(step)), "step": torch.tensor(step)}
        dcp.save(state, checkpoint_id=str(root / f"step-{step}"))


@pytest.mark.filterwarnings(  # single-process DCP saves and loads: what this test means
    "ignore:torch.distributed is disabled, unavailable or uninitialized:UserWarning"
)
def test_dcp_dirs_half_written_ones_reported_or_stopping_with_strict(
    server: ServerProcess, vault: VaultClient, tmp_path: Path
) -> None:
    src = tmp_path / "dcp"
    dcp_series(src, [10, 20, 30])
    (src / "step-30" / ".metadata").unlink()  # killed before the coordinator wrote it
    refused = ckpt(server, "import", str(src), "imp/dcp", "--strict", ok=False)
    assert refused.returncode == 1
    assert "step-30: half-written (no .metadata)" in refused.stderr
    assert "imp/dcp" not in [n.name for n in vault.namespaces()]

    report = import_series(vault, src, "imp/dcp", progress=False)
    assert report.layout == "dcp"
    assert [(e.key, e.action) for e in report.entries] == [
        ("step-10", "create"),
        ("step-20", "create"),
        ("step-30", "skip"),
    ]
    chain = chain_of(vault, "imp/dcp")
    assert [c.metadata["step"] for c in chain] == [10, 20]
    assert chain[1].parent == chain[0].id
    assert ".metadata" in chain[1].files

    out = tmp_path / "out"
    export_series(vault, "imp/dcp", out, progress=False)
    loaded = {"w": torch.empty(256, 256), "step": torch.tensor(0)}
    dcp.load(loaded, checkpoint_id=str(out / "step-20"))
    assert torch.equal(loaded["w"], torch.full((256, 256), 20.0))
    assert tree(out) == {k: v for k, v in tree(src).items() if not k.startswith("step-30")}

    plain = export_series(vault, "imp/dcp", tmp_path / "plain", plain=True, progress=False)
    assert plain.written == ["step-10", "step-20"]


def test_bad_sources_are_named(server: ServerProcess, vault: VaultClient, tmp_path: Path) -> None:
    with pytest.raises(BadSource, match="not a directory"):
        import_series(vault, tmp_path / "missing", "imp/bad")
    with pytest.raises(BadSource, match="Protocol not known: nosuch"):
        import_series(vault, "nosuch://bucket/run", "imp/bad")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadSource, match="no checkpoint series recognised"):
        import_series(vault, tmp_path / "empty", "imp/bad")
    both = tmp_path / "both"
    (both / "checkpoint-1").mkdir(parents=True)
    (both / "checkpoint-1" / "trainer_state.json").write_text("{}")
    (both / "step-2").mkdir()
    (both / "step-2" / ".metadata").write_bytes(b"x")
    failed = ckpt(server, "import", str(both), "imp/bad", ok=False)
    assert "both hf and dcp checkpoints; choose with --layout" in failed.stderr
    forced = js(server, "import", str(both), "imp/bad", "--layout", "dcp")
    assert [e["key"] for e in forced["entries"]] == ["step-2"]

    cut = tmp_path / "cut"
    plain_series(cut, [1, 2])
    whole = (cut / "model_2.pt").read_bytes()
    (cut / "model_2.pt").write_bytes(whole[: len(whole) // 2])  # a save still being written
    report = import_series(vault, cut, "imp/cut", progress=False)
    assert [(e.key, e.action, e.reason) for e in report.entries][1:] == [
        ("step-1", "create", None),
        ("step-2", "skip", "model_2.pt: truncated archive (no zip directory)"),
    ]


def hf_checkpoint(root: Path, step: int, loss: float, best: int) -> None:
    """A Trainer checkpoint directory as `Trainer._save_checkpoint` leaves it (the files
    the importer reads are real; the weights are stand-ins)."""
    directory = root / f"checkpoint-{step}"
    directory.mkdir(parents=True)
    (directory / "model.safetensors").write_bytes(os.urandom(5000))
    state = {
        "global_step": step,
        "epoch": step / 10,
        "log_history": [{"loss": loss, "step": step, "epoch": step / 10}],
        "best_model_checkpoint": str(root / f"checkpoint-{best}"),
        "best_metric": 0.5,
    }
    (directory / "trainer_state.json").write_text(json.dumps(state))


def test_a_series_imported_again_moves_its_best_tag_and_marks_nan_invalid(
    server: ServerProcess, vault: VaultClient, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    hf_checkpoint(out, 10, 2.0, best=10)
    hf_checkpoint(out, 20, float("nan"), best=10)
    import_series(vault, out, "imp/moving-best", progress=False)
    (tagged,) = vault.list("imp/moving-best", tag="best")
    assert tagged.metadata["step"] == 10
    nan = vault.get("imp/moving-best", "latest")
    assert nan.metadata["loss"] == "nan"
    assert nan.validity.state == "invalid"
    assert nan.validity.reason == "loss is nan"

    hf_checkpoint(out, 30, 1.0, best=30)  # training went on and did better
    report = import_series(vault, out, "imp/moving-best", progress=False)
    assert [e.action for e in report.entries] == ["present", "present", "create"]
    (tagged,) = vault.list("imp/moving-best", tag="best")
    assert tagged.metadata["step"] == 30
    assert tagged.parent == nan.id
    assert vault.get("imp/moving-best", "latest-valid").id == tagged.id


def test_importing_the_package_loads_no_framework() -> None:
    """torch only to read a Lightning file's callback state; LangGraph, psycopg only for a
    database; transformers never."""
    heavy = {"torch", "langgraph", "psycopg", "transformers", "pytorch_lightning"}
    assert loaded_by("client.importers", heavy) == "[]"
