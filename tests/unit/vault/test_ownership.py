"""vault/ownership.py: files the server keeps are opened only if they are its own, and LMDB
is never let open a file through a symlink (issue 41). As root; "another user" is nobody."""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

import pytest

from checkpoint_vault.vault import UnsafePath
from checkpoint_vault.vault.env import Env
from checkpoint_vault.vault.ownership import check_ancestors, open_private, prepare_data_dir

NOBODY = 65534
CREATE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


def test_open_private_refuses_a_symlink_and_leaves_its_target(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"kept")
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(UnsafePath, match="is a symbolic link"):
        open_private(tmp_path / "link", CREATE)
    assert target.read_bytes() == b"kept"


@needs_root
def test_open_private_refuses_another_users_file_before_truncating(tmp_path: Path) -> None:
    theirs = tmp_path / "admin.token"
    theirs.write_bytes(b"theirs")
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(UnsafePath, match="belongs to nobody"):
        open_private(theirs, CREATE)
    assert theirs.read_bytes() == b"theirs"


def test_open_private_refuses_a_fifo_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    for flags in (CREATE, os.O_RDONLY):
        with pytest.raises(UnsafePath, match="is not a file"):
            open_private(tmp_path / "fifo", flags)


def test_open_private_makes_a_file_it_may_create_0600(tmp_path: Path) -> None:
    own = tmp_path / "ckpt-limits"
    own.write_bytes(b"old")
    os.chmod(own, 0o644)
    fd = open_private(own, CREATE)
    try:
        assert stat.S_IMODE(os.fstat(fd).st_mode) == 0o600
        assert os.fstat(fd).st_size == 0
        assert os.get_inheritable(fd) is False
    finally:
        os.close(fd)


def test_lmdb_never_opens_its_files_through_a_symlink(tmp_path: Path) -> None:
    """LMDB opens data.mdb and lock.mdb by path, following links and creating them."""
    outside = tmp_path / "outside"
    outside.write_bytes(b"")
    for name in ("data.mdb", "lock.mdb"):
        env_dir = tmp_path / name.replace(".", "-")
        env_dir.mkdir(mode=0o700)
        (env_dir / name).symlink_to(outside)
        with pytest.raises(UnsafePath, match=f"{name} is a symbolic link"):
            Env(env_dir).close()
        assert outside.read_bytes() == b""


@needs_root
def test_a_sticky_parent_others_can_write_is_accepted_and_a_plain_one_is_not(
    tmp_path: Path,
) -> None:
    """/tmp is 1777: only an entry's owner may rename it there, so a data dir under it is
    safe; without the sticky bit anyone could swap it."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    check_ancestors(shared / "data")
    os.chmod(shared, 0o777)
    with pytest.raises(UnsafePath, match="writable by others than its owner"):
        check_ancestors(shared / "data")


def test_prepare_makes_a_missing_data_dir_0700(tmp_path: Path) -> None:
    data = tmp_path / "a" / "data"
    prepare_data_dir(data)
    assert stat.S_IMODE(os.stat(data).st_mode) == 0o700


def test_prepare_follows_a_data_dir_symlink_of_its_own_and_checks_where_it_goes(
    tmp_path: Path,
) -> None:
    """A link made by the server's own user (or root) is an operator's choice and is
    followed; the place it names is checked like any data dir."""
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    prepare_data_dir(tmp_path / "link")
    os.chmod(real, 0o777)
    with pytest.raises(UnsafePath, match="writable by others than its owner"):
        prepare_data_dir(tmp_path / "link")


@needs_root
def test_group_write_passes_only_for_a_group_of_the_servers_user_alone(tmp_path: Path) -> None:
    """OpenSSH's rule: root's group has root alone here; nogroup is nobody's."""
    assert [u.pw_name for u in pwd.getpwall() if u.pw_gid == 0] == ["root"]
    data = tmp_path / "data"
    data.mkdir()
    os.chmod(data, 0o770)
    prepare_data_dir(data)
    data.chmod(0o770)
    os.chown(data, -1, NOBODY)
    with pytest.raises(UnsafePath, match="writable by others than its owner"):
        prepare_data_dir(data)
