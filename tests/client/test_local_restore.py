"""Restoring into files handed to a server on the same machine (vault/deliver.py): the
server writes each file itself, so the bytes never cross the socket; what lands must be
exactly the stored file whatever its chunks' codecs, durable when the answer comes, and a
descriptor that cannot take it must be refused with the file left as it was."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint_vault.client import RetryPolicy, VaultClient, aio, restore
from checkpoint_vault.client import local as local_files
from checkpoint_vault.client.errors import IntegrityError
from checkpoint_vault.protocol import DESCRIPTOR_TYPE, FileInfo

from ..serverproc import ServerProcess, free_port

MiB = 1 << 20

LOCAL_SOCKET = True  # the module's server (conftest) offers its local socket


def test_a_load_on_this_machine_is_written_by_the_server(
    vault: VaultClient, server: ServerProcess, tmp_path: Path
) -> None:
    files = {
        "random.bin": os.urandom(9 * MiB + 17),  # raw frames: copied from the data file
        "text/log.txt": b"step 1 loss 0.25\n" * 400_000,  # zstd frames: decoded, written
        "mixed.bin": os.urandom(3 * MiB) + bytes(5 * MiB) + os.urandom(MiB),
        "empty": b"",
    }
    ckpt = vault.save("r/one", files)
    before = server.handed_over()
    received = vault.transfer.bytes_received
    out = tmp_path / "out"
    vault.load("r/one", ckpt.id, out)
    assert vault.transfer.bytes_received - received < 64 << 10  # answers, not 24 MiB
    for name, data in files.items():
        assert (out / name).read_bytes() == data, name
    assert not list(out.rglob("*.ckpt-part"))
    after = server.handed_over()
    assert after["restored_files"] - before["restored_files"] == len(files)
    assert after["restored_bytes"] - before["restored_bytes"] == sum(len(d) for d in files.values())

    # The HTTP path restores the same bytes (and is what a client elsewhere uses).
    with VaultClient(server.url, server.token, progress=False, local_files=False) as http:
        http.load("r/one", ckpt.id, tmp_path / "http")
    for name, data in files.items():
        assert (tmp_path / "http" / name).read_bytes() == data, name
    assert server.handed_over() == after


def _fetch_into(
    server: ServerProcess, target: str, fd: int, token: str | None = None
) -> tuple[int, dict[str, object]]:
    """GET `target` with the descriptor `fd` as the client sends it: (status, answer)."""
    status, _, payload = local_files.hand_over(
        server.socket_path,
        target,
        {"Authorization": f"Bearer {token or server.token}"},
        fd,
        0,
        10,
        method="GET",
    )
    return status, json.loads(payload)


def test_a_descriptor_that_cannot_take_the_file_is_refused(
    vault: VaultClient, server: ServerProcess, tmp_path: Path
) -> None:
    ckpt = vault.save("r/refused", {"f.bin": os.urandom(2 * MiB)})
    target = f"/v1/namespaces/r/refused/checkpoints/{ckpt.id}/files/f.bin"
    kept = tmp_path / "kept.bin"
    kept.write_bytes(b"left as it was")
    read_end, write_end = os.pipe()
    read_only = os.open(kept, os.O_RDONLY)
    appending = os.open(kept, os.O_WRONLY | os.O_APPEND)
    writable = os.open(kept, os.O_WRONLY)
    try:
        for fd, path, token, status, says in (
            (write_end, target, None, 400, "regular file"),
            (read_only, target, None, 400, "not open for writing"),
            (appending, target, None, 400, "open for appending"),
            (writable, target, "not-a-token", 401, ""),  # refused before 100 Continue
            (writable, target.replace("f.bin", "nope.bin"), None, 404, "no file"),
        ):
            got, answer = _fetch_into(server, path, fd, token)
            assert got == status, answer
            assert says in json.dumps(answer)
            assert kept.read_bytes() == b"left as it was"
    finally:
        for fd in (read_end, write_end, read_only, appending, writable):
            os.close(fd)


def test_the_file_ends_where_the_stored_one_ends(
    vault: VaultClient, server: ServerProcess, tmp_path: Path
) -> None:
    """A descriptor of a longer file, not emptied first, holds exactly the file after."""
    data = os.urandom(MiB + 3)
    ckpt = vault.save("r/longer", {"f.bin": data})
    out = tmp_path / "out.bin"
    out.write_bytes(os.urandom(3 * MiB))
    fd = os.open(out, os.O_RDWR)
    try:
        got, answer = _fetch_into(
            server, f"/v1/namespaces/r/longer/checkpoints/{ckpt.id}/files/f.bin", fd
        )
    finally:
        os.close(fd)
    assert got == 200, answer
    assert answer == {"size": len(data), "hash": ckpt.files["f.bin"].hash}
    assert out.read_bytes() == data


def test_a_range_or_tcp_is_refused(vault: VaultClient, server: ServerProcess) -> None:
    ckpt = vault.save("r/range", {"f.bin": b"abc"})
    target = f"/v1/namespaces/r/range/checkpoints/{ckpt.id}/files/f.bin"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(server.socket_path)
        answer = _ask_to_write(sock, server, target, "Range: bytes=0-1\r\n")
    assert answer.startswith(b"HTTP/1.1 400"), answer[:300]
    assert b"written whole" in answer
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as tcp:
        answer = _ask_to_write(tcp, server, target)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:300]
    assert b"only be handed over on the local socket" in answer


def test_a_refusal_before_100_closes_the_connection(
    vault: VaultClient, server: ServerProcess
) -> None:
    """The client waits for `100 Continue` before it sends the descriptor's byte, so a
    refusal leaves the body unsent: the server closes after answering instead of waiting
    for it (aiohttp would linger 10 s), whichever part of it refused (route, auth)."""
    ckpt = vault.save("r/closed", {"f.bin": b"abc"})
    missing = f"/v1/namespaces/r/closed/checkpoints/{ckpt.id}/files/nope.bin"
    for token, status in ((server.token, b"404"), ("not-a-token", b"401")):
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(server.socket_path)
            answer = _ask_to_write(sock, server, missing, token=token)
            assert answer.startswith(b"HTTP/1.1 " + status), answer[:300]
            assert sock.recv(1) == b""  # closed; a lingering server times this out


def _ask_to_write(
    sock: socket.socket, server: ServerProcess, target: str, more: str = "", token: str = ""
) -> bytes:
    """A descriptor GET of `target` (`more`: extra header lines) with no descriptor sent:
    the answer, which must come before one is asked for."""
    sock.sendall(
        f"GET {target} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token or server.token}\r\n"
        f"Content-Type: {DESCRIPTOR_TYPE}\r\nContent-Length: 1\r\n{more}"
        "Expect: 100-continue\r\n\r\n".encode()
    )
    return _read_all(sock)


def _read_all(sock: socket.socket) -> bytes:
    """One answer, head and body (the server need not close: the one-byte body it was
    promised never came)."""
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += sock.recv(65536)
    head, _, body = answer.partition(b"\r\n\r\n")
    length = int(re.search(rb"Content-Length: (\d+)", head, re.I).group(1))  # type: ignore[union-attr]
    while len(body) < length:
        body += sock.recv(65536)
    return answer


@contextlib.contextmanager
def _socket_server(path: str, answer: bytes) -> Iterator[None]:
    """A server on the socket at `path` that takes one descriptor request, answers `100
    Continue`, reads the descriptor's byte and then sends `answer` (and reads what comes)."""
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(1)

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(4096)
            conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            assert conn.recv(1) == b"\0"  # the body, its descriptor dropped (plain recv)
            conn.sendall(answer)
            with contextlib.suppress(ConnectionResetError):  # it hangs up on an unread body
                while conn.recv(65536):
                    pass

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        yield
    finally:
        thread.join(10)
        listener.close()


# A server from before restores by descriptor sends the file as any GET after `100`.
_BYTES_INSTEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
    b"Content-Length: 1073741824\r\n\r\n" + bytes(65536)
)


def test_a_server_that_sends_the_bytes_instead_is_told_apart(tmp_path: Path) -> None:
    """A server from before restores by descriptor answers `100 Continue` and then sends
    the file as any GET: the client must not read it as an answer (it falls back to
    HTTP), and must not take a multi-gigabyte body into memory to find out."""
    path = str(tmp_path / "old.sock")
    (tmp_path / "into").write_bytes(b"")
    with _socket_server(path, _BYTES_INSTEAD), pytest.raises(local_files.Unsupported):
        local_files.hand_over_file(
            path, "/v1/x/files/f", {}, tmp_path / "into", 10, restore_size=1 << 30
        )
    assert (tmp_path / "into").read_bytes() == b""


def test_ckpt_pull_here_starts_no_client(server: ServerProcess, tmp_path: Path) -> None:
    """`ckpt pull` from a server on this machine has it write the files without starting
    the event loop and the client (client/restore.py): the same bytes, no part file."""
    files = {"model.bin": os.urandom(6 * MiB + 5), "opt/state.bin": b"adam " * 300_000}
    with VaultClient(server.url, server.token, progress=False) as vault:
        ckpt = vault.save("r/pull", files)
    before = server.handed_over()
    out = tmp_path / "out"
    script = (
        "import json, sys\n"
        "from cli import main\n"
        "code = main(sys.argv[1:])\n"
        "started = [m for m in ('asyncio', 'client.aio', 'client.transport') if m in sys.modules]\n"
        "print(json.dumps({'code': code, 'started': started}))\n"
    )
    env = {**os.environ, "CKPT_URL": server.url, "CKPT_TOKEN": server.token}
    args = ["pull", "r/pull", "latest", str(out), "--json"]
    done = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    *printed, outcome = done.stdout.strip().splitlines()
    assert json.loads(outcome) == {"code": 0, "started": []}
    assert json.loads("\n".join(printed))["id"] == ckpt.id
    for name, data in files.items():
        assert (out / name).read_bytes() == data, name
    assert not list(out.rglob("*.ckpt-part"))
    after = server.handed_over()
    assert after["restored_files"] - before["restored_files"] == len(files)


def test_ckpt_pull_leaves_what_it_cannot_do_here_to_the_client(
    server: ServerProcess, tmp_path: Path
) -> None:
    """A ref that does not exist or a token refused: the client's answer, as everywhere."""
    env = {**os.environ, "CKPT_URL": server.url, "CKPT_TOKEN": server.token}
    cmd = [
        sys.executable,
        "-m",
        "checkpoint_vault.cli",
        "pull",
        "r/none",
        "01M8CVVY3DXSMGQPMK2Q6TXPVP",
    ]
    missing = subprocess.run(
        [*cmd, str(tmp_path / "a")], capture_output=True, text=True, env=env, timeout=60
    )
    assert missing.returncode == 1
    assert missing.stderr.startswith("ckpt pull: ")
    assert "does not exist" in missing.stderr
    refused = subprocess.run(
        [*cmd, str(tmp_path / "b")],
        capture_output=True,
        text=True,
        env={**env, "CKPT_TOKEN": "not-a-token"},
        timeout=60,
    )
    assert refused.returncode == 1
    assert "ckpt pull: " in refused.stderr
    assert not (tmp_path / "a").exists()
    assert not (tmp_path / "b").exists()


def test_a_restore_here_that_cannot_be_done_leaves_nothing(tmp_path: Path) -> None:
    """The lean pull gives up on a server that sends bytes (the client takes over) and
    refuses a file the server says it wrote otherwise than asked: no part file either way."""
    info = FileInfo(10, "ab" * 32)
    path = str(tmp_path / "s.sock")
    with _socket_server(path, _BYTES_INSTEAD):
        assert not restore._restore(path, "/v1/x/files/f", {}, tmp_path / "old", info, 10)
    assert list(tmp_path.iterdir()) == [tmp_path / "s.sock"]
    os.unlink(path)
    other = b'{"size": 10, "hash": "' + b"cd" * 32 + b'"}'
    wrong = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    with _socket_server(path, wrong % len(other) + other), pytest.raises(IntegrityError):
        restore._restore(path, "/v1/x/files/f", {}, tmp_path / "new", info, 10)
    assert list(tmp_path.iterdir()) == [tmp_path / "s.sock"]


def test_a_shown_progress_bar_follows_the_file_being_written(tmp_path: Path) -> None:
    """The bytes cross no socket here, so the bar moves with the file's size as the server
    writes it (polled), not only at the end of a file that may take minutes."""

    class Bar:
        shown = True

        def __init__(self) -> None:
            self.total = 0
            self.reached = asyncio.Event()

        def update(self, n: int) -> None:
            self.total += n
            if self.total >= 3 * MiB:
                self.reached.set()

    async def scenario() -> int:
        path = tmp_path / "growing.ckpt-part"
        path.write_bytes(b"")
        bar = Bar()
        growth = aio._Growth(path, bar)  # type: ignore[arg-type]
        with path.open("ab") as f:
            for _ in range(3):
                f.write(os.urandom(MiB))
                f.flush()
        await asyncio.wait_for(bar.reached.wait(), 10)
        await growth.stop()
        assert growth.shown == bar.total
        return bar.total

    assert asyncio.run(scenario()) == 3 * MiB


def test_a_load_with_a_progress_bar_restores_the_same_bytes(
    server: ServerProcess, tmp_path: Path
) -> None:
    data = os.urandom(5 * MiB)
    with VaultClient(server.url, server.token, progress=True) as vault:
        ckpt = vault.save("r/bar", {"f.bin": data})
        vault.load("r/bar", ckpt.id, tmp_path / "out")
    assert (tmp_path / "out" / "f.bin").read_bytes() == data


def test_a_long_hand_over_leaves_the_workers_to_other_requests(tmp_path: Path) -> None:
    """A file handed over takes a thread for as long as it is read: on the one worker of
    this server every other request would wait for it. A sparse 256 GiB file reads for
    minutes; the server must answer meanwhile, and stop the read when it stops."""
    config = tmp_path / "ckpt.toml"
    config.write_text("[server]\nworker_threads = 1\n")
    proc = ServerProcess(
        tmp_path / "data", free_port(), tmp_path / "server.log", config, local_socket=True
    )
    proc.start()
    try:
        sparse = tmp_path / "huge.bin"
        with sparse.open("wb") as f:
            f.truncate(256 << 30)
        # Answers come in milliseconds; a worker held by the read would hold them for minutes.
        patient = RetryPolicy(attempts=1)
        with VaultClient(proc.url, proc.token, progress=False, timeout=20, retry=patient) as vault:
            up = vault.begin_upload("r/busy")
            handing = threading.Thread(
                target=_quietly_hand,
                args=(proc, f"/v1/uploads/{up.id}/files/huge.bin", sparse),
                daemon=True,
            )
            handing.start()
            for _ in range(400):  # bounded: until the server holds the file open
                if proc.holds_open(sparse):
                    break
                handing.join(0.025)
            else:
                raise AssertionError("the server never opened the file handed over")
            ckpt = vault.save("r/busy-too", {"f.bin": b"still served"})  # needs a worker
            assert vault.get("r/busy-too", ckpt.id).id == ckpt.id
            assert proc.holds_open(sparse)  # the long read is still going
    finally:
        assert proc.terminate() == 0
    handing.join(30)
    assert not handing.is_alive()


def _quietly_hand(proc: ServerProcess, target: str, path: Path) -> None:
    with contextlib.suppress(Exception):  # ends with the server's shutdown
        local_files.hand_over_file(
            proc.socket_path, target, {"Authorization": f"Bearer {proc.token}"}, path, 60
        )
