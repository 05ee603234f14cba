"""`vault://` for fsspec: checkpoints read as files by pandas, safetensors, torch and any
other fsspec user. Registered through the `fsspec.specs` entry point; needs only fsspec.

    with fsspec.open("vault://runs/exp1/latest-valid/model.safetensors") as f:
        tensors = safetensors.torch.load(f.read())

Paths are `<namespace>/<ref>/<file path>`. A namespace has up to 8 segments and a file path
any number, so the split is decided by two facts together: the ref segment reads as a ref
(`latest`, `latest-valid` or a 26-character checkpoint id) and the segments before it name
a namespace the server lists (`GET /v1/namespaces`). When several splits qualify, the
longest namespace wins; a path that is exactly a namespace is that namespace. The list is
cached per filesystem and fetched again when a path does not resolve, on
`ls(..., refresh=True)` and after `invalidate_cache()`.

A ref is resolved to its checkpoint id when a file is opened (the file's `path` names the
id) and once per `cat_file`/`cat_ranges` call: every byte of one open file comes from one
checkpoint, even while newer ones are committed.

Read only: whatever would write raises `PermissionError` (errno EROFS); save checkpoints
with `VaultClient.save`.
"""

from __future__ import annotations

import asyncio
import errno
import os
import re
import threading
import weakref
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NoReturn

from fsspec.spec import AbstractBufferedFile, AbstractFileSystem  # type: ignore[import-untyped]

from checkpoint_vault.protocol import FileInfo

from .errors import Forbidden, NotFound, Unauthorized
from .models import Checkpoint
from .sync import VaultClient

PROTOCOL = "vault"
MAX_NAMESPACE_SEGMENTS = 8  # the server's limit (docs/API.md, Conventions)
ALIASES = ("latest", "latest-valid")
_CHECKPOINT_ID = re.compile(r"[0-9A-HJKMNP-TV-Z]{26}")  # a ULID in Crockford base32
LIST_PAGE = 1000  # checkpoints per listing request: the server's largest page
# Bytes fetched past each read of an open file. torch.load and line readers make many
# small reads; 4 MiB keeps them to one request per 4 MiB at near full throughput (see
# docs/integrations/fsspec.md for the measurement).
BLOCK_SIZE = 4 << 20


@dataclass(frozen=True)
class TreeDir:
    """The root, or a path of namespace segments: a namespace or a prefix of some."""

    path: str
    is_namespace: bool


@dataclass(frozen=True)
class InCheckpoint:
    """A checkpoint (`name` empty), or a file or folder in one."""

    namespace: str
    ref: str
    name: str

    def path(self, name: str = "") -> str:
        """The fsspec path of `name` in this checkpoint, written with this `ref`."""
        root = f"{self.namespace}/{self.ref}"
        return f"{root}/{name}" if name else root


def is_ref(segment: str) -> bool:
    return segment in ALIASES or _CHECKPOINT_ID.fullmatch(segment) is not None


def split_path(path: str, namespaces: Collection[str]) -> TreeDir | InCheckpoint | None:
    """The reading of `path` with the longest namespace in `namespaces`; None if none fits.

    Longest wins because a namespace can only shadow another's ref by ending in a segment
    that reads as one (`team/latest`); checkpoint ids come from the server, so only a
    namespace deliberately named like a ref or an id can do that."""
    segments = path.split("/") if path else []
    found: TreeDir | InCheckpoint | None = None
    for i in range(1, min(len(segments), MAX_NAMESPACE_SEGMENTS) + 1):
        namespace = "/".join(segments[:i])
        if namespace not in namespaces:
            continue
        if i == len(segments):
            found = TreeDir(namespace, is_namespace=True)
        elif is_ref(segments[i]):
            found = InCheckpoint(namespace, segments[i], "/".join(segments[i + 1 :]))
    if found is not None:
        return found
    if not path or any(ns.startswith(path + "/") for ns in namespaces):
        return TreeDir(path, is_namespace=False)
    return None


@contextmanager
def _os_errors(path: str) -> Iterator[None]:
    """Client errors that have a filesystem meaning, as the OSErrors fsspec callers catch.

    Others (TransportError, Unavailable, ...) pass unchanged: an outage is not a missing
    file."""
    try:
        yield
    except NotFound as e:
        raise FileNotFoundError(errno.ENOENT, e.message, path) from e
    except (Unauthorized, Forbidden) as e:
        raise PermissionError(errno.EACCES, e.message, path) from e


def _read_only(path: Any) -> NoReturn:
    raise PermissionError(
        errno.EROFS, "vault:// is read-only; save checkpoints with VaultClient.save", path
    )


def _directory(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "size": 0, "type": "directory", **extra}


def _checkpoint_info(name: str, ckpt: Checkpoint) -> dict[str, Any]:
    state = ckpt.validity.state
    return _directory(name, checkpoint=ckpt.id, created_at=ckpt.created_at, validity=state)


def _file_info(name: str, ckpt: Checkpoint, meta: FileInfo) -> dict[str, Any]:
    """fsspec's info dict (its own shape, read by key by fsspec's callers)."""
    return {
        "name": name,
        "size": meta.size,
        "type": "file",
        "checkpoint": ckpt.id,
        "hash": meta.hash,
    }


def _close_client(client: VaultClient, pid: int) -> None:
    """Finalizer of a filesystem's client.

    In a forked child the client is an inert copy (VaultClient makes it so at fork):
    nothing to close. A finalizer may also run inside a garbage collection on an event
    loop's thread (the client's own among them), where waiting for the client's loop could
    wait for ever: close from a helper thread then."""
    if os.getpid() != pid:
        return
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        client.close()
        return
    threading.Thread(target=client.close, name="ckpt-client-close", daemon=True).start()


class VaultFileSystem(AbstractFileSystem):  # type: ignore[misc]  # fsspec has no type hints
    """Checkpoints of a Checkpoint Vault server as a read-only filesystem.

    Storage options: `endpoint_url` (default `$CKPT_URL`, else http://127.0.0.1:8470) and
    `token` (default `$CKPT_TOKEN`, else ./ckpt-data/admin.token), read when fsspec first
    makes the instance; fsspec then reuses it for the same options in the same thread.
    (Not `url`: `fsspec.core.url_to_fs(url, **options)` takes that name itself.)
    """

    protocol = PROTOCOL
    root_marker = ""
    blocksize = BLOCK_SIZE

    def __init__(
        self, endpoint_url: str | None = None, token: str | None = None, **storage_options: Any
    ) -> None:
        super().__init__(**storage_options)
        self.endpoint_url = endpoint_url
        self._token = token
        self._namespaces: frozenset[str] | None = None
        self._lock = threading.Lock()
        self._client: VaultClient | None = None
        self._client_pid = 0
        self._closer: weakref.finalize[[VaultClient, int], VaultFileSystem] | None = None

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = str(path)
        if path.startswith(PROTOCOL + "://"):
            path = path[len(PROTOCOL) + 3 :]
        return path.strip("/")

    # -- the client ---------------------------------------------------------------------
    @property
    def client(self) -> VaultClient:
        """This filesystem's client, made on first use, and again in a forked child."""
        with self._lock:
            pid = os.getpid()
            if self._client is None or self._client_pid != pid:
                client = VaultClient(self.endpoint_url, self._token, progress=False)
                self._client, self._client_pid = client, pid
                # fsspec keeps instances until clear_instance_cache(): close at exit then.
                self._closer = weakref.finalize(self, _close_client, client, pid)
            return self._client

    def close(self) -> None:
        """Close the client (connections and loop thread); a later call opens a new one."""
        with self._lock:
            if self._closer is not None:
                self._closer()
            self._client = self._closer = None

    # -- paths --------------------------------------------------------------------------
    def _locate(self, path: str, fresh: bool = False) -> TreeDir | InCheckpoint:
        path = self._strip_protocol(path)
        if self._namespaces is not None and not fresh:
            found = split_path(path, self._namespaces)
            if found is not None:
                return found
        with _os_errors(path):
            self._namespaces = frozenset(n.name for n in self.client.namespaces())
        found = split_path(path, self._namespaces)
        if found is None:
            raise FileNotFoundError(errno.ENOENT, "no readable namespace and ref in path", path)
        return found

    def _record(self, loc: InCheckpoint) -> Checkpoint:
        with _os_errors(loc.path()):
            return self.client.get(loc.namespace, loc.ref)

    def _file(self, path: str) -> tuple[InCheckpoint, Checkpoint]:
        """A stored file and its checkpoint, with the ref resolved now (the pin)."""
        loc = self._locate(path)
        if isinstance(loc, TreeDir):
            raise IsADirectoryError(errno.EISDIR, "not a file in a checkpoint", path)
        ckpt = self._record(loc)
        if self._info_in(loc, ckpt)["type"] != "file":  # raises FileNotFoundError if absent
            raise IsADirectoryError(errno.EISDIR, "a folder, not a file", path)
        return InCheckpoint(loc.namespace, ckpt.id, loc.name), ckpt

    def invalidate_cache(self, path: str | None = None) -> None:
        self._namespaces = None
        super().invalidate_cache(path)

    # -- reading ------------------------------------------------------------------------
    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        """Namespace segments, then a namespace's checkpoints (newest first; `latest` and
        `latest-valid` resolve but are not listed, so find/du count each file once), then
        the files and folders of a checkpoint. `refresh=True` fetches the namespace list
        again (fsspec's convention for cached listings)."""
        loc = self._locate(path, fresh=bool(kwargs.get("refresh")))
        if isinstance(loc, TreeDir):
            entries = self._ls_tree(loc)
        else:
            entries = self._ls_checkpoint(loc, self._record(loc))
        return entries if detail else [e["name"] for e in entries]

    def _ls_tree(self, loc: TreeDir) -> list[dict[str, Any]]:
        prefix = f"{loc.path}/" if loc.path else ""
        entries: dict[str, dict[str, Any]] = {}
        if loc.is_namespace:
            with _os_errors(loc.path):
                for ckpt in self._checkpoints(loc.path):
                    entries[prefix + ckpt.id] = _checkpoint_info(prefix + ckpt.id, ckpt)
        for ns in sorted(self._namespaces or ()):
            if ns.startswith(prefix) and ns != loc.path:
                name = prefix + ns[len(prefix) :].split("/", 1)[0]
                entries[name] = _directory(name)  # a namespace hides a same-named id
        return list(entries.values())

    def _checkpoints(self, namespace: str) -> list[Checkpoint]:
        out: list[Checkpoint] = []
        before: str | None = None
        while True:
            page = self.client.list(namespace, limit=LIST_PAGE, before=before)
            out += page
            if len(page) < LIST_PAGE:
                return out
            before = page[-1].id

    def _ls_checkpoint(self, loc: InCheckpoint, ckpt: Checkpoint) -> list[dict[str, Any]]:
        if loc.name in ckpt.files:
            return [_file_info(loc.path(loc.name), ckpt, ckpt.files[loc.name])]
        prefix = f"{loc.name}/" if loc.name else ""
        entries: dict[str, dict[str, Any]] = {}
        for stored, meta in sorted(ckpt.files.items()):
            if not stored.startswith(prefix):
                continue
            head, sep, _ = stored[len(prefix) :].partition("/")
            name = loc.path(prefix + head)
            if sep:
                entries.setdefault(name, _directory(name, checkpoint=ckpt.id))
            else:
                entries[name] = _file_info(name, ckpt, meta)
        if loc.name and not entries:
            raise FileNotFoundError(errno.ENOENT, f"not in checkpoint {ckpt.id}", loc.path())
        return list(entries.values())

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        loc = self._locate(path)
        if isinstance(loc, TreeDir):
            return _directory(loc.path)
        return self._info_in(loc, self._record(loc))

    def _info_in(self, loc: InCheckpoint, ckpt: Checkpoint) -> dict[str, Any]:
        if not loc.name:
            return _checkpoint_info(loc.path(), ckpt)
        if loc.name in ckpt.files:
            return _file_info(loc.path(loc.name), ckpt, ckpt.files[loc.name])
        if any(stored.startswith(loc.name + "/") for stored in ckpt.files):
            return _directory(loc.path(loc.name), checkpoint=ckpt.id)
        raise FileNotFoundError(errno.ENOENT, f"not in checkpoint {ckpt.id}", loc.path(loc.name))

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        """Bytes `start` to `end` (slice semantics: negative counts from the end)."""
        pinned, ckpt = self._file(path)
        return self._read_span(pinned, ckpt, start, end)

    def cat_ranges(
        self,
        paths: list[str],
        starts: int | None | list[int | None],
        ends: int | None | list[int | None],
        max_gap: int | None = None,
        on_error: str = "return",
        **kwargs: Any,
    ) -> list[bytes | Exception]:
        """Like fsspec's, but each path's ref is resolved once for the whole call."""
        starts = starts if isinstance(starts, list) else [starts] * len(paths)
        ends = ends if isinstance(ends, list) else [ends] * len(paths)
        if not len(paths) == len(starts) == len(ends):
            raise ValueError("paths, starts and ends differ in length")
        pins: dict[str, tuple[InCheckpoint, Checkpoint]] = {}
        out: list[bytes | Exception] = []
        for path, start, end in zip(paths, starts, ends, strict=True):
            try:
                if path not in pins:
                    pins[path] = self._file(path)
                out.append(self._read_span(*pins[path], start, end))
            except Exception as e:  # fsspec's contract: errors are returned in place
                if on_error != "return":
                    raise
                out.append(e)
        return out

    def _read_span(
        self, pinned: InCheckpoint, ckpt: Checkpoint, start: int | None, end: int | None
    ) -> bytes:
        span = range(ckpt.files[pinned.name].size)[start:end]
        return self._read(pinned, span.start, span.stop)

    def _read(self, pinned: InCheckpoint, start: int, end: int) -> bytes:
        """Bytes [start, end) of a file of a checkpoint named by id."""
        if end <= start:
            return b""
        with _os_errors(pinned.path(pinned.name)):
            return self.client.read_range(
                pinned.namespace, pinned.ref, pinned.name, start, end - start
            )

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: int | None = None,
        autocommit: bool = True,
        cache_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> VaultFile:
        if mode != "rb":
            _read_only(path)
        pinned, ckpt = self._file(path)
        return VaultFile(
            self,
            pinned,
            _file_info(pinned.path(pinned.name), ckpt, ckpt.files[pinned.name]),
            block_size=block_size or self.blocksize,
            cache_type=kwargs.get("cache_type", "readahead"),
            cache_options=cache_options,
        )

    # -- writing: refused ---------------------------------------------------------------
    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> NoReturn:
        _read_only(path)

    def makedirs(self, path: str, exist_ok: bool = False) -> NoReturn:
        _read_only(path)

    def rmdir(self, path: str) -> NoReturn:
        _read_only(path)

    def rm(self, path: Any, recursive: bool = False, maxdepth: int | None = None) -> NoReturn:
        _read_only(path)

    def rm_file(self, path: str) -> NoReturn:
        _read_only(path)

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> NoReturn:
        _read_only(path2)


class VaultFile(AbstractBufferedFile):  # type: ignore[misc]  # fsspec has no type hints
    """One stored file of one checkpoint, pinned by id, read through range requests."""

    def __init__(
        self,
        fs: VaultFileSystem,
        pinned: InCheckpoint,
        details: dict[str, Any],
        **kwargs: Any,
    ) -> None:
        self._pinned = pinned
        super().__init__(fs, details["name"], mode="rb", size=details["size"], **kwargs)
        self.details = details

    def _fetch_range(self, start: int, end: int) -> bytes:
        fs: VaultFileSystem = self.fs
        return fs._read(self._pinned, start, min(end, self.size))
