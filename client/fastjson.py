"""JSON on the client's per-request paths: orjson when it is installed, with the standard
library's meaning.

A LangGraph put is one small request whose client CPU is compared with PostgresSaver's
(~0.3-0.4 ms); writing its bundle's header with `json.dumps` cost ~12 us and reading the
answer with `json.loads` ~5-25 us, orjson ~1 and ~2-10 (every LangGraph install has orjson:
langsmith, which langchain-core requires, depends on it). The `langgraph` extra names it;
without it everything here is the standard library's.

The results mean what the standard library's would. orjson writes NaN and infinities as
`null` (the standard library writes `NaN`, which the server refuses), so output holding a
`null` token (not the string "null", LangGraph's type of a None value) is written again by
the standard library. orjson refuses integers past 64 bits, and types the standard library
refuses too (dataclasses, datetimes): those go to the standard library for its answer or
its error (orjson does write UUIDs and enums, which the standard library refuses). Reading
falls back the same way (`NaN` in an answer, huge integers).
"""

from __future__ import annotations

import json
from types import ModuleType
from typing import Any

orjson: ModuleType | None
try:
    import orjson
except ImportError:  # pragma: no cover - the langgraph and test extras install it
    orjson = None

_SEPARATORS = (",", ":")


def dumps(value: Any) -> bytes:
    """`json.dumps(value, separators=(",", ":")).encode()`, fast when it can be."""
    if orjson is not None:
        try:
            out: bytes = orjson.dumps(value, option=_OPTIONS)
        except TypeError:
            pass
        else:
            if not _has_null(out):  # no None, so no NaN or infinity made one
                return out
    return json.dumps(value, separators=_SEPARATORS).encode()


def _has_null(out: bytes) -> bool:
    """Whether compact JSON holds a null token (a value, an item, the whole): one follows
    ':', ',' or '[' or starts it; inside a string it would follow other characters, or at
    worst send that value the slow way. Plain substring searches: the regular expression
    this was (an alternation first) scanned byte by byte, ~20 us for a LangGraph put's
    600-byte header, the largest piece of its client CPU after serializing."""
    return b":null" in out or b",null" in out or b"[null" in out or out.startswith(b"null")


def dumps_floatless(value: Any) -> bytes:
    """`dumps` of a value that holds no float (names, ids, sizes, None): every null in
    orjson's output is then a None, so none needs writing again."""
    if orjson is not None:
        try:
            out: bytes = orjson.dumps(value, option=_OPTIONS)
        except TypeError:
            pass
        else:
            return out
    return json.dumps(value, separators=_SEPARATORS).encode()


def loads(data: bytes) -> Any:
    """`json.loads(data)`, fast when it can be; ValueError for what is not JSON."""
    if orjson is not None:
        try:
            return orjson.loads(data)
        except ValueError:
            pass
    return json.loads(data)


# int keys as "1", as the standard library writes them; dataclasses and datetimes refused
_OPTIONS = (
    0
    if orjson is None
    else orjson.OPT_NON_STR_KEYS
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
)
