"""client/fastjson.py: orjson's speed, the standard library's meaning.

What a bundle header or an answer means must not depend on which writer ran: a NaN in
metadata is still written as the standard library writes it (the server refuses it rather
than storing a null), int keys become strings, huge ints and refused types go the slow way.
"""

from __future__ import annotations

import datetime
import json
import math
from typing import Any

import pytest

from checkpoint_vault.client import fastjson

SAME = [
    {"metadata": {"source": "loop", "step": 3, "parents": {}}, "tags": ["lg:ns:"], "n": 1.5},
    {"parent": None, "channels": {"branch:to:tool": "null"}},  # a None and the string "null"
    {"text": 'é \u2028 \x01 "quoted" \\', "nested": [[1, [2, {"a": None}]], []]},
    {1: "int key", 2.5: "float key", False: "bool key"},
    {"big": 2**70, "negative": -(2**64)},
    ["a:null", ",null", "[null"],  # strings that only look like a null token
    None,
    "plain",
]


@pytest.mark.parametrize("value", SAME, ids=range(len(SAME)))
def test_what_it_writes_reads_back_as_what_json_dumps_wrote(value: Any) -> None:
    assert json.loads(fastjson.dumps(value)) == json.loads(json.dumps(value))
    assert json.loads(fastjson.dumps_floatless(value)) == json.loads(json.dumps(value))


def test_the_fast_writer_runs_when_nothing_needs_the_slow_one() -> None:
    """The tests run with orjson installed (the test extra): compact output, UTF-8 as is."""
    assert fastjson.orjson is not None
    assert fastjson.dumps({"a": ["é", 1]}) == '{"a":["é",1]}'.encode()


@pytest.mark.parametrize("number", [math.nan, math.inf, -math.inf])
def test_non_finite_numbers_are_written_as_the_standard_library_writes_them(
    number: float,
) -> None:
    """orjson would write null, and the server would store it; the standard library's
    NaN / Infinity is what the server refuses (metadata must be finite)."""
    out = fastjson.dumps({"metadata": {"loss": number}})
    assert out == json.dumps({"metadata": {"loss": number}}, separators=(",", ":")).encode()
    assert b"null" not in out


@pytest.mark.parametrize("value", [math.nan, [math.inf], [1, -math.inf], {"a": [0, math.nan]}])
def test_a_non_finite_number_anywhere_goes_the_slow_way(value: Any) -> None:
    """Where orjson's null can stand: the whole output, an item first or later, a value
    (the substring checks that replaced a regular expression see each of them)."""
    assert fastjson.dumps(value) == json.dumps(value, separators=(",", ":")).encode()


def test_types_json_refuses_are_refused() -> None:
    with pytest.raises(TypeError):
        fastjson.dumps({"when": datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)})
    with pytest.raises(TypeError):
        fastjson.dumps({"ids": {1, 2}})


def test_reading_takes_what_json_loads_takes() -> None:
    assert fastjson.loads(b'{"a": [1, "b", null]}') == {"a": [1, "b", None]}
    assert fastjson.loads(b"[1180591620717411303424]") == [2**70]
    assert math.isnan(fastjson.loads(b'{"x": NaN}')["x"])
    with pytest.raises(ValueError, match="."):
        fastjson.loads(b"{not json")
