"""Files handed to a server on the same machine by descriptor (client/local.py): the bytes
never travel, yet the checkpoint must be exactly what the HTTP path stores (same cuts, same
hashes), anything that is not a readable regular file must be refused with nothing stored,
and a client that cannot use the socket must fall back to sending."""

from __future__ import annotations

import json
import os
import socket
import struct
from pathlib import Path

import blake3

from checkpoint_vault.client import VaultClient
from checkpoint_vault.client import local as local_files
from checkpoint_vault.protocol import DESCRIPTOR_TYPE, ManifestFile

from ..serverproc import ServerProcess

MiB = 1 << 20

LOCAL_SOCKET = True  # the module's server (conftest) offers its local socket


def _safetensors(path: Path, sizes: list[int]) -> bytes:
    """A safetensors file of random float32 tensors of these byte sizes: its tensors are
    cut on their own (protocol/_layout.py), which both paths must do alike."""
    header, offset = {}, 0
    for i, n in enumerate(sizes):
        header[f"t{i}"] = {"dtype": "F32", "shape": [n // 4], "data_offsets": [offset, offset + n]}
        offset += n
    head = json.dumps(header).encode()
    data = struct.pack("<Q", len(head)) + head + os.urandom(offset)
    path.write_bytes(data)
    return data


def test_health_names_the_socket(vault: VaultClient, server: ServerProcess) -> None:
    health = vault.health().to_wire()
    assert health["local_socket"] == server.socket_path
    assert local_files.socket_of(health, 5) == server.socket_path
    assert local_files.socket_of({**health, "instance": "another-server"}, 5) is None
    assert local_files.socket_of({**health, "local_socket": "/nonexistent"}, 5) is None
    assert local_files.socket_of(["not", "an", "object"], 5) is None


def test_a_file_on_disk_is_handed_over_not_sent(
    vault: VaultClient, server: ServerProcess, tmp_path: Path
) -> None:
    data = _safetensors(tmp_path / "model.safetensors", [3 * MiB, 1000, 9 * MiB + 4, 2 * MiB])
    (tmp_path / "state.bin").write_bytes(b"x" * 100_000 + os.urandom(20 * MiB))
    before = server.handed_over()
    sent = vault.transfer.bytes_sent
    ckpt = vault.save(
        "l/handed",
        {"model.safetensors": tmp_path / "model.safetensors", "state.bin": tmp_path / "state.bin"},
    )
    assert vault.transfer.bytes_sent - sent < 64 << 10  # requests, not 35 MiB of files
    after = server.handed_over()
    assert after["files"] - before["files"] == 2
    assert after["bytes"] - before["bytes"] == len(data) + (tmp_path / "state.bin").stat().st_size
    assert ckpt.files["model.safetensors"].hash == blake3.blake3(data).hexdigest()
    assert ckpt.files["model.safetensors"].size == len(data)

    # The same files through HTTP: the same chunks (tensors cut alike), so they dedup.
    with VaultClient(server.url, server.token, progress=False, local_files=False) as http:
        sent = http.transfer.bytes_sent
        over_http = http.save(
            "l/sent",
            {
                "model.safetensors": tmp_path / "model.safetensors",
                "state.bin": tmp_path / "state.bin",
            },
        )
        assert http.transfer.bytes_sent - sent < 1 * MiB  # every chunk known: ids only
    handed = vault.manifest("l/handed", ckpt.id).files
    assert handed == http_manifest(vault, "l/sent", over_http.id)

    out = tmp_path / "out"
    vault.load("l/handed", ckpt.id, out)
    assert (out / "model.safetensors").read_bytes() == data
    assert (out / "state.bin").read_bytes() == (tmp_path / "state.bin").read_bytes()


def http_manifest(vault: VaultClient, ns: str, ref: str) -> dict[str, ManifestFile]:
    return vault.manifest(ns, ref).files


def test_bytes_in_memory_still_travel(vault: VaultClient, tmp_path: Path) -> None:
    (tmp_path / "big.bin").write_bytes(os.urandom(6 * MiB))
    in_memory = os.urandom(3 * MiB)
    sent = vault.transfer.bytes_sent
    ckpt = vault.save("l/mixed", {"big.bin": tmp_path / "big.bin", "mem.bin": in_memory})
    assert 3 * MiB <= vault.transfer.bytes_sent - sent < 4 * MiB  # only the bytes in memory
    out = tmp_path / "out"
    vault.load("l/mixed", ckpt.id, out)
    assert (out / "mem.bin").read_bytes() == in_memory
    assert (out / "big.bin").read_bytes() == (tmp_path / "big.bin").read_bytes()


def _hand(
    server: ServerProcess, vault: VaultClient, fd: int, token: str | None = None
) -> tuple[int, dict[str, object]]:
    """PUT one descriptor into a fresh upload, as the client does: (status, JSON answer)."""
    up = vault.begin_upload("l/raw")
    status, _, payload = local_files.hand_over(
        server.socket_path,
        f"/v1/uploads/{up.id}/files/f.bin",
        {"Authorization": f"Bearer {token or server.token}"},
        fd,
        0,
        10,
    )
    return status, json.loads(payload)


def test_what_is_not_a_readable_regular_file_is_refused(
    vault: VaultClient, server: ServerProcess, tmp_path: Path
) -> None:
    (tmp_path / "w.bin").write_bytes(b"secret")
    read_end, write_end = os.pipe()
    write_only = os.open(tmp_path / "w.bin", os.O_WRONLY)
    readable = os.open(tmp_path / "w.bin", os.O_RDONLY)
    try:
        for fd, token, status, says in (
            (read_end, None, 400, "regular file"),
            (write_only, None, 400, "not open for reading"),
            (readable, "not-a-token", 401, ""),  # refused before 100 Continue: never sent
            (readable, None, 201, '"size": 6'),
        ):
            got, answer = _hand(server, vault, fd, token)
            assert got == status, answer
            assert says in json.dumps(answer)
    finally:
        for fd in (read_end, write_end, write_only, readable):
            os.close(fd)


def test_a_body_without_exactly_one_descriptor_is_refused(
    vault: VaultClient, server: ServerProcess, tmp_path: Path
) -> None:
    up = vault.begin_upload("l/raw")
    (tmp_path / "a").write_bytes(b"a")
    fds = [os.open(tmp_path / "a", os.O_RDONLY) for _ in range(2)]
    try:
        for carried in ([], fds):
            with socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(10)
                sock.connect(server.socket_path)
                sock.sendall(
                    f"PUT /v1/uploads/{up.id}/files/f.bin HTTP/1.1\r\nHost: x\r\n"
                    f"Authorization: Bearer {server.token}\r\nContent-Type: {DESCRIPTOR_TYPE}\r\n"
                    "Content-Length: 1\r\nExpect: 100-continue\r\n\r\n".encode()
                )
                assert sock.recv(25) == b"HTTP/1.1 100 Continue\r\n\r\n"
                socket.send_fds(sock, [b"\0"], carried)
                answer = b""
                while chunk := sock.recv(65536):
                    answer += chunk
            assert answer.startswith(b"HTTP/1.1 400"), answer[:300]
            assert b"exactly one file descriptor" in answer
    finally:
        for fd in fds:
            os.close(fd)
    assert vault.health().status == "ok"


def test_a_client_that_cannot_reach_the_socket_sends(server: ServerProcess, tmp_path: Path) -> None:
    """The socket the server names is not there for this client (another machine behind a
    tunnel, another mount namespace): the save takes the HTTP path and still works."""
    (tmp_path / "f.bin").write_bytes(os.urandom(2 * MiB))
    sock = Path(server.socket_path)
    moved = sock.with_name("elsewhere.sock")
    sock.rename(moved)  # the server still listens on it, under another name
    try:
        with VaultClient(server.url, server.token, progress=False) as vault:
            sent = vault.transfer.bytes_sent
            ckpt = vault.save("l/fallback", {"f.bin": tmp_path / "f.bin"})
            assert vault.transfer.bytes_sent - sent >= 2 * MiB
            assert (
                ckpt.files["f.bin"].hash
                == blake3.blake3((tmp_path / "f.bin").read_bytes()).hexdigest()
            )
    finally:
        moved.rename(sock)
