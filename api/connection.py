"""A request's connection as a socket of its own, for the reads and writes that bypass
aiohttp's transport (bodies on receiver threads, downloads by sendfile, hand-overs)."""

from __future__ import annotations

import socket

from aiohttp import web


def connection_socket(request: web.Request) -> socket.socket:
    """A duplicate of the connection's socket (the caller closes it). ConnectionResetError
    once the client left: uvloop's transport drops its socket when closed, where asyncio's
    kept a dead one."""
    transport = request.transport
    sock = None if transport is None else transport.get_extra_info("socket")
    if sock is None:
        raise ConnectionResetError("the client closed the connection")
    dup: socket.socket = sock.dup()
    return dup
