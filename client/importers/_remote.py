"""A series read through fsspec (`s3://bucket/prefix`, `gs://...`, `memory://...`): the
source listed once, then walked with the few `pathlib.Path` operations the layout
scanners use, so every layout, problem check and the metadata read the same from a bucket
as from a disk.

One recursive listing (`fs.find`) answers every directory walk, size and modification
time: on S3 that is one paged LIST for the whole series instead of a request per entry.
Directories are the prefixes of the files listed (object stores have no empty ones).
Files are read only when a scanner or the save reads them, each opened by itself.

fsspec is imported only to open a URL. Local paths and `file://` URLs do not come here:
they stay `pathlib.Path`, with their nanosecond mtimes and the server's descriptor
hand-over.
"""

from __future__ import annotations

import fnmatch
import posixpath
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import PurePosixPath
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fsspec.spec import AbstractFileSystem  # type: ignore[import-untyped]

EXTRA = "checkpoint-vault[import]"
TIME_KEYS = ("mtime", "LastModified", "last_modified", "updated", "timeCreated", "created")


class RemoteSourceError(ValueError):
    """The URL cannot be listed: an unknown scheme, its package missing, no such prefix,
    refused credentials. `_series` turns it into `BadSource`."""


@dataclass(frozen=True)
class RemoteStat:
    st_size: int
    st_mtime_ns: int | None  # None: the backend's listing has no time for it


class Listing:
    """Every file under a root, with the directories their paths imply."""

    def __init__(self, fs: AbstractFileSystem, root: str, infos: Mapping[str, Any]) -> None:
        self.fs = fs
        self.root = root
        self.files: dict[str, RemoteStat] = {}
        self.children: dict[str, set[str]] = {}
        for name, info in infos.items():
            path = str(name).rstrip("/")
            if info.get("type", "file") != "file" or not path.startswith(root + "/"):
                continue  # a directory marker, or the root itself named as a file
            self.files[path] = RemoteStat(int(info.get("size") or 0), mtime_ns(info))
            child = path
            while child != root:
                parent = posixpath.dirname(child)
                self.children.setdefault(parent, set()).add(child)
                child = parent

    def url(self, path: str) -> str:
        return str(self.fs.unstrip_protocol(path))


class RemotePath:
    """A file or directory of a `Listing`: the `Path` methods the scanners call."""

    def __init__(self, listing: Listing, path: str) -> None:
        self.listing = listing
        self.path = path

    def __repr__(self) -> str:
        return f"RemotePath({self.listing.url(self.path)!r})"

    def __str__(self) -> str:
        return self.listing.url(self.path)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemotePath) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    def __lt__(self, other: RemotePath) -> bool:
        return self.path.split("/") < other.path.split("/")  # as Paths sort: part by part

    def __truediv__(self, name: str) -> RemotePath:
        return RemotePath(self.listing, f"{self.path}/{name}")

    @property
    def name(self) -> str:
        return posixpath.basename(self.path)

    @property
    def suffix(self) -> str:
        return PurePosixPath(self.name).suffix

    @property
    def parent(self) -> RemotePath:
        return RemotePath(self.listing, posixpath.dirname(self.path))

    def is_file(self) -> bool:
        return self.path in self.listing.files

    def is_dir(self) -> bool:
        return self.path in self.listing.children

    def iterdir(self) -> Iterator[RemotePath]:
        for child in sorted(self.listing.children.get(self.path, ())):
            yield RemotePath(self.listing, child)

    def glob(self, pattern: str) -> Iterator[RemotePath]:
        """Children whose name matches (the scanners glob one level only)."""
        return (p for p in self.iterdir() if fnmatch.fnmatchcase(p.name, pattern))

    def rglob(self, pattern: str) -> Iterator[RemotePath]:
        for child in self.iterdir():
            if fnmatch.fnmatchcase(child.name, pattern):
                yield child
            yield from child.rglob(pattern)

    def relative_to(self, other: RemotePath) -> PurePosixPath:
        return PurePosixPath(posixpath.relpath(self.path, other.path))

    def stat(self) -> RemoteStat:
        found = self.listing.files.get(self.path)
        if found is None:
            raise FileNotFoundError(2, "not in the source's listing", str(self))
        return found

    def open(self, mode: str = "rb") -> IO[bytes]:
        if mode != "rb":
            raise ValueError("a remote source is only read")
        f: IO[bytes] = self.listing.fs.open(self.path, "rb")
        return f

    def read_bytes(self) -> bytes:
        with self.open() as f:
            return f.read()

    def read_text(self) -> str:
        return self.read_bytes().decode()


def is_remote(source: str) -> bool:
    """A URL for fsspec: any scheme but `file://` (a local path)."""
    return "://" in source and not source.startswith("file://")


def open_remote(url: str, storage_options: Mapping[str, Any] | None = None) -> RemotePath:
    """The directory `url` names, listed whole. RemoteSourceError when it cannot be."""
    protocol = url.split("://", 1)[0]
    try:
        # Here, not at the top: reading a local series needs no fsspec.
        from fsspec.core import url_to_fs  # type: ignore[import-untyped]
    except ImportError:
        raise RemoteSourceError(
            f"{protocol}:// sources need fsspec: pip install '{EXTRA}'"
        ) from None
    try:
        fs, root = url_to_fs(url, **dict(storage_options or {}))
    except ImportError as e:
        raise RemoteSourceError(_missing(protocol, e)) from None
    except ValueError as e:
        raise RemoteSourceError(f"{url}: {e}") from None
    root = str(root).rstrip("/")
    try:
        infos = fs.find(root, detail=True)
    except Exception as e:  # noqa: BLE001 - each backend raises its own kinds (botocore's too)
        raise RemoteSourceError(f"{url}: cannot list ({type(e).__name__}: {e})") from None
    listing = Listing(fs, root, infos)
    if root not in listing.children:
        raise RemoteSourceError(f"{url}: not a directory (no files under it)")
    return RemotePath(listing, root)


def _missing(protocol: str, error: ImportError) -> str:
    from fsspec.registry import known_implementations  # type: ignore[import-untyped]

    if protocol in ("s3", "s3a"):
        return f"{protocol}:// sources need s3fs: pip install '{EXTRA}'"
    package = known_implementations.get(protocol, {}).get("err") or str(error)
    return f"{protocol}:// sources need another package: {package}"


def mtime_ns(info: Mapping[str, Any]) -> int | None:
    """A listing entry's modification time, whichever key and type its backend uses
    (S3's `LastModified` is a datetime to the second, memory's `created` a timestamp)."""
    for key in TIME_KEYS:
        value = info.get(key)
        if isinstance(value, str):
            try:
                value = datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                continue
        if isinstance(value, datetime):
            if value.tzinfo is None:
                value = value.replace(tzinfo=timezone.utc)
            epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
            return (value - epoch) // _ONE_US * 1000
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return int(value * 1_000_000_000)
    return None


_ONE_US = datetime(1970, 1, 1, 0, 0, 0, 1) - datetime(1970, 1, 1)
