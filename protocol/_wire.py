"""Field-driven `to_wire`/`from_wire` for the admin records (protocol/_maintenance.py,
_admin.py).

The admin reports are wide (a dozen counters each) and nested (a plan per tier, a summary
per move), so writing each record's conversions by hand would repeat every field name three
times. These two functions read the dataclass fields and type hints instead, the same ones
api/openapi.py derives the schemas from, so the JSON, the parse and the document agree by
construction. Field metadata `optional` means the key is left out of the JSON when the
value is None (and read as None when absent).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar, Union

T = TypeVar("T")
R = TypeVar("R", bound="Record")

_OPTIONAL: dict[str, Any] = {"optional": True}


def optional(default: Any = None) -> Any:
    """A field left out of the JSON when None (and read as None when absent)."""
    return dataclasses.field(default=default, metadata=_OPTIONAL)


class Record:
    """The base of the admin records: `to_wire`/`from_wire` read the dataclass's fields.
    A record whose JSON holds figures derived from its fields overrides `to_wire` and
    names them, with their JSON schema, in `DERIVED`."""

    DERIVED: ClassVar[dict[str, Any]] = {}

    def to_wire(self) -> dict[str, Any]:
        return wire_of(self)

    @classmethod
    def from_wire(cls: type[R], d: object) -> R:
        """Parse an answer; `ValueError` names the first field missing or malformed."""
        return record_of(cls, d, cls.__name__)


def wire_of(record: object) -> dict[str, Any]:
    """The JSON object of a record: one key per field, in field order; optional fields
    that are None are left out; nested records through their own `to_wire`."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(record):  # type: ignore[arg-type]
        value = getattr(record, f.name)
        if value is None and f.metadata.get("optional"):
            continue
        out[f.name] = _to_json(value)
    return out


def _to_json(value: object) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return value.to_wire()  # type: ignore[attr-defined]
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_json(v) for k, v in value.items()}
    return value


def record_of(cls: type[T], data: object, what: str) -> T:
    """Parse a JSON object into record `cls` by its fields' type hints; `ValueError` names
    the first field that is missing or of the wrong type. Keys the record lacks (derived
    figures such as `ok`, or fields a newer server added) are ignored."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{what} must be a JSON object")
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in data:
            kwargs[f.name] = _parse(hints[f.name], data[f.name], f"{what}.{f.name}")
        elif f.metadata.get("optional"):
            kwargs[f.name] = None
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ValueError(f"{what}.{f.name} is missing")
    return cls(**kwargs)


def _parse(hint: Any, value: object, what: str) -> Any:  # noqa: C901, PLR0911 (one case per kind of hint)
    if hint is Any:
        return value
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _parse(inner[0], value, what)
    if origin is list:
        if not isinstance(value, list):
            raise ValueError(f"{what} must be a list")
        return [_parse(args[0], v, f"{what}[]") for v in value]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ValueError(f"{what} must be a JSON object")
        return {str(k): _parse(args[1], v, f"{what}.{k}") for k, v in value.items()}
    if isinstance(hint, type) and issubclass(hint, Record):
        return record_of(hint, value, what)  # parsed here, so an error names the whole path
    if dataclasses.is_dataclass(hint):
        return hint.from_wire(value)  # type: ignore[union-attr]
    if hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{what} must be a boolean")
        return value
    if hint is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{what} must be an integer")
        return value
    if hint is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ValueError(f"{what} must be a number")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ValueError(f"{what} must be a string")
        return value
    raise TypeError(f"no parse for {hint!r}")
