"""Whose files the server uses: only its own user's, checked as OpenSSH's StrictModes does.

The data dir holds the admin token, the catalog and frames, the rate limits every process
maps, and the sockets the service's processes connect to one another through. A directory
another local user made beforehand, or an entry they left in one, hands them all of that:
in review such a user read the admin token written into their pre-made file, truncated a
root-owned file through a `ckpt-limits` symlink, and swapped `ckpt-engine.sock` for their
own socket, which then received an admin's Authorization header (issue 41).

So before the server writes anything there (`prepare_data_dir`, the first thing `ckpt
serve` does):
- the data dir and everything under it must belong to the server's effective uid, must not
  be writable by others than it and must not be a symlink; files, directories and sockets
  only (a FIFO or device is refused too). Group-writable passes only where the server's
  user is the group's one member, as OpenSSH allows (`_only_ours`);
- its ancestors must belong to root or to that uid and must not be writable by others
  unless sticky (/tmp): whoever can rename entries in a parent can move the data dir away
  and put their own in its place;
- anything else is refused with `UnsafePath`, naming the entry, before anything is created
  or changed. Modes that are only too open to read (a data dir made under umask 022) are
  tightened to 0700 / 0600 afterwards, as they always were (`make_private`).

Past that check no other user can add, remove or swap an entry of the data dir, so what the
server opens later is what was checked. Files are opened with O_NOFOLLOW and their owner
checked on the open descriptor anyway (`open_private`), and LMDB's own files are looked at
before LMDB opens them (`check_entry`): a check that cannot be raced is cheap where it can
be had.
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import stat
from collections.abc import Iterable
from pathlib import Path

from .errors import UnsafePath

_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFREG: "a file", stat.S_IFSOCK: "a socket"}


def _who(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _only_ours(gid: int) -> bool:
    """Whether the server's user is the only member of group `gid` (by the group and user
    databases): OpenSSH's rule for a group-writable file (misc.c, `secure_permissions`),
    which lets user-private groups (umask 002) and a Kubernetes fsGroup naming the
    server's own group pass, and no group with anyone else in it."""
    me = os.geteuid()
    try:
        group, name = grp.getgrgid(gid), pwd.getpwuid(me).pw_name
    except KeyError:
        return False
    primary = [user.pw_uid for user in pwd.getpwall() if user.pw_gid == gid]
    if any(uid != me for uid in primary) or group.gr_mem not in ([], [name]):
        return False
    return bool(primary or group.gr_mem)


def _writable_by_others(st: os.stat_result) -> bool:
    if st.st_mode & stat.S_IWOTH:
        return True
    return bool(st.st_mode & stat.S_IWGRP) and not _only_ours(st.st_gid)


def refusal(path: Path | str, st: os.stat_result, kind: int | None = None) -> str | None:
    """Why the entry at `path` (`st` from lstat or fstat) is not the server's own, or None.
    `kind`: the file type it must be (stat.S_IFREG, ...); None: any of file, directory or
    socket."""
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        return f"{path} is a symbolic link"
    if st.st_uid != os.geteuid():
        return f"{path} belongs to {_who(st.st_uid)}, not to the server's user {_who(os.geteuid())}"
    if stat.S_IFMT(mode) not in (_KINDS if kind is None else (kind,)):
        wanted = "a file, directory or socket" if kind is None else _KINDS[kind]
        return f"{path} is not {wanted}"
    if _writable_by_others(st):
        return f"{path} is writable by others than its owner ({stat.filemode(mode)})"
    return None


def check_entry(path: Path, kind: int | None = None) -> None:
    """Refuse an existing entry at `path` that is not the server's own (`refusal`); an
    absent one is fine (the server will create it). For LMDB's files before LMDB opens
    them, and for socket paths before binding (an entry that is not ours is refused, never
    unlinked)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    problem = refusal(path, st, kind)
    if problem is not None:
        raise UnsafePath(problem)


def check_ancestors(path: Path) -> None:
    """Refuse a data dir (or backup dir) whose parents someone else could rename entries
    in: each must belong to root or to the server's user and not be writable by group or
    others unless sticky. Both the path as given and as resolved are walked; a symlink on
    the way must belong to root or the server's user (only they, or the owner of the
    directory it is in, checked too, can change where it points)."""
    ours = os.geteuid()
    seen: set[Path] = set()
    for parent in (*path.absolute().parents, *path.resolve().parents):
        if parent in seen:
            continue
        seen.add(parent)
        try:
            st = os.lstat(parent)
        except FileNotFoundError:  # made by prepare_data_dir, then looked at again
            continue
        if st.st_uid not in (0, ours):
            raise UnsafePath(
                f"{parent} (a parent of {path}) belongs to {_who(st.st_uid)}, "
                f"neither to root nor to the server's user {_who(ours)}"
            )
        sticky = st.st_mode & stat.S_ISVTX
        if stat.S_ISDIR(st.st_mode) and _writable_by_others(st) and not sticky:
            raise UnsafePath(
                f"{parent} (a parent of {path}) is writable by others than its owner "
                f"({stat.filemode(st.st_mode)})"
            )


def check_tree(root: Path) -> None:
    """Refuse `root` or any entry under it that is not the server's own (`refusal`);
    entries are looked at, never followed."""
    pending = [root]
    while pending:
        directory = pending.pop()
        problem = refusal(directory, os.lstat(directory), stat.S_IFDIR)
        if problem is not None:
            raise UnsafePath(problem)
        with os.scandir(directory) as entries:
            for entry in entries:
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode) and not stat.S_ISLNK(st.st_mode):
                    pending.append(Path(entry.path))
                    continue
                problem = refusal(entry.path, st)
                if problem is not None:
                    raise UnsafePath(problem)


def make_private(path: Path) -> None:
    """Directory `path` 0700 and the regular files directly in it 0600, whatever the umask.

    LMDB holds plaintext frames and the catalog (file names, metadata, token hashes); under
    the common umask 022 the data dir was 0755 and its files 0644, so any local user could
    grep stored content. Applied at every open, so existing data dirs are tightened too.
    Only what is the server's own is changed: anything else is refused (`refusal`) first,
    so a chmod never reaches another user's file.
    """
    problem = refusal(path, os.lstat(path), stat.S_IFDIR)
    if problem is not None:
        raise UnsafePath(problem)
    files: list[str] = []
    with os.scandir(path) as entries:
        for entry in entries:
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                continue
            problem = refusal(entry.path, st)
            if problem is not None:
                raise UnsafePath(problem)
            if stat.S_ISREG(st.st_mode):
                files.append(entry.path)
    os.chmod(path, 0o700)
    for file in files:
        os.chmod(file, 0o600)


def prepare_data_dir(path: Path, sockets: Iterable[Path] = ()) -> None:
    """Make the data dir (0700) if it does not exist, refuse it unless it and everything in
    it are the server's own (module docstring), then tighten what is only too readable.
    `sockets`: paths the server will bind, where only a socket of ours may be (an earlier
    run's, bound afresh). Nothing is created or changed when it is refused; the error is
    one line, naming the entry and what the data dir must be."""
    try:
        _prepare(path, sockets)
    except UnsafePath as e:
        raise UnsafePath(
            f"refusing data dir: {e} (it and everything in it must belong to the server's "
            "user and be writable by no one else)"
        ) from None


def _prepare(path: Path, sockets: Iterable[Path]) -> None:
    check_ancestors(path)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:  # its parents too (under the umask), then looked at again
        path.mkdir(mode=0o700, parents=True)
        check_ancestors(path)
    root = _followed(path)
    check_tree(root)
    for socket in sockets:
        check_entry(socket, stat.S_IFSOCK)
    make_private(root)


def _followed(path: Path) -> Path:
    """Where the data dir is: a symlink to it (an operator's choice) is followed if root or
    the server's user made it (only they, or the owner of its directory, checked too, can
    point it elsewhere)."""
    st = os.lstat(path)
    if not stat.S_ISLNK(st.st_mode):
        return path
    if st.st_uid not in (0, os.geteuid()):
        raise UnsafePath(f"{path} is a symbolic link belonging to {_who(st.st_uid)}")
    real = path.resolve()
    if not real.is_dir():
        raise UnsafePath(f"{path} is a symbolic link to {real}, which is not a directory")
    return real


def open_private(path: Path, flags: int, mode: int = 0o600) -> int:
    """`os.open` for a file the server keeps: never through a symlink (O_NOFOLLOW), not
    inherited by the children it starts (O_CLOEXEC), and only a regular file of the
    server's user that group and others cannot write, checked on the open descriptor.
    O_TRUNC is applied after the check, so a file that is not ours is refused intact; a
    file this call may create gets `mode` (0600) whatever it had.

    O_NONBLOCK keeps a FIFO where a file should be from blocking the open (it is refused
    like any other non-file; on regular files the flag does nothing)."""
    truncate = flags & os.O_TRUNC
    opened = (flags & ~os.O_TRUNC) | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, opened, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafePath(f"{path} is a symbolic link") from None
        if e.errno == errno.ENXIO:  # a FIFO nobody reads, opened to write
            raise UnsafePath(f"{path} is not a file") from None
        raise
    try:
        st = os.fstat(fd)
        problem = refusal(path, st, stat.S_IFREG)
        if problem is not None:
            raise UnsafePath(problem)
        if flags & os.O_CREAT and stat.S_IMODE(st.st_mode) != mode:
            os.fchmod(fd, mode)
        if truncate:
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd
