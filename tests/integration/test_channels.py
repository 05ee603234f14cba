"""The writing process's inter-process sockets take only its own workers (issue 41).

`ckpt serve --workers 2` serves three sockets in the data dir to its workers: the engine
socket (forwarded HTTP requests, whose `X-Ckpt-Forwarded-For` it believes), the calls
socket (prepared saves) and the hand-over socket (client connections by descriptor). A
process of the server's own user that is not a worker (a producer's container with the
data dir mounted for `ckpt.sock`) used to get code run in the writing process by sending a
pickle on the calls socket, a forged caller address believed on the engine socket, and a
descriptor of its choosing served on the hand-over socket. Here such a process (a child of
the test, so neither the server nor a worker) tries each, and garbage: nothing runs, the
connection is closed before a byte is answered, and the server keeps serving.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint_vault.client import VaultClient

from ..serverproc import ServerProcess, free_port

pytestmark = pytest.mark.slow  # every test here takes over a second (the quick loop skips them)

SOCKETS = ("ckpt-engine.sock", "ckpt-calls.sock", "ckpt-handoff.sock")
FORGED = "203.0.113.77"  # TEST-NET-3: no caller of this test has that address

# The peer: run as `python -c _PEER attack socket marker token`; prints what the server
# answered on the socket before it closed ("" if nothing), as JSON.
_PEER = r"""
import array, json, pickle, socket, struct, sys

class Marker:
    def __init__(self, path):
        self.path = path
    def __reduce__(self):  # unpickling creates the marker file
        return (open, (self.path, "w"))

attack, path, marker, token = sys.argv[1:]
frame = pickle.dumps(Marker(marker))
frame = struct.pack(">IQ", len(frame), 1) + frame  # as the calls socket used to read them
garbage = b"\xff\x00" * 40 + b"\r\n\r\n"
body = json.dumps({"name": "forged", "scopes": ["read:x/*"]}).encode()
forged = (
    "POST /v1/admin/tokens HTTP/1.1\r\nHost: engine\r\nConnection: close\r\n"
    f"Authorization: Bearer {token}\r\nX-Ckpt-Forwarded-For: 203.0.113.77\r\n"
    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
).encode() + body
health = b"GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
handoff = path.endswith("handoff.sock")
sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET if handoff else socket.SOCK_STREAM)
sock.settimeout(20)
sock.connect(path)
payload = {"pickle": frame, "garbage": garbage, "forged": forged, "health": health}[attack]
try:
    if handoff and attack != "garbage":  # a descriptor to serve, with those bytes first
        mine, theirs = socket.socketpair()
        fds = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [theirs.fileno()]))]
        sock.sendmsg([payload], fds)
    else:
        sock.sendall(payload)
    answer = sock.recv(65536)
except (BrokenPipeError, ConnectionResetError):
    answer = b""
print(json.dumps(answer.decode("latin-1")))
"""


def _peer(server: ServerProcess, attack: str, name: str, marker: Path) -> str:
    """What a same-user process that is not a worker got back from socket `name`."""
    path = server.data_dir / name
    done = subprocess.run(
        [sys.executable, "-c", _PEER, attack, str(path), str(marker), server.token],
        capture_output=True,
        timeout=60,
        check=True,
    )
    answer: str = json.loads(done.stdout)
    return answer


@pytest.fixture
def two(tmp_path: Path) -> Iterator[ServerProcess]:
    """`--workers 2` with the local socket on: it is what producers' containers mount."""
    server = ServerProcess(
        tmp_path / "data", free_port(), tmp_path / "server.log", local_socket=True, workers=2
    )
    try:
        server.start()
        yield server
    finally:
        server.stop()


def _still_serves(server: ServerProcess) -> None:
    """A save through a worker (the calls socket) and a read of it still work."""
    data = os.urandom(3000)
    with VaultClient(server.url, server.token, local_files=False) as c:
        cp = c.save("after", {"state.bin": data})
        assert c.read_range("after", cp.id, "state.bin", 0, len(data)) == data


def test_the_inter_process_sockets_are_the_server_users_alone(two: ServerProcess) -> None:
    modes = {name: stat.S_IMODE(os.stat(two.data_dir / name).st_mode) for name in SOCKETS}
    assert modes == dict.fromkeys(SOCKETS, 0o600)
    assert stat.S_IMODE(os.stat(two.data_dir).st_mode) == 0o700  # and so ckpt.sock's


@pytest.mark.parametrize("attack", ["pickle", "garbage", "health"])
def test_a_process_not_a_worker_is_refused_on_each_socket(
    two: ServerProcess, tmp_path: Path, attack: str
) -> None:
    """A pickle that would create a file when loaded, bytes that are no frame, a
    descriptor to serve (on the engine and calls sockets: an HTTP request): closed, with
    nothing answered and nothing run."""
    marker = tmp_path / "ran"
    answers = {name: _peer(two, attack, name, marker) for name in SOCKETS}
    assert not marker.exists()
    assert answers == dict.fromkeys(SOCKETS, "")
    _still_serves(two)
    assert "not a worker of this server" in two.log_tail(200)


def test_a_forged_caller_address_is_not_believed(two: ServerProcess, tmp_path: Path) -> None:
    """An admin change with an admin token, naming another caller: refused on the engine
    socket, done on the local socket as the caller it is (neither the access log nor the
    audit log names the forged address)."""
    assert _peer(two, "forged", "ckpt-engine.sock", tmp_path / "ran") == ""
    answer = _peer(two, "forged", "ckpt.sock", tmp_path / "ran")
    assert answer.startswith("HTTP/1.1 201"), answer[:200]
    _still_serves(two)
    with VaultClient(two.url, two.token, local_files=False) as c:
        entries = c.audit()
        assert [t.name for t in c.tokens()].count("forged") == 1  # the local socket's
    assert any(e.target == "/v1/admin/tokens" for e in entries), entries
    assert FORGED not in two.log_path.read_text()
    assert FORGED not in repr(entries)
