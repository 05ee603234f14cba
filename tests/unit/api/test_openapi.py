"""The OpenAPI schemas are derived from the protocol's records, field for field."""

from __future__ import annotations

import dataclasses

import pytest

from api.openapi import RECORDS, component_schemas, type_schema


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: c.__name__)
def test_every_record_field_is_in_its_schema(cls: type) -> None:
    schema = component_schemas()[cls.__name__]
    assert list(schema["properties"]) == [f.name for f in dataclasses.fields(cls)]


def test_checkpoint_schema_keeps_the_contract_fields() -> None:
    schemas = component_schemas()
    record = schemas["Checkpoint"]
    contract = ["id", "namespace", "parent", "created_at", "metadata", "tags", "pinned"]
    contract += ["validity", "files", "size", "tier"]
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
    error = component_schemas()["Error"]
    body = error["properties"]["error"]
    assert body["required"] == ["code", "message"]
    assert "key_unavailable" in body["properties"]["code"]["enum"]


def test_type_schema_refuses_what_it_cannot_describe() -> None:
    with pytest.raises(TypeError):
        type_schema(set[int])
