"""A FUSE file system of one file whose reads are never answered, for tests of a hung mount.

Spoken straight to /dev/fuse (no library): mounted with mount(2) by this process (root, or
CAP_SYS_ADMIN), it answers the kernel's INIT, LOOKUP, GETATTR and OPEN, and keeps every READ
pending until `release()`, which fails them and every later one with EIO, as a file system
that came back broken would. A reader of `path` blocks in the kernel as it would on a FUSE
or network mount that stopped answering: a named pipe is no stand-in, the server refuses a
descriptor of anything but a regular file. `HungFile.mount` skips the test where the kernel
or the sandbox refuses the mount.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

NAME = "hung.bin"
_IN = struct.Struct("<IIQQIIII")  # fuse_in_header: len, opcode, unique, nodeid, uid, gid, pid, pad
_OUT = struct.Struct("<IiQ")  # fuse_out_header: len, error (negative errno), unique
_INIT, _LOOKUP, _GETATTR, _OPEN, _READ = 26, 1, 3, 14, 15
_NO_REPLY = frozenset({2, 36, 42})  # FORGET, INTERRUPT, BATCH_FORGET
_ROOT, _FILE = 1, 2
_MS_NOSUID, _MS_NODEV, _MNT_DETACH = 2, 4, 2


def _attr(ino: int, mode: int, size: int) -> bytes:
    """fuse_attr: ino, size, blocks, atime, mtime, ctime; their nsecs, mode, nlink, uid,
    gid, rdev, blksize, flags. Its blocks say the whole size is allocated (not sparse)."""
    return struct.pack(
        "<QQQQQQIIIIIIIIII", ino, size, size // 512, 0, 0, 0, 0, 0, 0, mode, 1, 0, 0, 0, 4096, 0
    )


class HungFile:
    def __init__(self, mountpoint: Path, size: int) -> None:
        self.mountpoint = mountpoint
        self.path = mountpoint / NAME
        self.size = size
        self.reads = 0  # READ requests seen
        self._fd = -1
        self._pending: list[int] = []
        self._released = False
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @classmethod
    @contextlib.contextmanager
    def mount(cls, mountpoint: Path, size: int) -> Iterator[HungFile]:
        mountpoint.mkdir(parents=True, exist_ok=True)
        fs = cls(mountpoint, size)
        try:
            fs._fd = os.open("/dev/fuse", os.O_RDWR)
        except OSError as e:
            pytest.skip(f"no FUSE here: /dev/fuse: {e.strerror}")
        libc = ctypes.CDLL(None, use_errno=True)
        opts = f"fd={fs._fd},rootmode=40000,user_id={os.getuid()},group_id={os.getgid()}"
        flags = _MS_NOSUID | _MS_NODEV
        if libc.mount(b"hungfs", bytes(mountpoint), b"fuse.hungfs", flags, opts.encode()) != 0:
            os.close(fs._fd)
            pytest.skip(f"cannot mount FUSE here: {os.strerror(ctypes.get_errno())}")
        fs._thread = threading.Thread(target=fs._serve, name="hungfs", daemon=True)
        fs._thread.start()
        try:
            yield fs
        finally:
            fs.release()
            libc.umount2(bytes(mountpoint), _MNT_DETACH)
            os.close(fs._fd)

    def release(self) -> None:
        """Fail every pending read, and all later ones, with EIO."""
        with self._lock:
            self._released = True
            pending, self._pending = self._pending, []
        for unique in pending:
            self._reply(unique, errno.EIO)

    def _reply(self, unique: int, error: int = 0, body: bytes = b"") -> None:
        with contextlib.suppress(OSError):  # the request was interrupted, or unmounted
            os.write(self._fd, _OUT.pack(_OUT.size + len(body), -error, unique) + body)

    def _serve(self) -> None:
        while True:
            try:
                request = os.read(self._fd, (1 << 20) + 4096)
            except OSError:  # unmounted
                return
            _, opcode, unique, node, *_ = _IN.unpack_from(request)
            self._answer(opcode, unique, node, request[_IN.size :])

    def _answer(self, opcode: int, unique: int, node: int, body: bytes) -> None:
        if opcode == _INIT:
            major, minor, readahead, _ = struct.unpack_from("<IIII", body)
            init = struct.pack(
                "<IIIIHHIIHHI", 7, min(minor, 31), readahead, 0, 16, 12, 1 << 17, 1, 0, 0, 0
            )
            self._reply(unique, 0, init + bytes(28))
        elif opcode == _LOOKUP:
            if body.split(b"\0")[0] != NAME.encode():
                self._reply(unique, errno.ENOENT)
                return
            entry = struct.pack("<QQQQII", _FILE, 0, 1, 1, 0, 0)  # nodeid, generation, timeouts
            self._reply(unique, 0, entry + _attr(_FILE, 0o100644, self.size))
        elif opcode == _GETATTR:
            attr = _attr(_ROOT, 0o40755, 0) if node == _ROOT else _attr(_FILE, 0o100644, self.size)
            self._reply(unique, 0, struct.pack("<QII", 1, 0, 0) + attr)
        elif opcode == _OPEN:
            self._reply(unique, 0, struct.pack("<QII", 1, 0, 0))  # fh, open flags
        elif opcode == _READ:
            with self._lock:
                self.reads += 1
                if not self._released:
                    self._pending.append(unique)
                    return
            self._reply(unique, errno.EIO)
        elif opcode not in _NO_REPLY:
            self._reply(unique, errno.ENOSYS)
