"""`ckpt cluster status`, `proxy-config`, `move` and `drain`: a cluster through any node.

Each reads `GET /v1/cluster` of the node `--url` names (admin token): the cluster's state
lives in its object store, and every node reads it once per beat, so any node answers
for the whole. A move is the standby's promotion, planned: the owner releases the shard
(`POST /v1/cluster/release`: refuses new writes with 503, which clients retry, and waits
until the replica has every write it acknowledged), then the standby on the target node
is promoted (`POST /v1/admin/promote`: catches up, claims the next epoch), and the
command waits until the cluster names the new owner.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from .output import emit_json, human_bytes, table


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
    c.add_argument(
        "--s3-bind",
        default="*:9000",
        help="where it listens for S3 clients, when the processes run the S3 endpoint "
        "(default *:9000)",
    )
    c.add_argument("-o", "--output", type=Path, help="the file to write (default: stdout)")
    c.add_argument(
        "--dns",
        action="store_true",
        help="resolve the processes' names at run time (Kubernetes: pods change addresses)",
    )
    c.set_defaults(func=proxy_config)
    m = inner.add_parser("move", help="move a shard to its standby on NODE (a write pause)")
    m.add_argument("shard", type=int)
    m.add_argument("node")
    m.set_defaults(func=move)
    d = inner.add_parser("drain", help="move every shard NODE owns to a standby elsewhere")
    d.add_argument("node")
    d.set_defaults(func=drain)
    a = inner.add_parser(
        "add", help="give NODE (its standbys running) its share of shards, moved from the busiest"
    )
    a.add_argument("node")
    a.set_defaults(func=add)


MOVE_TIMEOUT = 60.0  # seconds for the cluster to name the new owner after the promotion


def _endpoint(args: argparse.Namespace) -> tuple[str, str | None]:
    from checkpoint_vault.client.endpoint import default_token
    from checkpoint_vault.protocol import DEFAULT_URL

    url = args.url or os.environ.get("CKPT_URL") or DEFAULT_URL
    return url, args.token or default_token(url)


def _call(url: str, token: str | None, path: str, body: Any = None) -> dict[str, Any]:
    """One admin request (GET, or POST with a JSON body); the client's error on a refusal."""
    from checkpoint_vault.client.endpoint import tls_from_env
    from checkpoint_vault.client.errors import error_from

    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url.rstrip("/") + path, data=data)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=120, context=tls_from_env()) as answer:
            out: dict[str, Any] = json.loads(answer.read() or b"{}")
            return out
    except urllib.error.HTTPError as e:
        with e:
            try:
                err = json.loads(e.read())
            except ValueError:
                err = {}
        raise error_from(e.code, err) from None


def cluster_state(args: argparse.Namespace) -> dict[str, Any]:
    url, token = _endpoint(args)
    state = _call(url, token, "/v1/cluster")
    if not state.get("cluster"):
        raise ValueError(f"{url} is not part of a cluster (no [cluster] section)")
    return state


def status(args: argparse.Namespace) -> int:
    state = cluster_state(args)
    if args.json:
        emit_json(state)
        return 0
    totals = state["totals"]
    print(
        f"{len(state['nodes'])} nodes, {state['shards']} shards (seen from {state['node']}): "
        f"{totals['checkpoints']} checkpoints, {human_bytes(totals['logical_bytes'])} logical, "
        f"{human_bytes(totals['stored_bytes'])} stored"
    )
    table(
        ["node", "up", "processes", "owns", "checkpoints", "last beat"],
        [
            [
                n["node"],
                "up" if n["up"] else "DOWN",
                n["processes"],
                ", ".join(map(str, n["owns"])) or "-",
                n["checkpoints"],
                f"{n['beat_age_seconds']} s",
            ]
            for n in state["nodes"]
        ],
    )
    table(
        ["shard", "owner", "epoch", "replica lag", "checkpoints", "stored", "standbys"],
        [
            [
                s["shard"],
                s["owner"] or "NONE",
                s["epoch"],
                "-" if s["lag_seconds"] is None else f"{s['lag_seconds']} s",
                "-" if s["checkpoints"] is None else s["checkpoints"],
                human_bytes(s["stored_bytes"]),
                ", ".join(s["standbys"]) or "-",
            ]
            for s in state["shard_owners"]
        ],
    )
    return 0


def proxy_config(args: argparse.Namespace) -> int:
    from checkpoint_vault.cluster.proxy import haproxy_config

    text = haproxy_config(cluster_state(args), args.bind, args.dns, args.s3_bind)
    if args.output is None:
        print(text, end="")
    else:
        args.output.write_text(text)
    return 0


def _move(args: argparse.Namespace, state: dict[str, Any], shard: int, node: str) -> str:
    """Move `shard` to its live standby on `node`; what happened, in one line."""
    _, token = _endpoint(args)
    if not 0 <= shard < int(state["shards"]):
        raise ValueError(f"no shard {shard}: the cluster has {state['shards']}")
    owner = state["shard_owners"][shard]
    if owner["owner"] == node:
        return f"shard {shard} is already on {node}"
    target = next(
        (
            m
            for m in state["members"]
            if m["shard"] == shard and m["node"] == node and m["role"] == "standby" and m["live"]
        ),
        None,
    )
    if target is None:
        raise ValueError(f"{node} runs no live standby of shard {shard}: start one first")
    if owner["url"] is None:
        raise ValueError(f"shard {shard} has no live owner to hand it over")
    started = time.monotonic()
    _call(owner["url"], token, "/v1/cluster/release", {"shard": shard})
    try:
        promoted = _call(target["url"], token, "/v1/admin/promote", {})
    except Exception:
        _call(owner["url"], token, "/v1/cluster/release", {"shard": shard, "cancel": True})
        raise
    deadline = time.monotonic() + MOVE_TIMEOUT
    while time.monotonic() < deadline:
        now = _call(target["url"], token, "/v1/cluster")["shard_owners"][shard]
        if now["owner"] == node:
            return (
                f"moved shard {shard} from {owner['owner']} to {node} at epoch "
                f"{promoted.get('epoch')} in {time.monotonic() - started:.2f} s"
            )
        time.sleep(0.1)  # polling the cluster's view, bounded by MOVE_TIMEOUT
    raise ValueError(f"shard {shard}: {node} was promoted but is not named its owner yet")


def move(args: argparse.Namespace) -> int:
    print(_move(args, cluster_state(args), args.shard, args.node))
    return 0


def drain(args: argparse.Namespace) -> int:
    """Every shard the node owns, to the first live standby of it on another node."""
    state = cluster_state(args)
    owned = [s["shard"] for s in state["shard_owners"] if s["owner"] == args.node]
    if not owned:
        print(f"{args.node} owns no shard")
        return 0
    for shard in owned:
        others = sorted(
            m["node"]
            for m in state["members"]
            if m["shard"] == shard and m["role"] == "standby" and m["live"]
            and m["node"] != args.node
        )  # fmt: skip
        if not others:
            raise ValueError(f"shard {shard} has no live standby off {args.node}: not drained")
        print(_move(args, state, shard, others[0]))
        state = cluster_state(args)
    return 0


def add(args: argparse.Namespace) -> int:
    """Bring NODE, whose processes are running (standbys of some shards), to its share of
    the shards: while it owns fewer than `ceil(shards / live nodes)`, move to it a shard
    it stands by for from a node that owns more than that."""
    state = cluster_state(args)
    live = {n["node"] for n in state["nodes"] if n["up"]}
    if args.node not in live:
        raise ValueError(f"{args.node} has no live process: start its standbys first")
    fair = -(-int(state["shards"]) // len(live))
    moved = 0
    while True:
        owned: dict[str, list[int]] = {}
        for s in state["shard_owners"]:
            owned.setdefault(s["owner"], []).append(s["shard"])
        if len(owned.get(args.node, [])) >= fair:
            break
        standing = {
            m["shard"]
            for m in state["members"]
            if m["node"] == args.node and m["role"] == "standby" and m["live"]
        }
        candidates = [
            shard
            for owner, shards in sorted(owned.items(), key=lambda o: -len(o[1]))
            if owner != args.node and len(shards) > fair
            for shard in shards
            if shard in standing
        ]
        if not candidates:
            break
        print(_move(args, state, candidates[0], args.node))
        moved += 1
        # what we just did: the answering node's view may be a beat behind it
        state["shard_owners"][candidates[0]]["owner"] = args.node
    mine = [s["shard"] for s in state["shard_owners"] if s["owner"] == args.node]
    print(f"{args.node} owns shards {mine or 'none'} ({moved} moved; fair share {fair})")
    return 0
