"""The owner of a loopback connection's other end (api/peers.py), on real sockets."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from checkpoint_vault.api.transfer.peers import _listed_uid, peer_uid


@contextmanager
def _connected(family: int, host: str) -> Iterator[tuple[tuple[str, int], tuple[str, int]]]:
    """A connection to a listener on `host`: the server side's (local, remote)."""
    with socket.socket(family) as listener:
        listener.bind((host, 0))
        listener.listen()
        with socket.socket(family) as client:
            client.connect(listener.getsockname()[:2])
            served, _ = listener.accept()
            with served:
                yield served.getsockname()[:2], served.getpeername()[:2]


@pytest.mark.parametrize(
    ("family", "host"), [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")]
)
def test_the_peer_is_found_and_both_ways_agree(family: int, host: str) -> None:
    with _connected(family, host) as (local, remote):
        assert peer_uid(local, remote) == os.getuid()
        assert _listed_uid(local, remote) == os.getuid()


def test_a_socket_that_is_not_there_has_no_owner() -> None:
    with _connected(socket.AF_INET, "127.0.0.1") as (local, remote):
        gone = (remote[0], local[1])  # nobody's local address is our own port
        assert peer_uid(local, gone) is None
        assert _listed_uid(local, gone) is None


def test_a_dual_stack_listener_finds_an_ipv4_peer() -> None:
    with socket.socket(socket.AF_INET6) as listener:
        listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        listener.bind(("::", 0))
        listener.listen()
        with socket.socket(socket.AF_INET) as client:
            client.connect(("127.0.0.1", listener.getsockname()[1]))
            served, _ = listener.accept()
            with served:
                local, remote = served.getsockname()[:2], served.getpeername()[:2]
                assert remote[0] == "::ffff:127.0.0.1"
                assert peer_uid(local, remote) == os.getuid()
