"""Parts an owner released, as markers in the cluster's store (issue 44, M2).

Once an owner has adopted a checkpoint committed before its parts were shipped, the part
nodes may delete those parts. The owner asks them directly with the token that committed
(api/cluster/durable.py), but it keeps that token in memory only: after an owner restart,
or with a part's node down at that moment, it has no way to ask, and the part would stay
held until its claim ends (7 days). So the owner then writes a marker instead,
`releases/<node>/<part id>.json`, `<node>` a digest of the part node's URL; the part
node, while it holds claimed parts, lists its own prefix (once a pass, every second),
releases each part named, then deletes the marker.

Why a marker and not a call the part node makes: the store is where the cluster's
members already trust each other (beats, leases, tokens), and a marker needs no token of
any caller. A marker is written only after adoption, so its chunks are named by the
owner's catalog in the shared tier and the part holds nothing the checkpoint needs. It
is a plain put of a name only that release makes (idempotent: a second is the same
bytes); a marker whose part is gone already is just deleted.
"""

from __future__ import annotations

import json

import blake3

from checkpoint_vault.vault.errors import ObjectNotFound
from checkpoint_vault.vault.tier import Tier

RELEASES = "releases/"


def _prefix(node_url: str) -> str:
    """A part node's prefix: its URL's digest (store keys are lower-case names)."""
    return RELEASES + blake3.blake3(node_url.rstrip("/").encode()).hexdigest()[:32] + "/"


def mark(store: Tier, node_url: str, part_id: str, checkpoint: str) -> None:
    """Tell the part's node that its owner adopted it (blocking)."""
    body = json.dumps({"part": part_id, "checkpoint": checkpoint}, sort_keys=True).encode()
    store.put(_prefix(node_url) + part_id.lower() + ".json", body)


def marked(store: Tier, node_url: str) -> list[tuple[str, str]]:
    """(marker key, part id) of every part released to this node (blocking)."""
    out = []
    for key in store.list(_prefix(node_url)):
        try:
            out.append((key, str(json.loads(store.get(key))["part"])))
        except ObjectNotFound:  # taken meanwhile (a second pass)
            continue
    return out


def clear(store: Tier, key: str) -> None:
    store.delete(key)


__all__ = ["RELEASES", "clear", "mark", "marked"]
