"""Who is on the other end of a loopback TCP connection: the user owning the peer's socket.

Health names the local socket (and so the data dir's path) only to a caller that can use
it: the socket sits in the data dir, mode 0700, so that is a process of the server's own
user (or root). A loopback address alone does not say so: a reverse proxy on the same host
makes every remote caller look like 127.0.0.1. The peer's socket is the one whose local
address is our remote one and whose remote address is our local one; Linux names its
owner's uid when asked for exactly that socket over netlink (sock_diag, what `ss` uses:
~0.05 ms). Listing every TCP socket in /proc/net/tcp and tcp6 instead took 4-8 ms of the
event loop per health call; it is only the way where sock_diag is not offered (some
sandboxes). A connection not found (a socket closed meanwhile) counts as someone else's.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from pathlib import Path

PROC_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))

# linux/sock_diag.h, linux/inet_diag.h, linux/netlink.h
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NO_COOKIE = 0xFFFFFFFF
_ALL_STATES = 0xFFFFFFFF
_NLMSG = struct.Struct("=IHHII")  # length, type, flags, seq, pid
_DIAG_HEAD = struct.Struct("=BBBBI")  # family, protocol, extensions, pad, states
_ID_AT = _NLMSG.size + 4  # inet_diag_msg: 4 bytes, the socket id (ports first), 3 u32, uid
_UID_AT = _ID_AT + 48 + 12
_ASK_WAIT = 1.0  # seconds; the kernel answers at once


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
    try:
        nl = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG)
    except OSError:  # no sock_diag here
        return _listed_uid(local, remote)
    with nl:
        nl.settimeout(_ASK_WAIT)
        try:
            return _diag_uid(nl, remote, local)  # the peer's socket: local is our remote
        except OSError:
            return None


def _diag_uid(nl: socket.socket, src: tuple[str, int], dst: tuple[str, int]) -> int | None:
    """The owner of the TCP socket whose local address is `src` and remote one `dst`."""
    a, b = _unmapped(src[0]), _unmapped(dst[0])
    if a.version != b.version:
        return None
    family = socket.AF_INET if a.version == 4 else socket.AF_INET6
    sock_id = (
        struct.pack(">HH", src[1], dst[1])
        + a.packed.ljust(16, b"\0")
        + b.packed.ljust(16, b"\0")
        + struct.pack("=III", 0, _NO_COOKIE, _NO_COOKIE)
    )
    body = _DIAG_HEAD.pack(family, socket.IPPROTO_TCP, 0, 0, _ALL_STATES) + sock_id
    head = _NLMSG.pack(_NLMSG.size + len(body), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0)
    nl.send(head + body)
    answer = nl.recv(8192)
    _, kind, _, _, _ = _NLMSG.unpack_from(answer)
    if kind != _SOCK_DIAG_BY_FAMILY or len(answer) < _UID_AT + 4:
        return None  # an error message: no such socket (closed meanwhile)
    if answer[_ID_AT : _ID_AT + 4] != sock_id[:4]:
        return None  # a listener on that port, which the lookup falls back to
    uid: int = struct.unpack_from("=I", answer, _UID_AT)[0]
    return uid


def _unmapped(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """`host`'s address; an IPv4-mapped one (a dual-stack socket's view of an IPv4 peer)
    as the IPv4 address the kernel files that socket under."""
    addr = ipaddress.ip_address(host.split("%")[0])
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def _listed_uid(local: tuple[str, int], remote: tuple[str, int]) -> int | None:
    """`peer_uid` from the kernel's lists of every TCP socket."""
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
