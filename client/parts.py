"""A part of a checkpoint written on many hosts and committed once.

Each host saves its files on a node near it (`VaultClient.save_part`, or `begin_part`,
`send_file` and `commit_part` from several processes), which answers a `Part`: the node
that holds it and its id. One caller then names every part in `commit_parts` through
the proxy (or any node); the namespace's owner fetches the parts' manifests from their
nodes and commits one checkpoint (docs/DESIGN.md, "A checkpoint from many hosts").
A `Part` is picklable: ranks hand theirs to a coordinator (client/dcp.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Part:
    node: str  # the node's URL in its cluster ("": the node that commits holds it)
    id: str
    namespace: str
    size: int
    files: tuple[str, ...]
    expires_at: str

    def ref(self) -> dict[str, str]:
        """How a commit names it."""
        return {"node": self.node, "id": self.id}

    @staticmethod
    def from_wire(d: Mapping[str, Any]) -> Part:
        return Part(
            str(d.get("node") or ""),
            str(d["id"]),
            str(d["namespace"]),
            int(d["size"]),
            tuple(str(f) for f in d.get("files", ())),
            str(d.get("expires_at", "")),
        )


__all__ = ["Part"]
