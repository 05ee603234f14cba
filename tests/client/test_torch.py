"""client.torch and background saves against a real server, with real torch."""

from __future__ import annotations

import asyncio
import io
import pickle
import random
import threading
from collections import OrderedDict
from collections.abc import Coroutine
from typing import Any

import blake3
import pytest
import safetensors.torch
import torch

from checkpoint_vault.client import AsyncVaultClient, InvalidName, VaultClient
from checkpoint_vault.client.background import BackgroundSaveFailed
from checkpoint_vault.client.models import Checkpoint
from checkpoint_vault.client.torch import (
    load_safetensors,
    load_state_dict,
    safetensors_layout,
    save_safetensors,
    save_state_dict,
    snapshot,
)

from ..serverproc import ServerProcess

BAD_NAMESPACE = "x" * 200  # one segment over 128 characters: the server answers invalid_name


class Custom:
    """Not an allowed global for weights_only loads."""

    def __init__(self, value: int) -> None:
        self.value = value


def train_state(seed: int = 0, width: int = 256) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Linear(width, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, width)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 1, "loss": 0.5}


def torch_save_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def assert_same(got: Any, want: Any) -> None:
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor)
        assert got.dtype == want.dtype
        assert torch.equal(got, want)
    elif isinstance(want, dict):
        assert list(got) == list(want)
        for k in want:
            assert_same(got[k], want[k])
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert_same(g, w)
    else:
        assert got == want


def torch_save_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "ckpt-torch-save"]


# -- torch.save / torch.load ---------------------------------------------------------------
def test_state_dict_streams_the_exact_torch_save_bytes_and_loads_back(vault: VaultClient) -> None:
    state = train_state()
    ckpt = save_state_dict(vault, "t/state", state, metadata={"step": 1})
    assert ckpt.metadata == {"step": 1}
    assert ckpt.files["state.pt"].hash == blake3.blake3(torch_save_bytes(state)).hexdigest()
    assert_same(load_state_dict(vault, "t/state"), state)
    assert torch_save_threads() == []


def test_a_state_larger_than_the_stream_buffer_dedups_on_the_second_save(
    vault: VaultClient,
) -> None:
    big = {"embedding": torch.randn(6_000_000), "head": torch.randn(1000)}  # 24 MB > 16 MiB
    first = save_state_dict(vault, "t/big", big)
    big["head"] += 1
    sent = vault.transfer.bytes_sent
    second = save_state_dict(vault, "t/big", big, parent=first.id)
    assert vault.transfer.bytes_sent - sent < 1_000_000  # ~the changed chunk, not 24 MB
    assert second.parent == first.id
    assert_same(load_state_dict(vault, "t/big", second.id, map_location="cpu"), big)


def test_a_torch_save_error_reaches_the_caller_and_commits_nothing(vault: VaultClient) -> None:
    bad = {"w": torch.randn(3), "fn": lambda: 0}  # lambdas do not pickle
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        save_state_dict(vault, "t/bad", bad)
    assert vault.list("t/bad") == []
    assert torch_save_threads() == []


def test_weights_only_is_the_default_and_can_be_lifted(vault: VaultClient) -> None:
    save_state_dict(vault, "t/custom", {"w": torch.ones(2), "obj": Custom(5)}, name="c.pt")
    with pytest.raises(pickle.UnpicklingError):
        load_state_dict(vault, "t/custom", name="c.pt")
    loaded = load_state_dict(vault, "t/custom", name="c.pt", weights_only=False)
    assert loaded["obj"].value == 5


# -- snapshots and background saves -------------------------------------------------------
def test_snapshot_keeps_shared_storage_views_and_types() -> None:
    w = torch.randn(4, 4)
    param = torch.nn.Parameter(torch.randn(3))
    sd = OrderedDict(a=w, tied=w, row=w[1], t=w.t(), p=param, n=(1, "x", [2.5]))
    sd._metadata = {"": {"version": 2}}  # type: ignore[attr-defined]  # like state_dict()
    copy = snapshot(sd)
    assert copy["a"].untyped_storage().data_ptr() != w.untyped_storage().data_ptr()
    assert copy["tied"] is copy["a"]
    assert copy["row"].untyped_storage().data_ptr() == copy["a"].untyped_storage().data_ptr()
    assert copy["t"].stride() == w.t().stride()
    assert isinstance(copy["p"], torch.nn.Parameter)
    assert copy["p"].requires_grad
    assert copy._metadata == sd._metadata  # type: ignore[attr-defined]
    assert torch_save_bytes(copy) == torch_save_bytes(sd)  # same bytes: full dedup
    w.add_(1)
    assert not torch.equal(copy["a"], w)


def test_background_save_uploads_the_state_as_it_was_at_the_call(vault: VaultClient) -> None:
    state = train_state(3)
    before = snapshot(state)
    handle = save_state_dict(vault, "t/bg", state, background=True)
    for t in state["model"].values():  # the next training step, while the upload runs
        t.add_(1.0)
    ckpt = handle.result(timeout=120)
    assert handle.done()
    assert ckpt.files["state.pt"].hash == blake3.blake3(torch_save_bytes(before)).hexdigest()
    assert_same(load_state_dict(vault, "t/bg", ckpt.id), before)
    vault.flush()


def test_a_failed_background_save_raises_on_result_and_is_not_raised_twice(
    vault: VaultClient,
) -> None:
    handle = save_state_dict(vault, BAD_NAMESPACE, {"w": torch.ones(2)}, background=True)
    with pytest.raises(InvalidName):
        handle.result(timeout=60)
    vault.flush()  # it was looked at: nothing left to report


def test_an_unobserved_failure_is_raised_by_flush_and_close(server: ServerProcess) -> None:
    client = VaultClient(server.url, server.token, progress=False)
    save_state_dict(client, BAD_NAMESPACE, {"w": torch.ones(2)}, background=True)
    with pytest.raises(BackgroundSaveFailed) as failed:
        client.flush()
    assert isinstance(failed.value.errors[0], InvalidName)
    client.save(BAD_NAMESPACE, {"x": b"1"}, background=True)
    with pytest.raises(BackgroundSaveFailed):
        client.close()


def test_saves_beyond_the_limit_wait_for_a_slot(server: ServerProcess) -> None:
    gate = threading.Event()

    def held(client: VaultClient) -> Coroutine[Any, Any, Checkpoint]:
        async def upload() -> Checkpoint:
            await asyncio.to_thread(gate.wait, 60)
            return await client.aio.save("t/slots", {"x": b"held"})

        return upload()

    with VaultClient(server.url, server.token, progress=False, max_background_saves=2) as client:
        first = client.submit(lambda: held(client))
        second = client.submit(lambda: held(client))
        assert client.aio.background.in_flight == 2
        with pytest.raises(TimeoutError):  # both slots taken: the third caller waits
            client.submit(lambda: held(client), timeout=0.2)
        assert not first.done()
        gate.set()
        first.result(timeout=60)
        second.result(timeout=60)
        third = client.save("t/slots", {"x": b"third"}, background=True)
        assert third.result(timeout=60).files["x"].size == 5
        assert client.aio.background.in_flight == 0


def test_client_save_in_background_snapshots_mutable_buffers(vault: VaultClient) -> None:
    data = bytearray(b"before" * 1000)
    handle = vault.save("t/bytes", {"d.bin": data}, background=True)
    data[:6] = b"after!"
    ckpt = handle.result(timeout=60)
    assert ckpt.files["d.bin"].hash == blake3.blake3(b"before" * 1000).hexdigest()


async def test_async_client_background_save_is_awaitable(server: ServerProcess) -> None:
    async with AsyncVaultClient(server.url, server.token, progress=False) as client:
        handle = await client.save("t/async", {"a.txt": b"async"}, background=True)
        ckpt = await handle
        assert ckpt.files["a.txt"].size == 5
        failed = await client.save(BAD_NAMESPACE, {"a": b"1"}, background=True)
        with pytest.raises(InvalidName):
            await failed
        await client.flush()


# -- safetensors ---------------------------------------------------------------------------
def mixed_tensors() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    return {
        "w": torch.randn(300, 200, generator=gen),
        "half": torch.randn(7, generator=gen).bfloat16(),
        "ids": torch.arange(11),
        "mask": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.empty(0, 4),
        "strided": torch.randn(10, 10, generator=gen).t(),
    }


def test_safetensors_is_the_library_format_both_ways(vault: VaultClient) -> None:
    tensors = mixed_tensors()
    ckpt = save_safetensors(vault, "t/st", tensors)
    with vault.open("t/st", ckpt.id, "model.safetensors") as f:
        ours = f.read()
    assert ours == safetensors.torch.save({k: v.contiguous() for k, v in tensors.items()})
    assert_same(
        dict(sorted(load_safetensors(vault, "t/st").items())), dict(sorted(tensors.items()))
    )

    theirs = safetensors.torch.save({"a": torch.randn(5, 5), "b": torch.ones(3, dtype=torch.int8)})
    vault.save("t/st-lib", {"lib.safetensors": theirs})
    loaded = load_safetensors(vault, "t/st-lib", name="lib.safetensors")
    assert_same(dict(sorted(loaded.items())), dict(sorted(safetensors.torch.load(theirs).items())))


def test_safetensors_chunks_end_at_tensor_boundaries(vault: VaultClient) -> None:
    tensors = {f"layer{i}": torch.randn(64, 1024) for i in range(8)}  # 8 x 256 KiB
    tensors["adapter"] = torch.randn(8, 64)  # small, between them by name
    ckpt = save_safetensors(vault, "t/cuts", tensors)
    layout = safetensors_layout(tensors)
    chunks = vault.manifest("t/cuts", ckpt.id).files["model.safetensors"].chunks
    starts = {c.offset for c in chunks}
    assert set(layout.cuts[:-1]) <= starts

    tensors["adapter"] += 1
    sent = vault.transfer.bytes_sent
    save_safetensors(vault, "t/cuts", tensors)
    assert vault.transfer.bytes_sent - sent < 30_000  # the adapter's 2 KiB chunk and ids

    plain = save_safetensors(vault, "t/cuts-cdc", tensors, cut_at_tensors=False)
    chunks = vault.manifest("t/cuts-cdc", plain.id).files["model.safetensors"].chunks
    assert not set(layout.cuts[1:-1]) <= {c.offset for c in chunks}


def test_safetensors_background_save_copies_first(vault: VaultClient) -> None:
    tensors = {"w": torch.zeros(1000)}
    handle = save_safetensors(vault, "t/st-bg", tensors, background=True)
    tensors["w"].add_(1)
    ckpt = handle.result(timeout=60)
    assert torch.equal(load_safetensors(vault, "t/st-bg", ckpt.id)["w"], torch.zeros(1000))


def test_send_file_ends_chunks_at_cuts_across_pieces(vault: VaultClient) -> None:
    data = random.Random(3).randbytes(20 << 20)  # three 8 MiB pieces
    cuts = [5000, 8 << 20, (8 << 20) + 100, 13 << 20]  # one exactly at a piece boundary
    upload = vault.begin_upload("t/cuts-pieces")
    entry = vault.send_file(upload, "data.bin", data, cuts=cuts)
    ckpt = vault.commit(upload, {"data.bin": entry})
    assert ckpt.files["data.bin"].hash == blake3.blake3(data).hexdigest()
    chunks = vault.manifest("t/cuts-pieces", ckpt.id).files["data.bin"].chunks
    assert set(cuts) <= {c.offset for c in chunks}
    with vault.open("t/cuts-pieces", ckpt.id, "data.bin") as f:
        assert f.read() == data


def test_the_torch_save_stream_starts_over_on_seek_zero() -> None:
    from checkpoint_vault.client.torch import _TorchSaveStream

    state = {"w": torch.randn(1000)}
    stream = _TorchSaveStream(state)
    first = stream.read()
    assert stream.seek(0) == 0
    assert stream.read() == first == torch_save_bytes(state)
    with pytest.raises(io.UnsupportedOperation):
        stream.seek(10)
    stream.close()
    assert torch_save_threads() == []
