"""`vault://` through real fsspec against a real server: listing, info, cat, open, refs,
errors, ambiguous paths, refused writes, and torch, safetensors and numpy reading through
it. Each test's filesystem is closed afterwards and no client loop thread may outlive it."""

from __future__ import annotations

import errno
import io
import pickle
import random
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import fsspec  # type: ignore[import-untyped]  # fsspec has no type hints
import numpy as np
import pytest
import safetensors.torch
import torch

from checkpoint_vault.client import VaultClient
from checkpoint_vault.client.fsspec import InCheckpoint, TreeDir, VaultFileSystem, split_path

from ..serverproc import ServerProcess
from .forkscript import run_fork_script

NS = "fs/run-1"
ID_LIKE = "01ARZ3NDEKTSV4RRFFQ69G5FAV"  # a well-formed ULID no checkpoint has


@dataclass(frozen=True)
class Saved:
    """Two checkpoints of NS: `old` (valid) and `new` (latest, marked invalid)."""

    old: str
    new: str
    old_files: dict[str, bytes]
    new_files: dict[str, bytes]
    tensors: dict[str, torch.Tensor]


def _tensors() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    return {
        "embed.weight": torch.randn(1500, 1000, generator=gen),  # 6 MB: spans 4 MiB blocks
        "head.bias": torch.arange(10, dtype=torch.float32),
    }


def _torch_bytes(obj: object) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


@pytest.fixture(scope="module")
def saved(server: ServerProcess) -> Saved:
    tensors = _tensors()
    old_files = {
        "model.safetensors": safetensors.torch.save(tensors),
        "model.pt": _torch_bytes(tensors),
        "data/train.csv": b"".join(f"{i},{i * i},{i / 4}\n".encode() for i in range(200)),
        "data/nested/deep/blob.bin": random.Random(3).randbytes(5 << 20),
        "empty": b"",
    }
    new_files = {**old_files, "notes.txt": b"second checkpoint\n", "empty": b"now not empty"}
    with VaultClient(server.url, server.token, progress=False) as vault:
        old = vault.save(NS, old_files)
        vault.mark_valid(NS, old.id)
        new = vault.save(NS, new_files, parent=old.id)
        vault.mark_invalid(NS, new.id, reason="test: latest-valid must skip it")
    return Saved(old.id, new.id, old_files, new_files, tensors)


def _client_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "ckpt-client"}


@pytest.fixture(autouse=True)
def no_leaked_client_threads() -> Iterator[None]:
    before = _client_threads()
    yield
    assert _client_threads() <= before, "a VaultClient loop thread outlived its test"


@pytest.fixture
def options(server: ServerProcess) -> Iterator[dict[str, str]]:
    """Storage options; every filesystem fsspec made in the test is closed afterwards."""
    yield {"endpoint_url": server.url, "token": server.token}
    # fsspec's instance cache is the only list of what fsspec.open made in the test.
    for fs in list(VaultFileSystem._cache.values()):
        fs.close()
    VaultFileSystem.clear_instance_cache()


@pytest.fixture
def fs(options: dict[str, str]) -> VaultFileSystem:
    made = fsspec.filesystem("vault", **options)
    assert isinstance(made, VaultFileSystem)
    return made


def test_entry_point_names_the_class() -> None:
    assert fsspec.get_filesystem_class("vault") is VaultFileSystem


def test_imports_with_only_fsspec_installed() -> None:
    code = (
        "import sys\n"
        "for m in ('torch', 'safetensors', 'langgraph', 'numpy'): sys.modules[m] = None\n"
        "import fsspec\n"
        "assert fsspec.get_filesystem_class('vault').__module__ == 'client.fsspec'\n"
        "bad = {'vault', 'api', 'tiering', 'lmdb'} & {m.split('.')[0] for m in sys.modules}\n"
        "assert not bad, bad\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_ls_at_each_level(fs: VaultFileSystem, saved: Saved) -> None:
    assert {"name": "fs", "size": 0, "type": "directory"} in fs.ls("")
    assert fs.ls("vault://fs", detail=False) == [NS]
    ckpts = fs.ls(NS)
    assert [e["name"] for e in ckpts] == [f"{NS}/{saved.new}", f"{NS}/{saved.old}"]
    assert [e["validity"] for e in ckpts] == ["invalid", "valid"]
    assert all(e["type"] == "directory" and e["checkpoint"] in e["name"] for e in ckpts)

    top = {e["name"]: e for e in fs.ls(f"{NS}/{saved.old}")}
    names = ["data", "empty", "model.pt", "model.safetensors"]
    assert sorted(top) == [f"{NS}/{saved.old}/{n}" for n in names]
    assert top[f"{NS}/{saved.old}/data"]["type"] == "directory"
    assert top[f"{NS}/{saved.old}/model.pt"]["size"] == len(saved.old_files["model.pt"])
    assert fs.ls(f"{NS}/latest/data/nested", detail=False) == [f"{NS}/latest/data/nested/deep"]
    blob = fs.ls(f"vault://{NS}/latest/data/nested/deep/blob.bin")  # a file lists itself
    assert [(e["name"], e["size"], e["type"]) for e in blob] == [
        (f"{NS}/latest/data/nested/deep/blob.bin", 5 << 20, "file")
    ]
    found = fs.find(NS)  # one entry per file per checkpoint: aliases are not listed
    assert len(found) == len(saved.old_files) + len(saved.new_files)
    assert fs.du(f"{NS}/{saved.new}") == sum(map(len, saved.new_files.values()))


def test_info_sizes_types_and_checkpoint(fs: VaultFileSystem, saved: Saved) -> None:
    for name, data in saved.new_files.items():
        info = fs.info(f"vault://{NS}/latest/{name}")
        assert (info["size"], info["type"], info["checkpoint"]) == (len(data), "file", saved.new)
    assert fs.size(f"{NS}/{saved.old}/empty") == 0
    ckpt = fs.info(f"{NS}/latest-valid")
    assert (ckpt["type"], ckpt["checkpoint"], ckpt["validity"]) == ("directory", saved.old, "valid")
    assert fs.info("fs") == {"name": "fs", "size": 0, "type": "directory"}
    assert fs.isdir(f"{NS}/latest/data/nested")
    assert fs.isfile(f"{NS}/latest/data/train.csv")
    assert not fs.isfile(f"{NS}/latest/data")
    assert fs.exists(f"{NS}/latest/notes.txt")
    assert not fs.exists(f"{NS}/latest-valid/notes.txt")  # only in the newer checkpoint


def test_refs_resolve_to_their_checkpoints(fs: VaultFileSystem, saved: Saved) -> None:
    assert fs.cat_file(f"{NS}/latest/empty") == saved.new_files["empty"]
    assert fs.cat_file(f"{NS}/latest-valid/empty") == b""
    assert fs.cat_file(f"{NS}/{saved.old}/empty") == b""
    assert fs.cat_file(f"{NS}/{saved.new}/notes.txt") == saved.new_files["notes.txt"]


def test_cat_whole_and_ranges(fs: VaultFileSystem, saved: Saved) -> None:
    blob = saved.old_files["data/nested/deep/blob.bin"]
    path = f"vault://{NS}/latest-valid/data/nested/deep/blob.bin"
    assert fs.cat(path) == blob
    spans = [(0, 10), (1000, 5_000_000), (-100, None), (None, -7), (-(10 << 20), 5)]
    spans += [(len(blob) - 3, len(blob) + 100), (len(blob) + 1, None), (50, 20)]
    for start, end in spans:
        assert fs.cat_file(path, start, end) == blob[start:end], (start, end)
    csv = f"{NS}/latest/data/train.csv"
    got = fs.cat_ranges([path, csv, path], [0, 2, -4], [4, 9, None])
    assert got == [blob[:4], saved.new_files["data/train.csv"][2:9], blob[-4:]]
    both = fs.cat([csv, f"{NS}/latest/notes.txt"])
    assert both[f"{NS}/latest/notes.txt"] == saved.new_files["notes.txt"]


def test_open_seeks_and_reads_ranges(options: dict[str, str], saved: Saved) -> None:
    blob = saved.old_files["data/nested/deep/blob.bin"]
    rng = random.Random(11)
    url = f"vault://{NS}/{saved.old}/data/nested/deep/blob.bin"
    with fsspec.open(url, "rb", block_size=256 << 10, **options) as f:
        assert f.size == len(blob)
        assert f.read(100) == blob[:100]
        assert f.seek(-10, io.SEEK_END) == len(blob) - 10
        assert f.read(100) == blob[-10:]  # short at the end
        assert f.read(1) == b""
        f.seek(1 << 20)
        assert f.seek(3, io.SEEK_CUR) == (1 << 20) + 3
        assert f.read(4) == blob[(1 << 20) + 3 : (1 << 20) + 7]
        for _ in range(50):
            pos, n = rng.randrange(len(blob)), rng.choice([1, 17, 4096, 300_000, 2 << 20])
            f.seek(pos)
            assert f.read(n) == blob[pos : pos + n]
            assert f.tell() == min(pos + n, len(blob))
        buf = bytearray(1000)
        f.seek(5)
        assert f.readinto(buf) == 1000
        assert bytes(buf) == blob[5:1005]


def test_open_file_pins_the_ref_to_one_checkpoint(fs: VaultFileSystem, vault: VaultClient) -> None:
    first = vault.save("fs/pin", {"w.bin": b"A" * 100_000})
    with fs.open("fs/pin/latest/w.bin", block_size=1000) as f:
        assert f.path == f"fs/pin/{first.id}/w.bin"
        assert f.read(10) == b"A" * 10
        second = vault.save("fs/pin", {"w.bin": b"B" * 100_000})
        f.seek(50_000)
        assert f.read(10) == b"A" * 10  # still the checkpoint opened, not the new latest
        again = pickle.loads(pickle.dumps(f))  # a reopened copy keeps the pin too
        assert again.read(3) == b"AAA"
        again.close()
    assert fs.info("fs/pin/latest/w.bin")["checkpoint"] == second.id
    assert fs.cat_file("fs/pin/latest/w.bin", 0, 2) == b"BB"


def test_missing_things_raise_file_not_found(
    fs: VaultFileSystem, options: dict[str, str], saved: Saved
) -> None:
    missing = [
        "nowhere/latest/x",  # no such namespace
        f"{NS}/latest/no-such-file",
        f"{NS}/latest/data/nested/nope",
        f"{NS}/{ID_LIKE}/model.pt",  # well-formed id, no checkpoint
        f"{NS}/v1/model.pt",  # not a ref and not a namespace
        "fs/run",  # a prefix of a segment is not a directory
    ]
    for path in missing:
        with pytest.raises(FileNotFoundError):
            fs.info(path)
        with pytest.raises(FileNotFoundError):
            fs.cat_file(path)
        assert not fs.exists(path)
    with pytest.raises(FileNotFoundError):
        fs.ls(f"{NS}/latest/no-such-dir")
    with pytest.raises(FileNotFoundError), fsspec.open(f"vault://{NS}/latest/nope", **options):
        pass
    with pytest.raises(IsADirectoryError):
        fs.open(f"{NS}/latest/data")
    with pytest.raises(IsADirectoryError):
        fs.cat_file(NS)


def test_latest_valid_without_a_valid_checkpoint(fs: VaultFileSystem, vault: VaultClient) -> None:
    only = vault.save("fs/all-bad", {"x": b"x"})
    vault.mark_invalid("fs/all-bad", only.id)
    assert fs.cat_file("fs/all-bad/latest/x") == b"x"
    with pytest.raises(FileNotFoundError, match="latest-valid"):
        fs.cat_file("fs/all-bad/latest-valid/x")


def test_writes_are_refused(fs: VaultFileSystem, options: dict[str, str], saved: Saved) -> None:
    target = f"{NS}/latest/new.txt"
    attempts: list[Callable[[], object]] = [
        lambda: fs.open(target, "wb"),
        lambda: fs.open(target, "ab"),
        lambda: fs.open(target, "w"),
        lambda: fs.pipe_file(target, b"x"),
        lambda: fs.touch(target),
        lambda: fs.rm(f"{NS}/latest/notes.txt"),
        lambda: fs.rm_file(f"{NS}/latest/notes.txt"),
        lambda: fs.mkdir(f"{NS}/latest/d"),
        lambda: fs.makedirs(f"{NS}/latest/d"),
        lambda: fs.rmdir(f"{NS}/latest/data"),
        lambda: fs.cp_file(f"{NS}/latest/notes.txt", target),
        lambda: fs.mv(f"{NS}/latest/notes.txt", target),
    ]
    for attempt in attempts:
        with pytest.raises(PermissionError) as caught:
            attempt()
        assert caught.value.errno == errno.EROFS
        assert "read-only" in str(caught.value)
    with pytest.raises(PermissionError), fsspec.open(f"vault://{target}", "wb", **options) as f:
        f.write(b"x")
    assert [e["name"] for e in fs.ls(NS)] == [f"{NS}/{saved.new}", f"{NS}/{saved.old}"]
    assert fs.cat_file(f"{NS}/latest/notes.txt") == saved.new_files["notes.txt"]


def test_split_path_rule() -> None:
    namespaces = {"team", "team/latest", "agents", f"agents/{ID_LIKE}", "a/b/c/d/e/f/g/h"}
    cases = {
        "": TreeDir("", False),
        "team": TreeDir("team", True),
        "agents": TreeDir("agents", True),
        "a/b": TreeDir("a/b", False),
        "team/latest": TreeDir("team/latest", True),  # the longer namespace wins
        "team/latest/latest/m.pt": InCheckpoint("team/latest", "latest", "m.pt"),
        "team/latest-valid/latest/m.pt": InCheckpoint("team", "latest-valid", "latest/m.pt"),
        f"team/{ID_LIKE}": InCheckpoint("team", ID_LIKE, ""),
        f"team/{ID_LIKE}/a/b": InCheckpoint("team", ID_LIKE, "a/b"),
        f"agents/{ID_LIKE}/latest/s.json": InCheckpoint(f"agents/{ID_LIKE}", "latest", "s.json"),
        # s.json is no ref, so only the shorter reading fits
        f"agents/{ID_LIKE}/s.json": InCheckpoint("agents", ID_LIKE, "s.json"),
        f"agents/{ID_LIKE.lower()}/x": None,  # ids are upper case
        "a/b/c/d/e/f/g/h/latest/x/y": InCheckpoint("a/b/c/d/e/f/g/h", "latest", "x/y"),
        "team/v1/m.pt": None,
        "nowhere": None,
        "tea": None,
    }
    for path, expected in cases.items():
        assert split_path(path, namespaces) == expected, path


def test_ambiguous_paths_against_the_server(fs: VaultFileSystem, vault: VaultClient) -> None:
    outer = vault.save("amb", {"latest/inner.txt": b"outer's file under latest/"})
    inner = vault.save("amb/latest", {"inner.txt": b"inner namespace"})
    thread = vault.save(f"amb/{ID_LIKE}", {"state.json": b"{}"})
    # "amb/latest" is a namespace, so it is that namespace, not amb's latest checkpoint.
    assert fs.info("amb/latest") == {"name": "amb/latest", "size": 0, "type": "directory"}
    assert fs.ls("amb/latest", detail=False) == [f"amb/latest/{inner.id}"]
    assert fs.cat_file("amb/latest/latest/inner.txt") == b"inner namespace"
    # amb's files stay reachable through its checkpoint id.
    assert fs.cat_file(f"amb/{outer.id}/latest/inner.txt") == b"outer's file under latest/"
    # A namespace segment shaped like a checkpoint id is a namespace when one exists.
    assert fs.cat_file(f"amb/{ID_LIKE}/latest/state.json") == b"{}"
    assert fs.info(f"amb/{ID_LIKE}/latest")["checkpoint"] == thread.id
    assert sorted(fs.ls("amb", detail=False)) == sorted(
        [f"amb/{outer.id}", "amb/latest", f"amb/{ID_LIKE}"]
    )


def test_namespaces_made_later_resolve(fs: VaultFileSystem, vault: VaultClient) -> None:
    vault.save("fs/early", {"x": b"1"})
    assert fs.ls("fs/early", detail=False)  # caches the namespace list
    vault.save("fs/later", {"x": b"2"})
    assert fs.cat_file("fs/later/latest/x") == b"2"  # a miss fetches the list again
    vault.save("fs/latest-ish", {"x": b"3"})
    assert "fs/latest-ish" not in fs.ls("fs", detail=False)  # cached listing, as in s3fs
    assert "fs/latest-ish" in fs.ls("fs", detail=False, refresh=True)


def test_read_scope_limits_what_is_visible(
    server: ServerProcess, vault: VaultClient, saved: Saved
) -> None:
    vault.save("fs-secret/x", {"k": b"secret"})
    token = vault.create_token("fsspec-reader", ["read:fs/*"]).token
    reader = VaultFileSystem(endpoint_url=server.url, token=token, skip_instance_cache=True)
    try:
        assert "fs-secret" not in reader.ls("", detail=False)
        assert reader.cat_file(f"{NS}/latest/notes.txt") == saved.new_files["notes.txt"]
        with pytest.raises(FileNotFoundError):
            reader.cat_file("fs-secret/x/latest/k")
    finally:
        reader.close()
    bad = VaultFileSystem(endpoint_url=server.url, token="ckpt_0_bad", skip_instance_cache=True)
    try:
        with pytest.raises(PermissionError):
            bad.ls("")
    finally:
        bad.close()


def test_url_and_token_from_the_environment(
    server: ServerProcess, monkeypatch: pytest.MonkeyPatch, saved: Saved
) -> None:
    monkeypatch.setenv("CKPT_URL", server.url)
    monkeypatch.setenv("CKPT_TOKEN", server.token)
    env_fs = fsspec.filesystem("vault", skip_instance_cache=True)
    try:
        assert env_fs.cat_file(f"{NS}/latest/notes.txt") == saved.new_files["notes.txt"]
    finally:
        env_fs.close()


def test_close_stops_the_client_and_a_later_call_reopens(fs: VaultFileSystem, saved: Saved) -> None:
    before = _client_threads()
    assert fs.cat_file(f"{NS}/latest/notes.txt")
    assert len(_client_threads() - before) == 1
    fs.close()
    assert _client_threads() == before
    assert fs.cat_file(f"{NS}/latest/notes.txt") == saved.new_files["notes.txt"]


# Run in a fresh interpreter: under pytest the child happens to keep its copy of the
# parent's client alive, which hides the failure this guards against.
FORK_SCRIPT = """
import gc, multiprocessing, sys
from checkpoint_vault.client.fsspec import VaultFileSystem

path, expected = sys.argv[1], sys.argv[2].encode()
held = [VaultFileSystem(skip_instance_cache=True)]  # only this list refers to it
assert held[0].cat_file(path) == expected  # the parent now pools a connection


def child():
    fs = held.pop()
    ok = fs.cat_file(path) == expected  # the copy makes a client of its own
    fs.close()
    del fs
    gc.collect()  # the parent's client, copied at fork, dies here
    sys.exit(0 if ok else 3)


proc = multiprocessing.get_context("fork").Process(target=child)
proc.start()
proc.join()
assert proc.exitcode == 0, proc.exitcode
assert held[0].cat_file(path) == expected  # hangs if the child unregistered our socket
held[0].close()
print("parent read after the child exited")
"""


def test_forked_child_reads_and_leaves_the_parent_working(
    server: ServerProcess, saved: Saved
) -> None:
    expected = saved.new_files["notes.txt"].decode()
    out = run_fork_script(server, FORK_SCRIPT, f"{NS}/latest/notes.txt", expected)
    assert out == "parent read after the child exited\n"


def test_safetensors_loads_through_fsspec(options: dict[str, str], saved: Saved) -> None:
    with fsspec.open(f"vault://{NS}/latest-valid/model.safetensors", **options) as f:
        loaded = safetensors.torch.load(f.read())
    assert loaded.keys() == saved.tensors.keys()
    for name, tensor in saved.tensors.items():
        assert torch.equal(loaded[name], tensor)


def test_torch_load_reads_an_fsspec_file(options: dict[str, str], saved: Saved) -> None:
    with fsspec.open(f"vault://{NS}/{saved.old}/model.pt", **options) as f:
        loaded = torch.load(f, weights_only=True)
    for name, tensor in saved.tensors.items():
        assert torch.equal(loaded[name], tensor)


def test_numpy_reads_csv_text_through_fsspec(options: dict[str, str], saved: Saved) -> None:
    with fsspec.open(f"vault://{NS}/latest/data/train.csv", "rt", **options) as f:
        table = np.loadtxt(f, delimiter=",")
    assert table.shape == (200, 3)
    assert table[13].tolist() == [13.0, 169.0, 3.25]
