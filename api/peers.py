"""Who is on the other end of a loopback TCP connection: the user owning the peer's socket.

Health names the local socket (and so the data dir's path) only to a caller that can use
it: the socket sits in the data dir, mode 0700, so that is a process of the server's own
user (or root). A loopback address alone does not say so: a reverse proxy on the same host
makes every remote caller look like 127.0.0.1. Linux lists every TCP socket with its
owner's uid in /proc/net/tcp and tcp6; the peer's socket is the one whose local address is
our remote one and whose remote address is our local one. A connection not found there (a
socket closed meanwhile, no /proc) counts as someone else's.
"""

from __future__ import annotations

import ipaddress
import struct
from pathlib import Path

PROC_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))


def _proc_address(host: str, port: int) -> str:
    """`host:port` as /proc/net/tcp{,6} writes it: the address's 32-bit words in host byte
    order, hex, upper case; the port hex."""
    addr = ipaddress.ip_address(host.split("%")[0])
    raw = addr.packed
    words = struct.unpack(f"={len(raw) // 4}I", raw)
    return "".join(f"{w:08X}" for w in words) + f":{port:04X}"


def peer_uid(local: tuple[str, int], remote: tuple[str, int]) -> int | None:
    """The uid owning the other end of our TCP connection `local` <-> `remote` (both on
    this machine), or None when it cannot be found."""
    pairs = [(remote, local)]  # the peer's socket: its local address is our remote one
    if ":" not in remote[0]:  # an IPv4 pair on a dual-stack socket is listed IPv4-mapped
        pairs.append(((f"::ffff:{remote[0]}", remote[1]), (f"::ffff:{local[0]}", local[1])))
    wanted = {(_proc_address(*a), _proc_address(*b)) for a, b in pairs}
    for table in PROC_TABLES:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 7 and (fields[1], fields[2]) in wanted:
                return int(fields[7])
    return None


def same_user(local: object, remote: object, uid: int) -> bool:
    """Whether the peer of a TCP connection between `local` and `remote` (as the transport
    names them: (host, port, ...)) runs as `uid` or as root."""
    if not isinstance(local, tuple) or not isinstance(remote, tuple):
        return False  # not TCP (the Unix socket names no addresses)
    owner = peer_uid((str(local[0]), int(local[1])), (str(remote[0]), int(remote[1])))
    return owner is not None and owner in (uid, 0)
