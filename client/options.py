"""What a save asks of the checkpoint it makes: `SaveOptions`, declared once.

Every call that makes a checkpoint (`save`, background saves, `begin_upload`, the torch,
DCP and LangGraph integrations) takes these as keyword arguments typed by `SaveFields`
and builds one `SaveOptions` from them in one place (`SaveOptions.of`), which alone knows
how they go on the wire. A test pins `SaveFields` to the dataclass's fields.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict


class SaveFields(TypedDict, total=False):
    """The keyword arguments of every save: `**options: Unpack[SaveFields]`."""

    parent: str | None
    inherit: bool
    metadata: Mapping[str, Any] | None
    tags: Sequence[str] | None
    chunking: str | Mapping[str, int] | None


@dataclass(frozen=True)
class SaveOptions:
    """`parent`: a checkpoint id or ref the new one follows; `inherit`: keep the parent's
    files that this save does not name; `metadata`, `tags`: the checkpoint's own;
    `chunking`: a FastCDC profile name or parameters for the namespace's first save."""

    parent: str | None = None
    inherit: bool = False
    metadata: Mapping[str, Any] = field(default_factory=dict)
    tags: tuple[str, ...] = ()
    chunking: str | Mapping[str, int] | None = None

    @classmethod
    def of(cls, fields: SaveFields) -> SaveOptions:
        """The options a call's keyword arguments ask for (None means the default)."""
        unknown = set(fields) - set(SaveFields.__annotations__)
        if unknown:
            raise TypeError(f"unknown save option(s): {', '.join(sorted(unknown))}")
        return cls(
            parent=fields.get("parent"),
            inherit=bool(fields.get("inherit", False)),
            metadata=dict(fields.get("metadata") or {}),
            tags=tuple(fields.get("tags") or ()),
            chunking=fields.get("chunking"),
        )

    def wire(self) -> dict[str, Any]:
        """The JSON fields of an upload or a one-request save."""
        body: dict[str, Any] = {
            "parent": self.parent,
            "inherit": self.inherit,
            "metadata": dict(self.metadata),
            "tags": list(self.tags),
        }
        if self.chunking is not None:
            chunking = self.chunking
            body["chunking"] = chunking if isinstance(chunking, str) else dict(chunking)
        return body
