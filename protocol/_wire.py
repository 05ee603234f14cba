"""Field-driven `to_wire`/`from_wire` for every JSON record of the API (protocol/_records.py,
_maintenance.py, _admin.py).

Writing each record's conversions by hand repeated every field name three times (thirteen
records did, until issue 42), and the copies drifted: some parses were lenient where
others were strict. These read the dataclass fields and type hints instead, the same ones
api/routes/openapi.py derives the schemas from, so the JSON, the parse and the document agree by
construction. Field metadata: `optional` leaves the key out of the JSON when the value is
None (and reads it as None when absent); a `schema` with an `enum` also bounds the parse.

Each record class gets its two conversions written out as Python source once, from its
hints, and compiled (as `dataclasses` writes `__init__`): a loop over fields calling a
converter per field ran 3-8x slower than the hand-written code it replaces, and listings
parse thousands of records. The source is kept on the functions (`__source__`) to read.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar, Union

T = TypeVar("T")
R = TypeVar("R", bound="Record")

_OPTIONAL: dict[str, Any] = {"optional": True}


def optional(default: Any = None) -> Any:
    """A field left out of the JSON when None (and read as None when absent)."""
    return dataclasses.field(default=default, metadata=_OPTIONAL)


class Record:
    """The base of the wire records: `to_wire`/`from_wire` read the dataclass's fields.
    A record whose JSON holds figures derived from its fields overrides `to_wire` and
    names them, with their JSON schema, in `DERIVED`."""

    DERIVED: ClassVar[dict[str, Any]] = {}

    def to_wire(self) -> dict[str, Any]:
        """The first call puts the written conversion on the class, so later calls are
        that function alone (a record that overrides `to_wire` calls `wire_of`)."""
        cls = type(self)
        if "to_wire" not in cls.__dict__:
            setattr(cls, "to_wire", _codec(cls)[0])  # noqa: B010 - a method, for mypy
        return wire_of(self)

    @classmethod
    def from_wire(cls: type[R], d: object) -> R:
        """Parse an answer; `ValueError` names the first field missing or malformed."""
        return record_of(cls, d, cls.__name__)


def wire_of(record: object) -> dict[str, Any]:
    """The JSON object of a record: one key per field, in field order; optional fields
    that are None are left out; nested records through their own `to_wire`."""
    return _codec(type(record))[0](record)


def record_of(cls: type[T], data: object, what: str) -> T:
    """Parse a JSON object into record `cls` by its fields' type hints; `ValueError` names
    the first field that is missing or of the wrong type. Keys the record lacks (derived
    figures such as `ok`, or fields a newer server added) are ignored."""
    result: T = _codec(cls)[1](data, what)
    return result


Codec = tuple[Callable[[Any], dict[str, Any]], Callable[[object, str], Any]]
_CODEC = "__wire_codec__"  # where a class keeps its own (as dataclasses keeps __init__)


def _codec(cls: type) -> Codec:
    """`cls`'s two conversions, written and compiled at first use, kept on the class."""
    codec: Codec | None = cls.__dict__.get(_CODEC)
    if codec is None:
        codec = _written(cls)
        setattr(cls, _CODEC, codec)
    return codec


def _written(cls: type) -> Codec:
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    names: dict[str, Any] = {"_cls": cls, "_Mapping": Mapping, "_MISSING": _MISSING}
    dump = _Source("def to_wire(self):")
    dump.line("out = {}")
    parse = _Source("def from_wire(data, what):")
    parse.line("if type(data) is not dict and not isinstance(data, _Mapping):")
    parse.line("    raise ValueError(f'{what} must be a JSON object')")
    parse.line("kw = {}")
    for i, f in enumerate(fields):
        _dump_field(dump, f, hints[f.name], i, names)
        _parse_field(parse, f, hints[f.name], i, names)
    dump.line("return out")
    parse.line("return _cls(**kw)")
    return dump.compile("to_wire", names), parse.compile("from_wire", names)


_MISSING = object()


class _Source:
    """A function's source, a line at a time."""

    def __init__(self, head: str) -> None:
        self.lines = [head]

    def line(self, text: str) -> None:
        self.lines.append("    " + text)

    def compile(self, name: str, names: dict[str, Any]) -> Callable[..., Any]:
        source = "\n".join(self.lines) + "\n"
        scope = dict(names)
        exec(compile(source, f"<wire {names['_cls'].__name__}.{name}>", "exec"), scope)  # noqa: S102
        function: Callable[..., Any] = scope[name]
        function.__source__ = source  # type: ignore[attr-defined]
        return function


# -- to JSON ---------------------------------------------------------------------------------
def _dump_field(
    src: _Source, f: dataclasses.Field[Any], hint: Any, i: int, names: dict[str, Any]
) -> None:
    value = f"self.{f.name}"
    expr = _dump_expr(hint, "v", 0, names, i)
    if f.metadata.get("optional"):
        src.line(f"v = {value}")
        src.line("if v is not None:")
        src.line(f"    out[{f.name!r}] = {expr or 'v'}")
    elif expr is None:
        src.line(f"out[{f.name!r}] = {value}")
    else:
        src.line(f"v = {value}")
        src.line(f"out[{f.name!r}] = {expr}")


def _dump_expr(hint: Any, value: str, depth: int, names: dict[str, Any], i: int) -> str | None:
    """The expression that makes `value` JSON, or None where it is JSON already
    (primitives, `JSON`, lists and dicts of them)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1:
            names["_to_json"] = _to_json
            return f"_to_json({value})"
        expr = _dump_expr(inner[0], value, depth, names, i)
        return None if expr is None else f"(None if {value} is None else {expr})"
    if origin is list:
        item = _dump_expr(args[0], f"x{depth}", depth + 1, names, i)
        return None if item is None else f"[{item} for x{depth} in {value}]"
    if origin is dict:
        item = _dump_expr(args[1], f"x{depth}", depth + 1, names, i)
        if item is None:
            return None
        return f"{{k{depth}: {item} for k{depth}, x{depth} in {value}.items()}}"
    if dataclasses.is_dataclass(hint):
        return f"{value}.to_wire()"
    return None


def _to_json(value: object) -> Any:
    """A value of a union of several kinds, by what it is."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return value.to_wire()  # type: ignore[attr-defined]
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_json(v) for k, v in value.items()}
    return value


# -- from JSON -------------------------------------------------------------------------------
def _parse_field(
    src: _Source, f: dataclasses.Field[Any], hint: Any, i: int, names: dict[str, Any]
) -> None:
    name = f.name
    src.line(f"v = data.get({name!r}, _MISSING)")
    src.line("if v is _MISSING:")
    if f.metadata.get("optional"):
        src.line(f"    kw[{name!r}] = None")
    elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
        src.line(f"    raise ValueError(f'{{what}}.{name} is missing')")
    else:
        src.line("    pass")
    src.line("else:")
    names[f"_p{i}"] = _parser(hint)
    fine = _as_it_is(hint)
    if fine is None:
        src.line(f"    kw[{name!r}] = v = _p{i}(v, what, {name!r})")
    else:  # the check inline; the parser (which names the path) only for a bad value
        src.line(f"    if not ({fine}):")
        src.line(f"        _p{i}(v, what, {name!r})")
        src.line(f"    kw[{name!r}] = v")
    enum = f.metadata.get("schema", {}).get("enum")
    if enum is not None:
        names[f"_enum{i}"] = frozenset(enum)
        allowed = ", ".join(map(str, enum))
        src.line(f"    if v not in _enum{i}:")
        src.line(f"        raise ValueError(f'{{what}}.{name} must be one of {allowed}')")


Parse = Callable[[object, str, str], Any]  # (value, the record's path, the field's name)
_EXACT = {str: "str", int: "int", bool: "bool"}


def _as_it_is(hint: Any) -> str | None:
    """A condition under which a JSON value is the field's value unchanged (a string for a
    `str`, `None` for an optional), or None where the parser must build it."""
    if hint is Any:
        return "True"
    if hint in _EXACT:
        return f"type(v) is {_EXACT[hint]}"
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (Union, types.UnionType) and len(args) == 2:
        inner = _as_it_is([a for a in args if a is not type(None)][0])
        if type(None) in args and inner is not None:
            return f"v is None or {inner}"
    return None


def _parser(hint: Any) -> Parse:  # noqa: C901, PLR0911 (one case per kind of hint)
    """How a field's JSON value becomes its value; the path in an error is built only
    when there is one."""
    if hint is Any:
        return _any
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        inner = _parser([a for a in args if a is not type(None)][0])
        if type(None) not in args:
            return inner
        return lambda value, what, name: None if value is None else inner(value, what, name)
    if origin is list:
        return _list_parser(_parser(args[0]))
    if origin is dict:
        return _dict_parser(_parser(args[1]))
    if isinstance(hint, type) and issubclass(hint, Record):
        nested = _codec(hint)[1]
        return lambda value, what, name: nested(value, f"{what}.{name}")
    if dataclasses.is_dataclass(hint):
        return lambda value, what, name: hint.from_wire(value)  # type: ignore[union-attr]
    if hint in _PRIMITIVES:
        return _PRIMITIVES[hint]
    raise TypeError(f"no parse for {hint!r}")


def _any(value: object, what: str, name: str) -> Any:
    return value


def _list_parser(item: Parse) -> Parse:
    def parse(value: object, what: str, name: str) -> Any:
        if type(value) is not list:
            raise ValueError(f"{what}.{name} must be a list")
        return [item(v, what, f"{name}[]") for v in value]

    return parse


def _dict_parser(item: Parse) -> Parse:
    def parse(value: object, what: str, name: str) -> Any:
        if type(value) is not dict and not isinstance(value, Mapping):
            raise ValueError(f"{what}.{name} must be a JSON object")
        path = f"{what}.{name}"
        return {str(k): item(v, path, str(k)) for k, v in value.items()}

    return parse


def _bool(value: object, what: str, name: str) -> bool:
    if type(value) is not bool:
        raise ValueError(f"{what}.{name} must be a boolean")
    return value


def _int(value: object, what: str, name: str) -> int:
    if type(value) is not int and (not isinstance(value, int) or isinstance(value, bool)):
        raise ValueError(f"{what}.{name} must be an integer")
    return value


def _float(value: object, what: str, name: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ValueError(f"{what}.{name} must be a number")
    return float(value)


def _str(value: object, what: str, name: str) -> str:
    if type(value) is not str and not isinstance(value, str):
        raise ValueError(f"{what}.{name} must be a string")
    return value


_PRIMITIVES: dict[object, Parse] = {bool: _bool, int: _int, float: _float, str: _str}
