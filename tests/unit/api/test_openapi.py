"""The OpenAPI schemas are derived from the protocol's records, field for field."""

from __future__ import annotations

import dataclasses

import pytest
from aiohttp import web

from checkpoint_vault.api.routes import setup_routes
from checkpoint_vault.api.routes.openapi import (
    RECORDS,
    REQUESTS,
    RESPONSES,
    _component_schemas,
    _type_schema,
    build_openapi,
)


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: c.__name__)
def test_every_record_field_is_in_its_schema(cls: type) -> None:
    schema = _component_schemas()[cls.__name__]
    derived = list(getattr(cls, "DERIVED", {}))
    assert list(schema["properties"]) == [f.name for f in dataclasses.fields(cls)] + derived


def test_checkpoint_schema_keeps_the_contract_fields() -> None:
    schemas = _component_schemas()
    record = schemas["Checkpoint"]
    contract = ["id", "namespace", "parent", "created_at", "metadata", "tags", "pinned"]
    contract += ["validity", "files", "size", "tier"]
    contract += ["durable"]  # issue 44 M2: always answered (true but for commits of parts)
    assert record["required"] == contract
    assert record["properties"]["parent"] == {"type": ["string", "null"]}
    assert record["properties"]["created_at"]["format"] == "date-time"
    validity = schemas["Validity"]["properties"]
    assert validity["state"]["enum"] == ["unverified", "valid", "invalid"]
    assert schemas["FileInfo"]["required"] == ["size", "hash"]
    manifest_file = schemas["ManifestFile"]["properties"]
    assert manifest_file["chunks"]["items"] == {"$ref": "#/components/schemas/ChunkSpan"}
    assert schemas["UploadOpened"]["required"][:1] == ["upload_id"]


def test_error_schema_is_the_error_envelope() -> None:
    error = _component_schemas()["Error"]
    body = error["properties"]["error"]
    assert body["required"] == ["code", "message"]
    assert "key_unavailable" in body["properties"]["code"]["enum"]


def test_type_schema_refuses_what_it_cannot_describe() -> None:
    with pytest.raises(TypeError):
        _type_schema(set[int])


def _refs(node: object) -> set[str]:
    if isinstance(node, dict):
        own = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
        return own.union(*(_refs(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_refs(v) for v in node))
    return set()


def test_route_answers_name_real_handlers_and_every_ref_resolves() -> None:
    app = web.Application()
    setup_routes(app)
    doc = build_openapi(app)
    handlers = {op["operationId"] for ops in doc["paths"].values() for op in ops.values()}
    assert set(RESPONSES) | set(REQUESTS) <= handlers
    schemas = doc["components"]["schemas"]
    for ref in _refs(doc):
        assert ref.removeprefix("#/components/schemas/") in schemas, ref
    commit = doc["paths"]["/v1/uploads/{upload_id}/commit"]["post"]
    # 201 made, 200 a retried commit; the record, or only what was written for a token
    # that may not read the namespace (docs/SECURITY.md)
    assert commit["responses"]["2XX"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Written"
    }
    assert {"$ref": "#/components/schemas/Checkpoint"} in schemas["Written"]["anyOf"]
