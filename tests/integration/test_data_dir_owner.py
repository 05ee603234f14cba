"""A data dir, or an entry in it, that another local user made is refused (issue 41, the
fourth finding): in review such a user read the admin token written into their pre-made
file, truncated a root-owned file through a `ckpt-limits` symlink and swapped
`ckpt-engine.sock` for their own socket.

Each case runs a real `ckpt serve` and expects it to exit non-zero with one line on stderr
(no traceback), never answering, with nothing in the data dir created or changed. The tests
run as root; "another user" is `nobody` (uid 65534).
"""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ..serverproc import ServerProcess, free_port

NOBODY = 65534
START_BOUND = 60.0  # seconds a refused start may take at most (it takes well under one)
POLL = 0.05

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")

Listing = dict[str, tuple[int, int, int, int, int]]


def listing(root: Path) -> Listing:
    """Every entry under `root` (and `root`) as lstat shows it: a change to any of them,
    even a chmod (ctime), shows."""
    out: Listing = {}
    for path in [root, *root.rglob("*")]:
        st = os.lstat(path)
        key = str(path.relative_to(root))
        out[key] = (st.st_mode, st.st_uid, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return out


def _answers(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=0.5)
    try:
        conn.request("GET", "/v1/health")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def refused(data: Path, log: Path, workers: int = 1) -> str:
    """Run `ckpt serve --data data`; it must exit non-zero, without ever answering, having
    written one line to stderr, which is returned."""
    port = free_port()
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "checkpoint_vault.cli", "serve", "--data", str(data)),
                *("--port", str(port), "--workers", str(workers)),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={k: v for k, v in os.environ.items() if not k.startswith("CKPT_")},
        )
        try:
            for _ in range(int(START_BOUND / POLL)):
                try:
                    code = proc.wait(timeout=POLL)
                    break
                except subprocess.TimeoutExpired:
                    if _answers(port):
                        pytest.fail(f"served {data}, which is not its own")
            else:
                pytest.fail(f"neither refused nor served within {START_BOUND} s")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    text = log.read_text()
    assert code != 0, text
    assert "Traceback" not in text
    lines = text.splitlines()
    assert len(lines) == 1, text
    assert lines[0].startswith("ckpt serve: ")
    return lines[0]


@pytest.fixture
def served(tmp_path: Path) -> Path:
    """A data dir one server made and stopped."""
    server = ServerProcess(
        tmp_path / "data", free_port(), tmp_path / "server.log", local_socket=True
    )
    try:
        server.start()
        assert server.terminate() == 0
    finally:
        server.stop()
    return server.data_dir


def test_data_dir_another_user_made_is_refused(tmp_path: Path) -> None:
    """The reviewer's setup: an empty dir and an admin.token in it, both theirs."""
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    token = data / "admin.token"
    token.touch(mode=0o644)
    for path in (data, token):
        os.chown(path, NOBODY, NOBODY)
    before = listing(data)

    line = refused(data, tmp_path / "stderr")

    assert f"{data} belongs to nobody (uid {NOBODY})" in line
    assert listing(data) == before
    assert token.read_bytes() == b""  # no admin token for its owner to read


@pytest.mark.slow
@pytest.mark.parametrize(
    "entry", ["vault", "vault/catalog", "vault/catalog/data.mdb", "admin.token", "ckpt-limits"]
)
def test_an_entry_of_another_user_in_the_data_dir_is_refused(
    served: Path, tmp_path: Path, entry: str
) -> None:
    os.chown(served / entry, NOBODY, NOBODY)
    before = listing(served)

    line = refused(served, tmp_path / "stderr")

    assert f"{served / entry} belongs to nobody" in line
    assert listing(served) == before


@pytest.mark.slow
def test_a_limits_symlink_is_refused_and_its_target_untouched(served: Path, tmp_path: Path) -> None:
    """`ckpt-limits` is opened O_TRUNC and resized: through a link, another file is."""
    victim = tmp_path / "precious"
    victim.write_bytes(b"root's own data\n")
    os.chmod(victim, 0o600)
    (served / "ckpt-limits").unlink()
    (served / "ckpt-limits").symlink_to(victim)
    os.lchown(served / "ckpt-limits", NOBODY, NOBODY)
    before, victim_before = listing(served), os.stat(victim)

    line = refused(served, tmp_path / "stderr")

    assert f"{served / 'ckpt-limits'} is a symbolic link" in line
    assert listing(served) == before
    assert victim.read_bytes() == b"root's own data\n"
    assert os.stat(victim).st_mtime_ns == victim_before.st_mtime_ns


def test_an_engine_socket_another_user_bound_is_refused_not_unlinked(tmp_path: Path) -> None:
    """Workers forward requests, Authorization header and all, to `ckpt-engine.sock`."""
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    path = data / "ckpt-engine.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as theirs:
        theirs.bind(str(path))
        theirs.listen()
        os.chown(path, NOBODY, NOBODY)
        before = listing(data)

        line = refused(data, tmp_path / "stderr", workers=2)

        assert f"{path} belongs to nobody" in line
        assert listing(data) == before
        theirs.setblocking(False)
        with pytest.raises(BlockingIOError):  # nothing connected to it
            theirs.accept()


@pytest.mark.parametrize("mode", [0o770, 0o777, 0o702], ids=oct)
def test_a_data_dir_others_can_write_is_refused(tmp_path: Path, mode: int) -> None:
    """Its group is nogroup, whose member is nobody (a group with only the server's user
    in it may write, as OpenSSH allows: tests/unit/vault/test_ownership.py)."""
    data = tmp_path / "data"
    data.mkdir()
    os.chown(data, -1, NOBODY)
    os.chmod(data, mode)
    before = listing(data)

    line = refused(data, tmp_path / "stderr")

    assert f"{data} is writable by others than its owner" in line
    assert listing(data) == before


def test_a_data_dir_in_a_directory_another_user_owns_is_refused(tmp_path: Path) -> None:
    """Whoever owns the parent can rename the data dir away and put their own there."""
    parent = tmp_path / "theirs"
    parent.mkdir(mode=0o755)
    os.chown(parent, NOBODY, NOBODY)
    data = parent / "data"
    data.mkdir(mode=0o700)
    before = listing(parent)

    line = refused(data, tmp_path / "stderr")

    assert f"{parent} (a parent of {data}) belongs to nobody" in line
    assert listing(parent) == before


@pytest.mark.slow
def test_the_servers_own_data_dir_still_serves(served: Path, tmp_path: Path) -> None:
    """What the checks accept: a data dir of its own, made under umask 022 (0755, files
    0644), is tightened and served, its sockets from the last run bound afresh."""
    os.chmod(served, 0o755)
    os.chmod(served / "admin.token", 0o644)
    server = ServerProcess(served, free_port(), tmp_path / "again.log", workers=2)
    try:
        server.start()
        assert os.stat(served).st_mode & 0o777 == 0o700
        assert os.stat(served / "admin.token").st_mode & 0o777 == 0o600
    finally:
        server.stop()


def test_offline_check_refuses_a_vault_dir_of_another_user(served: Path, tmp_path: Path) -> None:
    """`ckpt check --data` opens the data dir itself and may repair it: the same rule."""
    os.chown(served / "vault", NOBODY, NOBODY)
    before = listing(served)
    done = subprocess.run(
        [sys.executable, "-m", "checkpoint_vault.cli", "check", "--data", str(served)],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("CKPT_")},
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        f"ckpt check: refusing data dir: {served / 'vault'} belongs to nobody (uid {NOBODY}), "
        "not to the server's user root (uid 0) (it and everything in it must belong to the "
        "server's user and be writable by no one else)"
    ]
    assert listing(served) == before
