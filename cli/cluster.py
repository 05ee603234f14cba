"""`ckpt cluster status` and `ckpt cluster proxy-config`: a cluster seen through any node.

Both read `GET /v1/cluster` of the node `--url` names (admin token): the cluster's state
lives in its object store, and every node reads it once per beat, so any node answers
for the whole.
"""

from __future__ import annotations

import argparse
import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from .output import emit_json, table


def register(sub: Any) -> None:
    p = sub.add_parser("cluster", help="a cluster of nodes: status, proxy configuration")
    inner = p.add_subparsers(dest="cluster_command", required=True, metavar="SUBCOMMAND")
    s = inner.add_parser("status", help="nodes, their health, shards, owners, replica lag")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=status)
    c = inner.add_parser(
        "proxy-config", help="write HAProxy's configuration for the cluster's processes"
    )
    c.add_argument("--bind", default="*:8080", help="where the proxy listens (default *:8080)")
    c.add_argument("-o", "--output", type=Path, help="the file to write (default: stdout)")
    c.set_defaults(func=proxy_config)


def cluster_state(args: argparse.Namespace) -> dict[str, Any]:
    from client.endpoint import default_token, tls_from_env
    from client.errors import error_from
    from protocol import DEFAULT_URL

    url = args.url or os.environ.get("CKPT_URL") or DEFAULT_URL
    token = args.token or default_token(url)
    request = urllib.request.Request(url.rstrip("/") + "/v1/cluster")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30, context=tls_from_env()) as answer:
            state: dict[str, Any] = json.loads(answer.read())
            return state
    except urllib.error.HTTPError as e:
        try:
            body = json.loads(e.read())
        except ValueError:
            body = {}
        raise error_from(e.code, body) from None


def status(args: argparse.Namespace) -> int:
    state = cluster_state(args)
    if args.json:
        emit_json(state)
        return 0
    print(f"{len(state['nodes'])} nodes, {state['shards']} shards (seen from {state['node']})")
    table(
        ["node", "up", "processes", "last beat"],
        [
            [n["node"], "up" if n["up"] else "DOWN", n["processes"], f"{n['beat_age_seconds']} s"]
            for n in state["nodes"]
        ],
    )
    table(
        ["shard", "owner", "epoch", "replica lag", "standbys"],
        [
            [
                s["shard"],
                s["owner"] or "NONE",
                s["epoch"],
                "-" if s["lag_seconds"] is None else f"{s['lag_seconds']} s",
                ", ".join(s["standbys"]) or "-",
            ]
            for s in state["shard_owners"]
        ],
    )
    return 0


def proxy_config(args: argparse.Namespace) -> int:
    from cluster.proxy import haproxy_config

    text = haproxy_config(cluster_state(args), args.bind)
    if args.output is None:
        print(text, end="")
    else:
        args.output.write_text(text)
    return 0
