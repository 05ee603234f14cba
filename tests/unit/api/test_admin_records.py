"""The admin records (protocol/_maintenance.py, _admin.py): each round-trips through its
JSON, that JSON is what the OpenAPI document says it is, optional fields are absent when
unset, derived figures are on the wire, and a malformed answer is a ValueError naming the
field."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Union

import jsonschema  # type: ignore[import-untyped]  # no stubs installed
import pytest
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from checkpoint_vault import protocol
from checkpoint_vault.api.openapi import RECORDS, _component_schemas
from checkpoint_vault.protocol import (
    CheckReport,
    CompactReport,
    Drift,
    GcReport,
    Health,
    RepackSummary,
    RetentionPlan,
    RetentionReport,
    TokenIssued,
    TokenRecord,
    Usage,
    VerifyReport,
)

ADMIN = [cls for cls in RECORDS if cls.__module__ in ("protocol._admin", "protocol._maintenance")]
# Admin records no route answers (the offline `ckpt catalog restore` prints it): not in
# the OpenAPI document.
OFFLINE = {protocol.ReplicaRestored}


def example(hint: Any, depth: int = 0) -> Any:
    """A value of every field (optional ones set too), so a round trip covers them all."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return example(next(a for a in args if a is not type(None)), depth)
    if origin is list:
        return [example(args[0], depth + 1)]
    if origin is dict:
        return {"k": example(args[1], depth + 1)}
    if origin is tuple:
        return tuple(example(a, depth + 1) for a in args)
    if hint is Drift:  # a drift names a chunk or an entry, never both
        return Drift(1, 2, chunk="ab")
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        hints = typing.get_type_hints(hint)
        return hint(**{f.name: _field(f, hints[f.name], depth) for f in dataclasses.fields(hint)})
    return {str: "s", int: 7, float: 1.5, bool: True}.get(hint, {"any": 1})


def _field(f: dataclasses.Field[Any], hint: Any, depth: int) -> Any:
    enum = f.metadata.get("schema", {}).get("enum")
    return enum[0] if enum else example(hint, depth + 1)


def instance(cls: type[Any]) -> Any:
    record = example(cls)
    if cls is Health:  # only a standby has a lag
        record = dataclasses.replace(record, role="standby")
    return record


def validator(name: str) -> jsonschema.Draft202012Validator:
    """Validates against component `name` of the OpenAPI document (its refs resolved)."""
    document = {"components": {"schemas": _component_schemas()}}
    registry: Registry[Any] = Registry().with_resource(
        "urn:openapi", DRAFT202012.create_resource(document)
    )
    ref = {"$ref": f"urn:openapi#/components/schemas/{name}"}
    return jsonschema.Draft202012Validator(ref, registry=registry)


def test_every_admin_record_is_in_the_document() -> None:
    exported = {
        getattr(protocol, n)
        for n in protocol.__all__
        if getattr(getattr(protocol, n), "__module__", "")
        in ("protocol._admin", "protocol._maintenance")
    }
    assert exported - OFFLINE == set(ADMIN)


@pytest.mark.parametrize("cls", [*ADMIN, *OFFLINE], ids=lambda c: c.__name__)
def test_round_trips_and_matches_its_schema(cls: type[Any]) -> None:
    record = instance(cls)
    wire = record.to_wire()
    assert cls.from_wire(wire) == record
    if cls not in OFFLINE:
        validator(cls.__name__).validate(wire)


def test_optional_fields_are_absent_when_unset() -> None:
    wire = GcReport(chunks_deleted=3).to_wire()
    assert wire == {
        "chunks_deleted": 3,
        "bytes_freed": 0,
        "uploads_expired": 0,
        "keys_expired": 0,
        "dry_run": False,
    }
    repacked = GcReport(packs_rewritten=1, pack_bytes_freed=9).to_wire()
    assert (repacked["packs_rewritten"], repacked["pack_bytes_freed"]) == (1, 9)


def test_derived_figures_are_on_the_wire() -> None:
    assert CheckReport().to_wire()["ok"] is True
    assert CheckReport(drift=[Drift(2, 1, chunk="ab")]).to_wire()["ok"] is False
    assert CompactReport(bytes_before=10, bytes_after=4).to_wire()["saved_bytes"] == 6
    assert VerifyReport(bytes_checked=3_000_000, seconds=2.0).to_wire()["mb_per_s"] == 1.5
    assert Usage(logical_bytes=30, stored_bytes=10).to_wire()["ratio"] == 3.0
    assert Usage().to_wire()["ratio"] is None
    plans = {"a": RetentionPlan({"1": ["last"]}, ["2"], 5), "b": RetentionPlan({}, ["3"], 1)}
    wire = RetentionReport(False, plans, ["2"]).to_wire()
    assert (wire["delete"], wire["keep"], wire["reclaimable_bytes"]) == (["2", "3"], ["1"], 6)
    assert wire["namespaces"]["a"] == {
        "keep": {"1": ["last"]},
        "delete": ["2"],
        "reclaimable_bytes": 5,
    }


def test_shapes_the_routes_have_always_answered() -> None:
    assert list(Drift(5, 1, entry="cd").to_wire()) == ["entry", "refs", "expected"]
    assert list(RepackSummary(2, 0.5, dead_bytes=9).to_wire()) == ["below", "packs", "dead_bytes"]
    primary = Health("ok", "1", "primary", "i").to_wire()
    assert "lag_seconds" not in primary
    assert "local_socket" not in primary
    assert Health("ok", "1", "standby", "i").to_wire()["lag_seconds"] is None
    token = TokenRecord("t", ["admin"], 1.0)
    issued = TokenIssued.of(token, "secret").to_wire()
    assert issued == {**token.to_wire(), "token": "secret"}  # warnings on create only


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "GcReport must be a JSON object"),
        ({"chunks_deleted": "1"}, "GcReport.chunks_deleted must be an integer"),
        ({"chunks_deleted": True}, "GcReport.chunks_deleted must be an integer"),
        ({"dry_run": 1}, "GcReport.dry_run must be a boolean"),
    ],
)
def test_a_malformed_answer_names_the_field(data: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GcReport.from_wire(data)


def test_a_missing_required_field_is_refused() -> None:
    with pytest.raises(ValueError, match="RetentionReport.dry_run is missing"):
        RetentionReport.from_wire({"namespaces": {}})
    with pytest.raises(ValueError, match=r"CheckReport.drift\[\].refs must be an integer"):
        CheckReport.from_wire({"drift": [{"chunk": "ab", "refs": None, "expected": 1}]})
