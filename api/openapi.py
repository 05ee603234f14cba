"""The OpenAPI 3 document, generated from the route table so it cannot drift from it.

Each operation's summary is its handler's docstring; parameters come from the path
template. The component schemas are derived from the protocol's record dataclasses
(client/protocol), the same types the server answers with and the client parses with.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from typing import Any, Union

from aiohttp import web

import client.protocol as protocol

from . import __version__

_PARAM = re.compile(r"\{(\w+)(?::[^}]*)?\}")

# The records the document describes, each under its class name. Their schemas are derived
# from the dataclasses (fields, type hints, field metadata), never written by hand here.
RECORDS: tuple[type[Any], ...] = (
    protocol.CheckpointRecord,
    protocol.TombstoneRecord,
    protocol.Validity,
    protocol.FileInfo,
    protocol.Manifest,
    protocol.ManifestFile,
    protocol.ChunkSpan,
    protocol.NamespaceEntry,
    protocol.BulkDeleted,
    protocol.UploadOpened,
    protocol.FileStored,
    protocol.CommitFile,
    protocol.ErrorBody,
)
_PRIMITIVES: dict[object, dict[str, Any]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
}
_REF = "#/components/schemas/"


def type_schema(hint: object) -> dict[str, Any]:
    """The JSON schema of a protocol type hint: primitives, `X | None`, list, dict, records;
    `Any` (the protocol's `JSON`) is any JSON value."""
    if hint is Any:
        return {}
    if hint in _PRIMITIVES:
        return dict(_PRIMITIVES[hint])
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return {"$ref": _REF + hint.__name__}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1:
            return {"anyOf": [type_schema(a) for a in args]}
        schema = type_schema(inner[0])
        if "type" in schema:
            return {**schema, "type": [schema["type"], "null"]}
        return {"anyOf": [schema, {"type": "null"}]}
    if origin is list:
        return {"type": "array", "items": type_schema(args[0])}
    if origin is dict:
        values = type_schema(args[1])
        return {"type": "object", **({"additionalProperties": values} if values else {})}
    raise TypeError(f"no JSON schema for {hint!r}")


def record_schema(cls: type[Any]) -> dict[str, Any]:
    """An object schema from a protocol dataclass: one property per field, all required
    except those marked optional (absent from the JSON when unset)."""
    hints = typing.get_type_hints(cls)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for f in dataclasses.fields(cls):
        properties[f.name] = {**type_schema(hints[f.name]), **f.metadata.get("schema", {})}
        if not f.metadata.get("optional"):
            required.append(f.name)
    return {"type": "object", "required": required, "properties": properties}


def component_schemas() -> dict[str, Any]:
    schemas = {cls.__name__: record_schema(cls) for cls in RECORDS}
    # The error envelope every failing route answers: {"error": ErrorBody}, inline as the
    # document has always had it.
    schemas["Error"] = {
        "type": "object",
        "required": ["error"],
        "properties": {"error": schemas["ErrorBody"]},
    }
    # The name the document has always used for the live record.
    schemas["Checkpoint"] = schemas["CheckpointRecord"]
    return schemas


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": _REF + name}


def _listing(key: str, items: dict[str, Any], **more: Any) -> dict[str, Any]:
    props = {key: {"type": "array", "items": items}, **more}
    return {"type": "object", "required": list(props), "properties": props}


# Success answers of the routes that return protocol records, by handler name: (status,
# schema). Routes not listed document only their error answer.
RESPONSES: dict[str, tuple[str, dict[str, Any]]] = {
    "list_namespaces": ("200", _listing("namespaces", _ref("NamespaceEntry"))),
    "list_checkpoints": (
        "200",
        _listing("checkpoints", _ref("Checkpoint"), next={"type": ["string", "null"]}),
    ),
    "save_checkpoint": ("201", _ref("Checkpoint")),
    "get_checkpoint": ("200", _ref("Checkpoint")),
    "get_manifest": ("200", _ref("Manifest")),
    "get_lineage": (
        "200",
        _listing("chain", {"anyOf": [_ref("Checkpoint"), _ref("TombstoneRecord")]}),
    ),
    "patch_checkpoint": ("200", _ref("Checkpoint")),
    "fork_checkpoint": ("201", _ref("Checkpoint")),
    "delete_checkpoints": ("200", _ref("BulkDeleted")),
    "open_upload": ("201", _ref("UploadOpened")),
    "put_file": ("201", _ref("FileStored")),
    "commit": ("201", _ref("Checkpoint")),
}
# JSON request bodies built from protocol records, by handler name.
REQUESTS: dict[str, dict[str, Any]] = {
    "delete_checkpoints": {
        "type": "object",
        "properties": {"ids": {"type": "array", "items": {"type": "string"}}},
    },
    "commit": {
        "type": "object",
        "properties": {"files": {"type": "object", "additionalProperties": _ref("CommitFile")}},
    },
}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _operation(route: web.AbstractRoute, raw: str) -> dict[str, Any]:
    doc = (route.handler.__doc__ or "").strip().splitlines()
    name = getattr(route.handler, "__name__", "handler")
    op: dict[str, Any] = {
        "summary": doc[0] if doc else "",
        "operationId": name,
        "parameters": [
            {"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
            for p in _PARAM.findall(raw)
        ],
        "responses": {"default": {"description": "error", "content": _json(_ref("Error"))}},
    }
    if name in RESPONSES:
        status, schema = RESPONSES[name]
        op["responses"][status] = {"description": "success", "content": _json(schema)}
    if name in REQUESTS:
        op["requestBody"] = {"content": _json(REQUESTS[name])}
    return op


def build_openapi(app: web.Application) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for route in app.router.routes():
        if route.method == "HEAD" or route.resource is None:
            continue
        raw = route.resource.canonical
        path = _PARAM.sub(r"{\1}", raw)
        op = _operation(route, raw)
        if path == "/v1/health":
            op["security"] = []
        paths.setdefault(path, {})[route.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "Checkpoint Vault", "version": __version__},
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": component_schemas(),
        },
        "paths": dict(sorted(paths.items())),
    }


async def openapi_handler(request: web.Request) -> web.Response:
    """This document."""
    return web.json_response(build_openapi(request.app))
