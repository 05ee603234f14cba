"""A tier on a local (or mounted) filesystem: `file:///path`.

Objects are files under the root named by their key. A put writes a temporary file in the
same directory, fsyncs it, then links it into place (`link` fails if the name exists: the
conditional create) or renames it over the old one, and fsyncs the directory, so a crash
leaves the old object or the new one, never a torn file.
"""

from __future__ import annotations

import errno
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

from checkpoint_vault.vault.errors import ObjectExists, ObjectNotFound, TierError, TierUnavailable
from checkpoint_vault.vault.files import fsync_dir
from checkpoint_vault.vault.tier import check_key


class LocalTier:
    def __init__(self, root: str | Path, name: str = "local") -> None:
        self.name = name
        self._root = Path(root)
        self._root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self._root / check_key(key)

    def put(self, key: str, data: bytes | memoryview, *, if_absent: bool = False) -> None:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                if if_absent:
                    os.link(tmp, path)
                else:
                    os.replace(tmp, path)
            finally:
                tmp.unlink(missing_ok=True)
            fsync_dir(path.parent)
        except FileExistsError:
            raise ObjectExists(f"tier {self.name}: {key} exists") from None
        except OSError as e:
            raise self._translate(e, key) from e

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except OSError as e:
            raise self._translate(e, key) from e

    def get_range(self, key: str, start: int, length: int) -> bytes:
        try:
            with open(self._path(key), "rb") as f:
                return os.pread(f.fileno(), length, start)
        except OSError as e:
            raise self._translate(e, key) from e

    def head(self, key: str) -> int | None:
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError:
            return None
        except OSError as e:
            raise self._translate(e, key) from e

    def modified(self, key: str) -> float | None:
        try:
            return self._path(key).stat().st_mtime
        except FileNotFoundError:
            return None
        except OSError as e:
            raise self._translate(e, key) from e

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink(missing_ok=True)
        except OSError as e:
            raise self._translate(e, key) from e

    def list(self, prefix: str = "") -> Iterator[str]:
        for path in self._root.rglob("*"):
            if path.is_file() and not path.name.startswith("."):
                key = path.relative_to(self._root).as_posix()
                if key.startswith(prefix):
                    yield key

    def _translate(self, e: OSError, key: str) -> TierError:
        if isinstance(e, FileNotFoundError):
            return ObjectNotFound(f"tier {self.name}: no object {key}")
        if e.errno in (errno.EIO, errno.ENOTCONN, errno.ESTALE, errno.ETIMEDOUT, errno.ENOSPC):
            return TierUnavailable(f"tier {self.name}: {os.strerror(e.errno or 0)}")
        return TierError(f"tier {self.name}: {type(e).__name__} on {key}")
