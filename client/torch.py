"""PyTorch state through the vault: `torch.save` streamed into the chunker, `torch.load`
through range reads, a safetensors writer that cuts chunks at tensor boundaries, and
background saves that block training only for a CPU copy.

    from checkpoint_vault.client import VaultClient
    from checkpoint_vault.client.torch import load_state_dict, save_state_dict
    with VaultClient() as vault:
        save_state_dict(vault, "runs/exp1", {"model": model.state_dict()}, metadata={"step": 10})
        state = load_state_dict(vault, "runs/exp1")            # latest-valid, state.pt

`torch.save` runs on a producer thread writing into a bounded buffer (16 MiB) that the
client reads in 8 MiB pieces, cuts, hashes and sends: no temporary file, and no copy of
the whole serialized state in memory. Only this module (and client.dcp) imports torch.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import ctypes
import io
import json
import threading
from collections.abc import Coroutine, Mapping
from typing import IO, TYPE_CHECKING, Any, Literal, cast, overload

import torch
from torch.serialization import MAP_LOCATION

from .aio import AsyncVaultClient
from .background import SaveHandle
from .errors import IntegrityError
from .models import Checkpoint
from .options import SaveFields
from .remotefile import SizedRawFile
from .sync import VaultClient

if TYPE_CHECKING:
    from typing_extensions import Unpack

STREAM_BUFFER = 16 << 20  # serialized bytes torch.save may run ahead of the upload
PIECE = 4 << 20  # largest copy of one torch.save write held in that buffer
READ_AHEAD = 4 << 20  # bytes per range request while loading (measured: 1-16 MiB alike, 64 slower)

__all__ = [
    "load_safetensors",
    "load_state_dict",
    "save_safetensors",
    "save_state_dict",
    "snapshot",
]


# -- torch.save / torch.load ------------------------------------------------------------
@overload
def save_state_dict(
    client: VaultClient,
    namespace: str,
    state: Any,
    *,
    name: str = "state.pt",
    background: Literal[False] = False,
    **options: Unpack[SaveFields],
) -> Checkpoint: ...
@overload
def save_state_dict(
    client: VaultClient,
    namespace: str,
    state: Any,
    *,
    name: str = "state.pt",
    background: Literal[True],
    **options: Unpack[SaveFields],
) -> SaveHandle: ...
def save_state_dict(
    client: VaultClient,
    namespace: str,
    state: Any,
    *,
    name: str = "state.pt",
    background: bool = False,
    **options: Unpack[SaveFields],
) -> Checkpoint | SaveHandle:
    """`torch.save(state)` as file `name` of a new checkpoint. `background=True`: copy
    the tensors to fresh CPU memory (`snapshot`), return a `SaveHandle` at once, and
    serialize and upload the copy on the client's thread."""
    if background:

        def prepare() -> Coroutine[Any, Any, Checkpoint]:
            stream = _TorchSaveStream(snapshot(state))
            files = {name: _as_file(stream)}
            save = client.aio.save(namespace, files, **options)
            return _closing(save, stream)

        return client.submit(prepare)
    stream = _TorchSaveStream(state)
    try:
        return client.save(namespace, {name: _as_file(stream)}, **options)
    finally:
        stream.close()


def load_state_dict(
    client: VaultClient,
    namespace: str,
    ref: str = "latest-valid",
    *,
    name: str = "state.pt",
    map_location: MAP_LOCATION = None,
    weights_only: bool = True,
) -> Any:
    """`torch.load` of file `name` of checkpoint `ref`, read through range requests
    (`VaultClient.open`): nothing is written to disk."""
    # torch.load reads storage after storage in file order: a read-ahead buffer makes one
    # range request per READ_AHEAD bytes instead of one per tensor.
    with (
        client.open(namespace, ref, name) as f,
        io.BufferedReader(f.raw, buffer_size=READ_AHEAD) as ahead,
    ):
        return torch.load(ahead, map_location=map_location, weights_only=weights_only)


async def _closing(save: Coroutine[Any, Any, Checkpoint], stream: io.RawIOBase) -> Checkpoint:
    """Run `save`, then close the stream it reads (which ends its producer thread)."""
    try:
        return await save
    finally:
        await asyncio.to_thread(stream.close)


def snapshot(state: Any) -> Any:
    """A copy of `state` whose tensors live in fresh CPU memory, taken now.

    Containers (dicts, lists, tuples) are rebuilt, other objects deep-copied. Tensors that
    share a storage (tied weights, views) still share one copy of it, with their offsets
    and strides, so `torch.save` of the copy writes the bytes it would have written for
    `state`: background and foreground saves of the same state dedup completely."""
    return _Snapshot().clone(state)


class _Snapshot:
    def __init__(self) -> None:
        self._storages: dict[tuple[str, int], torch.UntypedStorage] = {}
        self._memo: dict[int, Any] = {}

    def clone(self, obj: Any) -> Any:
        if isinstance(obj, (str, bytes, int, float, bool, type(None))):
            return obj
        if id(obj) in self._memo:
            return self._memo[id(obj)]
        out: Any
        if isinstance(obj, torch.Tensor):
            out = self.tensor(obj)
        elif isinstance(obj, dict):
            out = copy.copy(obj)  # keeps the type and attributes (state_dict's _metadata)
            for k in out:
                out[k] = self.clone(out[k])
        elif isinstance(obj, list):
            out = [self.clone(v) for v in obj]
        elif isinstance(obj, tuple):
            items = [self.clone(v) for v in obj]
            out = type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
        else:
            out = copy.deepcopy(obj, self._memo)
        self._memo[id(obj)] = out
        return out

    def tensor(self, t: torch.Tensor) -> torch.Tensor:
        if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.layout != torch.strided:
            return t.detach().to("cpu", copy=True)  # sparse, quantized, subclasses: plain copy
        src = t.untyped_storage()
        key = (str(src.device), src.data_ptr())
        copied = self._storages.get(key)
        if copied is None:
            copied = torch.empty(src.nbytes(), dtype=torch.uint8).untyped_storage()
            copied.copy_(src)
            self._storages[key] = copied
        out = torch.empty(0, dtype=t.dtype).set_(copied, t.storage_offset(), t.size(), t.stride())
        if isinstance(t, torch.nn.Parameter):
            return torch.nn.Parameter(out, requires_grad=t.requires_grad)
        return out.requires_grad_(t.requires_grad) if t.requires_grad else out


class _Pipe:
    """One run of `torch.save(obj)` on its own thread into a bounded queue of pieces.

    torch.save's writes are copied into pieces of at most PIECE bytes (a 1 GB tensor does
    not become a 1 GB copy) outside the lock; the reader joins pieces into what it asked
    for, also outside the lock. Nothing is ever moved within a buffer: a bytearray that
    is appended at one end and cut at the other cost more than serializing (measured)."""

    def __init__(self, obj: Any, capacity: int) -> None:
        self._cond = threading.Condition()
        self._pieces: collections.deque[bytes] = collections.deque()
        self._head = 0  # bytes of the first piece already taken
        self._size = 0  # bytes queued and not taken
        self._capacity = capacity
        self._done = False
        self._abandoned = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(obj,), name="ckpt-torch-save", daemon=True
        )
        self._thread.start()

    def _run(self, obj: Any) -> None:
        try:
            torch.save(obj, cast(IO[bytes], _Sink(self._put)))
        except BaseException as e:  # handed to the reader, which raises it
            with self._cond:
                self._error = e
        finally:
            with self._cond:
                self._done = True
                self._cond.notify_all()

    def _put(self, data: Any) -> int:
        """torch.save's write(): its memoryview is valid only during the call, so copy it,
        waiting for room; a reader that gave up makes torch.save fail and end."""
        view = memoryview(data).cast("B")
        for start in range(0, len(view), PIECE):
            piece = bytes(view[start : start + PIECE])
            with self._cond:
                self._cond.wait_for(lambda: self._abandoned or self._size < self._capacity)
                if self._abandoned:
                    raise BrokenPipeError("the upload stopped reading")
                self._pieces.append(piece)
                self._size += len(piece)
                self._cond.notify_all()
        return len(view)

    def take(self, n: int) -> bytes:
        """Up to `n` bytes, fewer only at the end (or when `n` exceeds the capacity)."""
        parts: list[memoryview] = []
        with self._cond:
            self._cond.wait_for(lambda: self._done or self._size >= min(n, self._capacity))
            if self._error is not None:
                raise self._error
            got = 0
            while self._pieces and got < n:
                piece = self._pieces[0]
                k = min(len(piece) - self._head, n - got)
                parts.append(memoryview(piece)[self._head : self._head + k])
                got += k
                if self._head + k == len(piece):
                    self._pieces.popleft()
                    self._head = 0
                else:
                    self._head += k
            self._size -= got
            self._cond.notify_all()
        return b"".join(parts)

    def abandon(self) -> None:
        with self._cond:
            self._abandoned = True
            self._cond.notify_all()
        self._thread.join()


class _Sink:
    """The file object torch.save writes to."""

    def __init__(self, put: Any) -> None:
        self.write = put

    def flush(self) -> None:
        pass


class _TorchSaveStream(io.RawIOBase):
    """`torch.save(obj)`'s bytes as a readable stream, produced as they are read.
    `seek(0)` serializes again from the start (a retried upload re-reads its file)."""

    def __init__(self, obj: Any) -> None:
        super().__init__()
        self._obj = obj
        self._pipe: _Pipe | None = None
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if offset != 0 or whence not in (io.SEEK_SET, io.SEEK_CUR):
            raise io.UnsupportedOperation("a torch.save stream only seeks back to its start")
        if whence == io.SEEK_SET and self._pos:
            self._stop()
            self._pos = 0
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            return self.readall()
        if self._pipe is None:
            self._pipe = _Pipe(self._obj, STREAM_BUFFER)
        out = self._pipe.take(size)
        self._pos += len(out)
        return out

    def readall(self) -> bytes:
        parts = []
        while piece := self.read(STREAM_BUFFER):
            parts.append(piece)
        return b"".join(parts)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._stop()
        super().close()

    def _stop(self) -> None:
        if self._pipe is not None:
            self._pipe.abandon()
            self._pipe = None


# -- safetensors ------------------------------------------------------------------------
_SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    name: dtype
    for name, dtype in (
        ("F64", torch.float64),
        ("F32", torch.float32),
        ("F16", torch.float16),
        ("BF16", torch.bfloat16),
        ("I64", torch.int64),
        ("I32", torch.int32),
        ("I16", torch.int16),
        ("I8", torch.int8),
        ("U64", getattr(torch, "uint64", None)),
        ("U32", getattr(torch, "uint32", None)),
        ("U16", getattr(torch, "uint16", None)),
        ("U8", torch.uint8),
        ("BOOL", torch.bool),
        ("F8_E4M3", getattr(torch, "float8_e4m3fn", None)),
        ("F8_E5M2", getattr(torch, "float8_e5m2", None)),
        ("C64", torch.complex64),
    )
    if dtype is not None
}
_SAFETENSORS_NAMES = {dtype: name for name, dtype in _SAFETENSORS_DTYPES.items()}


@overload
def save_safetensors(
    client: VaultClient,
    namespace: str,
    tensors: Mapping[str, torch.Tensor],
    *,
    name: str = "model.safetensors",
    cut_at_tensors: bool = True,
    background: Literal[False] = False,
    **options: Unpack[SaveFields],
) -> Checkpoint: ...
@overload
def save_safetensors(
    client: VaultClient,
    namespace: str,
    tensors: Mapping[str, torch.Tensor],
    *,
    name: str = "model.safetensors",
    cut_at_tensors: bool = True,
    background: Literal[True],
    **options: Unpack[SaveFields],
) -> SaveHandle: ...
def save_safetensors(
    client: VaultClient,
    namespace: str,
    tensors: Mapping[str, torch.Tensor],
    *,
    name: str = "model.safetensors",
    cut_at_tensors: bool = True,
    background: bool = False,
    **options: Unpack[SaveFields],
) -> Checkpoint | SaveHandle:
    """`tensors` as a safetensors file `name` of a new checkpoint, streamed from the
    tensors' own memory. `cut_at_tensors`: every tensor starts a new chunk, so a changed
    tensor never drags its unchanged neighbours into new chunks (docs/integrations/torch.md
    has the measurements behind this default)."""
    if background:
        return client.submit(
            lambda: _upload_file(
                client.aio, namespace, name, snapshot(dict(tensors)), cut_at_tensors, options
            )
        )
    layout = safetensors_layout(tensors)
    upload = client.begin_upload(namespace, **options)
    cuts = layout.cuts if cut_at_tensors else ()
    regions = layout.regions if cut_at_tensors else []
    entry = client.send_file(upload, name, _as_file(layout.reader()), cuts=cuts, regions=regions)
    return client.commit(upload, {name: entry})


def load_safetensors(
    client: VaultClient,
    namespace: str,
    ref: str = "latest-valid",
    *,
    name: str = "model.safetensors",
    device: str | torch.device = "cpu",
) -> dict[str, torch.Tensor]:
    """The tensors of safetensors file `name`, each read by range straight into its own
    memory (any safetensors file: ours or one saved with the safetensors library)."""
    out: dict[str, torch.Tensor] = {}
    with client.open(namespace, ref, name) as f:
        size = int.from_bytes(_read_exact(f, 8), "little")
        header = json.loads(_read_exact(f, size))
        header.pop("__metadata__", None)
        for key, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            begin, end = info["data_offsets"]
            t = torch.empty(info["shape"], dtype=_SAFETENSORS_DTYPES[info["dtype"]])
            if t.numel() * t.element_size() != end - begin:
                raise IntegrityError(
                    f"{name}: tensor {key!r} has {end - begin} bytes for its shape"
                )
            f.seek(8 + size + begin)
            _read_into(f, tensor_bytes(t))
            out[key] = t.to(device)
    return out


async def _upload_file(
    aio: AsyncVaultClient,
    namespace: str,
    name: str,
    tensors: Mapping[str, torch.Tensor],
    cut_at_tensors: bool,
    options: SaveFields,
) -> Checkpoint:
    layout = await asyncio.to_thread(safetensors_layout, tensors)
    upload = await aio.begin_upload(namespace, **options)
    cuts = layout.cuts if cut_at_tensors else ()
    regions = layout.regions if cut_at_tensors else []
    entry = await aio.send_file(upload, name, _as_file(layout.reader()), cuts=cuts, regions=regions)
    return await aio.commit(upload, {name: entry})


class SafetensorsLayout:
    """A safetensors file laid out over tensors in memory: header, then each tensor's
    bytes (largest element size first, then by name, so every tensor is aligned)."""

    def __init__(self, header: bytes, tensors: dict[str, torch.Tensor]) -> None:
        self.header = header
        self.tensors = tensors  # contiguous CPU tensors in file order, alive with their views
        self.spans: dict[str, tuple[int, int]] = {}  # key -> (offset in the file, length)
        at = len(header)
        for key, t in tensors.items():
            self.spans[key] = (at, t.numel() * t.element_size())
            at += t.numel() * t.element_size()
        self.size = at
        self.cuts = sorted({len(header), *(start for start, _ in self.spans.values()), at})
        # Each tensor, for the profile's fixed tensor pieces (the file is a stream here,
        # so the client cannot read the layout back from it).
        self.regions = [(start, start + n) for start, n in self.spans.values() if n]

    def reader(self) -> Segments:
        parts = [tensor_bytes(t) for t in self.tensors.values()]
        return Segments([memoryview(self.header), *parts])


def safetensors_layout(tensors: Mapping[str, torch.Tensor]) -> SafetensorsLayout:
    """Lay `tensors` out as a safetensors file, without copying CPU contiguous ones."""
    ready = {k: t.detach().to("cpu").contiguous() for k, t in tensors.items()}
    order = sorted(ready, key=lambda k: (-ready[k].element_size(), k))
    entries: dict[str, Any] = {}
    at = 0
    for k in order:
        t = ready[k]
        if t.dtype not in _SAFETENSORS_NAMES:
            raise TypeError(f"tensor {k!r}: safetensors has no dtype {t.dtype}")
        end = at + t.numel() * t.element_size()
        entries[k] = {
            "dtype": _SAFETENSORS_NAMES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [at, end],
        }
        at = end
    header = json.dumps(entries, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)  # data starts 8-byte aligned
    prefix = len(header).to_bytes(8, "little")
    return SafetensorsLayout(prefix + header, {k: ready[k] for k in order})


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous CPU tensor's memory; keep `t` alive with it."""
    n = t.numel() * t.element_size()
    if n == 0:
        return memoryview(bytearray())
    if t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError("tensor_bytes needs a contiguous CPU tensor")
    return memoryview((ctypes.c_ubyte * n).from_address(t.data_ptr())).cast("B")


class Segments(SizedRawFile):
    """Several buffers read as one seekable file, without joining them."""

    def __init__(self, parts: list[memoryview]) -> None:
        kept = [p for p in parts if len(p)]
        super().__init__(sum(len(p) for p in kept))
        self._parts = kept
        self._starts = []
        at = 0
        for p in self._parts:
            self._starts.append(at)
            at += len(p)
        self._index = 0  # the part holding _pos (sequential reads never search)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._index = 0
        return super().seek(offset, whence)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        filled = 0
        while filled < len(view) and self._pos < self._size:
            while self._starts[self._index] + len(self._parts[self._index]) <= self._pos:
                self._index += 1
            part = self._parts[self._index]
            offset = self._pos - self._starts[self._index]
            n = min(len(view) - filled, len(part) - offset)
            view[filled : filled + n] = part[offset : offset + n]
            filled += n
            self._pos += n
        return filled

    def read(self, size: int | None = -1) -> bytes:
        n = self._size - self._pos if size is None or size < 0 else size
        buf = bytearray(max(0, min(n, self._size - self._pos)))
        got = self.readinto(buf)
        return bytes(buf[:got]) if got < len(buf) else bytes(buf)


def _as_file(stream: io.RawIOBase) -> IO[bytes]:
    """Our streams are binary file objects at run time; typeshed's io classes are not IO."""
    return cast(IO[bytes], stream)


def _read_exact(f: IO[bytes], n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise IntegrityError(f"file ended after {len(data)} of {n} bytes")
    return data


def _read_into(f: Any, view: memoryview) -> None:
    done = 0
    while done < len(view):
        got = f.readinto(view[done:])
        if not got:
            raise IntegrityError("file ended inside a tensor")
        done += got
