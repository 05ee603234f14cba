"""HTTPS and client certificates in the service itself (issue 16), with a private CA.

One real `ckpt serve --tls-cert --tls-key --tls-client-ca` process: a client that trusts
the CA and presents a certificate it signed gets through; one that does not trust the
server's CA, or presents no certificate, is refused at the handshake, before any token is
sent. trustme makes the CAs (in memory; the files are written for the server).
"""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from checkpoint_vault.client import VaultClient
from checkpoint_vault.client.errors import ClientError
from checkpoint_vault.client.transport import RetryPolicy

from ..serverproc import ServerProcess, free_port

ONCE = RetryPolicy(attempts=1)


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    root = tmp_path_factory.mktemp("tls")
    ca, client_ca = trustme.CA(), trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_and_cert_chain_pem.write_to_path(str(root / "server.pem"))
    (root / "server.pem").chmod(0o600)  # a key others may read is refused
    ca.cert_pem.write_to_path(str(root / "ca.pem"))
    client_ca.cert_pem.write_to_path(str(root / "client-ca.pem"))
    client_ca.issue_cert("producer@example.com").private_key_and_cert_chain_pem.write_to_path(
        str(root / "client.pem")
    )
    probe = ssl.create_default_context(cafile=str(root / "ca.pem"))
    probe.load_cert_chain(str(root / "client.pem"))
    args = ("--tls-cert", str(root / "server.pem"), "--tls-key", str(root / "server.pem"))
    args += ("--tls-client-ca", str(root / "client-ca.pem"))
    proc = ServerProcess(root / "data", free_port(), root / "server.log", None, args, probe)
    try:
        proc.start()
        yield proc, root
    finally:
        proc.stop()


def test_https_with_a_private_ca_and_client_certificates(
    tls_server: tuple[ServerProcess, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    server, root = tls_server
    assert server.url.startswith("https://")
    monkeypatch.setenv("CKPT_CA_FILE", str(root / "ca.pem"))
    monkeypatch.setenv("CKPT_CLIENT_CERT", str(root / "client.pem"))
    with VaultClient(server.url, server.token, progress=False, retry=ONCE) as vault:
        rec = vault.save("tls/run", {"state.bin": b"over TLS" * 1000})
        assert vault.read_range("tls/run", rec.id, "state.bin", 0, 8) == b"over TLS"
        big = os.urandom(9 << 20)  # raw hot frames: sent through the TLS transport
        rec = vault.save("tls/big", {"w.bin": big})
        vault.load("tls/big", rec.id, tmp_path)  # the client's threaded download, over TLS
        assert (tmp_path / "w.bin").read_bytes() == big

    monkeypatch.delenv("CKPT_CLIENT_CERT")  # no client certificate: refused at handshake
    with (
        VaultClient(server.url, server.token, progress=False, retry=ONCE) as vault,
        pytest.raises(ClientError),
    ):
        vault.health()

    monkeypatch.delenv("CKPT_CA_FILE")  # the server's CA not trusted: certificate refused
    with (
        VaultClient(server.url, server.token, progress=False, retry=ONCE) as vault,
        pytest.raises(ClientError, match="(?i)certificate"),
    ):
        vault.health()


@pytest.mark.slow
def test_a_tls_key_other_users_may_read_is_refused_unless_shared_on_purpose(
    tmp_path: Path,
) -> None:
    """Anyone on the host who can read the key can pose as the server: `ckpt serve` says
    so and does not start, unless `[server] tls_key_shared = true` (then it warns)."""
    ca = trustme.CA()
    key = tmp_path / "server.pem"
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(key))
    key.chmod(0o644)
    args = ["--tls-cert", str(key), "--tls-key", str(key)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPT_")}
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "checkpoint_vault.cli",
            "serve",
            "--data",
            str(tmp_path / "data"),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert refused.returncode == 2, refused.stderr
    assert "open to every user of this host (mode 644): chmod 600 it" in refused.stderr
    assert "tls_key_shared" in refused.stderr
    assert not (tmp_path / "data").exists()

    config = tmp_path / "shared.toml"
    config.write_text("[server]\ntls_key_shared = true\n")
    probe = ssl.create_default_context(cafile=None)
    probe.check_hostname = False
    probe.verify_mode = ssl.CERT_NONE
    proc = ServerProcess(
        tmp_path / "d2", free_port(), tmp_path / "s.log", config, tuple(args), probe
    )
    try:
        proc.start()
        assert "TLS key: " in proc.log_tail()
    finally:
        proc.stop()
