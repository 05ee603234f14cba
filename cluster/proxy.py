"""HAProxy's configuration from the cluster's state (`ckpt cluster proxy-config`).

HAProxy computes a request's shard itself, as `shards.py` does: the namespace cut out of
the path (`regsub` without groups, since a converter's arguments cannot hold parentheses:
the prefix, then the first `/checkpoints/...`, `/checkpoints`, `/uploads`, `/policy` or
`/parts`),
percent-decoded, CRC-32, modulo the shard count; an upload's shard is its id's prefix
(`field(1,-)` of the fourth path segment). A namespace that itself holds a segment named
`checkpoints` may be cut short here: that request is then forwarded, one hop.

Each shard is a backend whose servers are every process of that shard, checked on
`GET /v1/cluster/primary`, which answers 200 only on the one holding the shard's lease
(Patroni's pattern: routing follows the lease holder, not a hash of the live set); the
primaries of the other shards are its backup servers, which forward to the owner they
know, so a proxy whose checks lag, or a shard with no primary for a moment, costs a hop.
Everything else (`/v1/saves`, admin, health, listings) goes round robin to the live
processes. The generated file needs no edit when a shard changes hands, only when
processes join or leave.

When the processes run the S3 endpoint (their beats name its URL), a second frontend on
its own bind routes S3's path-style requests the same way: a bucket is the namespace of
its name (api/s3/naming.py), so `/<bucket>/...` goes to backend `s3shard<crc32(bucket)
mod N>`, whose servers are the processes' S3 ports, checked on their JSON ports
(`check port`, and `addr` when the S3 host differs) as the JSON backends are; ListBuckets
(`/`) goes round robin, and whichever process takes it asks every shard's owner.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

# Checks every second, down after 2 failures, up after 1 success: a takeover is seen by
# the proxy within ~2 s of the new primary holding its lease (docs/DESIGN.md's bound).
CHECK = "inter 1s fall 2 rise 1 on-marked-down shutdown-sessions"


NAMESPACE = (
    "path,regsub(^/v1/namespaces/,),regsub(/checkpoints/.*$,),regsub(/checkpoints$,),"
    "regsub(/uploads$,),regsub(/policy$,),regsub(/parts$,)"
)


BUCKET = "path,field(2,/),url_dec"  # `/<bucket>/<key>`: the second field is the bucket


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or (443 if parts.scheme == "https" else 80)


def _server(member: Mapping[str, Any]) -> tuple[str, str]:
    host, port = _address(str(member["url"]))
    name = f"{member['node']}-s{member['shard']}"
    return name, f"{host}:{port}"


def _s3_server(member: Mapping[str, Any]) -> str:
    """`<name> <S3 address> check port <JSON port>`: served on the S3 port, checked on the
    JSON one (the check's URIs are the JSON API's)."""
    name, _ = _server(member)
    host, port = _address(str(member["url"]))
    s3_host, s3_port = _address(str(member["s3_url"]))
    addr = "" if s3_host == host else f" addr {host}"
    return f"{name} {s3_host}:{s3_port} check port {port}{addr}"


def haproxy_config(
    state: Mapping[str, Any], bind: str = "*:8080", dns: bool = False, s3_bind: str = "*:9000"
) -> str:
    """The config for the cluster `state` (GET /v1/cluster's answer) listening on `bind`,
    and on `s3_bind` for the S3 endpoint when its processes run one. `dns`: resolve the
    processes' host names at run time from /etc/resolv.conf (pods whose addresses
    change, Kubernetes); a name that does not resolve yet leaves its server down instead
    of stopping HAProxy from starting."""
    shards = int(state["shards"])
    members: Sequence[Mapping[str, Any]] = state["members"]
    check = f"{CHECK} resolvers dns" if dns else CHECK
    lines = [
        "# written by `ckpt cluster proxy-config`: regenerate when processes join or leave",
        "global",
        "    maxconn 4096",
        "",
        "defaults",
        "    mode http",
        "    timeout connect 2s",
        "    timeout client 300s",
        "    timeout server 300s",
        "    timeout http-request 30s",
        "    timeout check 2s",
        "    option redispatch",
        "    retries 2",
        "    default-server init-addr last,libc,none",
        "",
        *(["resolvers dns", "    parse-resolv-conf", "    hold valid 5s", ""] if dns else []),
        "frontend vault",
        f"    bind {bind}",
        "    acl namespaced path_beg /v1/namespaces/",
        "    acl uploads path_beg /v1/uploads/",
        f"    use_backend shard%[{NAMESPACE},url_dec,crc32,mod({shards})] if namespaced",
        "    use_backend shard%[path,field(4,/),field(1,-)] if uploads",
        "    default_backend any",
        "",
    ]
    for k in range(shards):
        lines += [
            f"backend shard{k}",
            "    option httpchk",
            "    http-check send meth GET uri /v1/cluster/primary",
            "    http-check expect status 200",
        ]
        for m in members:
            name, address = _server(m)
            if int(m["shard"]) == k:
                lines.append(f"    server {name} {address} check {check}")
        for m in members:
            name, address = _server(m)
            if int(m["shard"]) != k:
                lines.append(f"    server {name} {address} check backup {check}")
        lines.append("")
    lines += [
        "backend any",
        "    balance roundrobin",
        "    option httpchk",
        "    http-check send meth GET uri /v1/health",
        "    http-check expect status 200",
    ]
    for m in members:
        name, address = _server(m)
        lines.append(f"    server {name} {address} check {check}")
    s3 = [m for m in members if m.get("s3_url")]
    if s3:
        lines += ["", *_s3_sections(s3, shards, s3_bind, check)]
    return "\n".join(lines) + "\n"


def _s3_sections(
    members: Sequence[Mapping[str, Any]], shards: int, bind: str, check: str
) -> list[str]:
    """The S3 frontend and its backends: the JSON ones' servers on their S3 ports."""
    lines = [
        "frontend s3",
        f"    bind {bind}",
        "    acl buckets path /",
        "    use_backend s3any if buckets",
        f"    use_backend s3shard%[{BUCKET},crc32,mod({shards})]",
        "",
    ]
    for k in range(shards):
        lines += [
            f"backend s3shard{k}",
            "    option httpchk",
            "    http-check send meth GET uri /v1/cluster/primary",
            "    http-check expect status 200",
        ]
        lines += [f"    server {_s3_server(m)} {check}" for m in members if int(m["shard"]) == k]
        lines += [
            f"    server {_s3_server(m)} backup {check}" for m in members if int(m["shard"]) != k
        ]
        lines.append("")
    lines += [
        "backend s3any",
        "    balance roundrobin",
        "    option httpchk",
        "    http-check send meth GET uri /v1/health",
        "    http-check expect status 200",
        *(f"    server {_s3_server(m)} {check}" for m in members),
    ]
    return lines
