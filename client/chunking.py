"""What a save reads: the files to send (`Source`, from paths, bytes or file objects) and
the ids of the chunks cut from them. The cutting itself is `protocol.StreamChunker`,
the same code the server ingests with, so chunks dedup across producers."""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

import blake3

from checkpoint_vault.protocol import tensor_regions

FileSpec = str | os.PathLike[str] | bytes | bytearray | memoryview | IO[bytes]


def tensor_layout(source: Source, min_region: int) -> list[tuple[int, int]]:
    """Where the tensors lie in `source` (see protocol/_layout.py); [] when it is
    not a tensor file or cannot be read twice (a stream is cut with FastCDC throughout)."""
    if source.in_memory is not None:
        return tensor_regions(io.BytesIO(source.in_memory), source.size, min_region)
    if source.path is None:
        return []
    with open(source.path, "rb") as f:
        return tensor_regions(f, source.size, min_region)


def chunk_ids(chunks: list[memoryview]) -> list[bytes]:
    return [blake3.blake3(c).digest() for c in chunks]


class Reader(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class Source:
    """One file to save: its name in the checkpoint and how to read it (size -1: unknown)."""

    name: str
    size: int
    open: Callable[[], Reader]
    in_memory: bytes | None = None
    path: Path | None = None  # a file on disk: its layout can be read before it is sent


def collect_sources(files: FileSpec | Mapping[str, FileSpec]) -> list[Source]:
    """A directory path (every regular file under it, by relative path) or a mapping of
    name -> path | bytes | binary file object."""
    if isinstance(files, (str, os.PathLike)) and Path(files).is_dir():
        root = Path(files)
        return [
            _from_path(p.relative_to(root).as_posix(), p)
            for p in sorted(root.rglob("*"))
            if p.is_file()
        ]
    if not isinstance(files, Mapping):
        raise TypeError("files must be a directory path or a mapping of name -> file")
    return [_source(name, spec) for name, spec in files.items()]


def contents(sources: list[Source]) -> list[tuple[str, bytes]]:
    """Each source's name and bytes (a one-request save's files), reading those that are
    not in memory."""
    files = []
    for s in sources:
        if s.in_memory is not None:
            files.append((s.name, s.in_memory))
        else:
            reader = s.open()
            try:
                files.append((s.name, reader.read()))
            finally:
                reader.close()
    return files


def _source(name: str, spec: FileSpec) -> Source:
    if isinstance(spec, (bytes, bytearray, memoryview)):
        data = bytes(spec)
        return Source(name, len(data), lambda: _BytesReader(data), data)
    if isinstance(spec, (str, os.PathLike)):
        return _from_path(name, Path(spec))
    if hasattr(spec, "read"):
        f = spec
        start = f.tell() if f.seekable() else 0
        size = os.fstat(f.fileno()).st_size - start if _has_fileno(f) else -1

        def reopen() -> Reader:
            if f.seekable():
                f.seek(start)
            return _Borrowed(f)

        return Source(name, size, reopen)
    raise TypeError(f"file {name!r}: expected a path, bytes or a binary file object")


def _from_path(name: str, path: Path) -> Source:
    return Source(name, path.stat().st_size, lambda: open(path, "rb"), path=path)  # noqa: SIM115


def _has_fileno(f: IO[bytes]) -> bool:
    try:
        f.fileno()
    except (OSError, AttributeError, ValueError):
        return False
    return True


class _BytesReader:
    def __init__(self, data: bytes) -> None:
        self._view = memoryview(data)
        self._pos = 0

    def read(self, n: int = -1) -> bytes:
        end = len(self._view) if n < 0 else min(len(self._view), self._pos + n)
        out = bytes(self._view[self._pos : end])
        self._pos = end
        return out

    def close(self) -> None:
        pass


class _Borrowed:
    """A caller's file object: read it, never close it."""

    def __init__(self, f: IO[bytes]) -> None:
        self._f = f

    def read(self, n: int = -1) -> bytes:
        return self._f.read(n)

    def close(self) -> None:
        pass
