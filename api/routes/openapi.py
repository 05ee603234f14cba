"""The OpenAPI 3 document, generated from the route table so it cannot drift from it.

Each operation's summary is its handler's docstring; parameters come from the path
template. The component schemas are derived from the protocol's record dataclasses
(protocol), the same types the server answers with and the client parses with.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from typing import Any, Union

from aiohttp import web

from checkpoint_vault import protocol as protocol

from .. import __version__
from ..auth import PUBLIC_PATHS, PUBLIC_PREFIXES

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
    protocol.GcReport,
    protocol.CompactReport,
    protocol.CheckReport,
    protocol.Drift,
    protocol.VerifyReport,
    protocol.RetentionReport,
    protocol.RetentionPlan,
    protocol.PolicyRecord,
    protocol.RetentionRules,
    protocol.KeepBestRule,
    protocol.TieringReport,
    protocol.TierPlan,
    protocol.PromotePlan,
    protocol.HotBytes,
    protocol.RepackSummary,
    protocol.MoveSummary,
    protocol.CatalogBackup,
    protocol.TokenRecord,
    protocol.TokenIssued,
    protocol.AuditEntry,
    protocol.StatsReport,
    protocol.TierTotals,
    protocol.DiskSpace,
    protocol.CodecShare,
    protocol.QuotaUse,
    protocol.ReplicationStatus,
    protocol.StandbyStatus,
    protocol.Usage,
    protocol.Promotion,
    protocol.Health,
    protocol.CheckpointWritten,
    protocol.NamespaceBytes,
    protocol.StorageSample,
    protocol.PartSaved,
    protocol.PartRecord,
    protocol.PartFile,
)
_PRIMITIVES: dict[object, dict[str, Any]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
}
_REF = "#/components/schemas/"


def _type_schema(hint: object) -> dict[str, Any]:
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
            return {"anyOf": [_type_schema(a) for a in args]}
        schema = _type_schema(inner[0])
        if "type" in schema:
            return {**schema, "type": [schema["type"], "null"]}
        return {"anyOf": [schema, {"type": "null"}]}
    if origin is list:
        return {"type": "array", "items": _type_schema(args[0])}
    if origin is dict:
        values = _type_schema(args[1])
        return {"type": "object", **({"additionalProperties": values} if values else {})}
    raise TypeError(f"no JSON schema for {hint!r}")


def _record_schema(cls: type[Any]) -> dict[str, Any]:
    """An object schema from a protocol dataclass: one property per field, all required
    except those marked optional (absent from the JSON when unset)."""
    hints = typing.get_type_hints(cls)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for f in dataclasses.fields(cls):
        properties[f.name] = {**_type_schema(hints[f.name]), **f.metadata.get("schema", {})}
        if not f.metadata.get("optional"):
            required.append(f.name)
    # Figures the record computes from its fields and puts on the wire (protocol/_wire.py, DERIVED).
    derived: dict[str, Any] = getattr(cls, "DERIVED", {})
    properties.update(derived)
    required.extend(derived)
    return {"type": "object", "required": required, "properties": properties}


def _component_schemas() -> dict[str, Any]:
    schemas = {cls.__name__: _record_schema(cls) for cls in RECORDS}
    # The error envelope every failing route answers: {"error": ErrorBody}, inline as the
    # document has always had it.
    schemas["Error"] = {
        "type": "object",
        "required": ["error"],
        "properties": {"error": schemas["ErrorBody"]},
    }
    # The name the document has always used for the live record.
    schemas["Checkpoint"] = schemas["CheckpointRecord"]
    # What a change answers: the record, or to a write-only token only what it wrote.
    schemas["Written"] = {"anyOf": [_ref("Checkpoint"), _ref("CheckpointWritten")]}
    # One save of `POST /v1/saves`: what it would have answered alone (status and record,
    # or status and error, with `retry_after` seconds on a 429 or 503).
    schemas["SaveResult"] = {
        "type": "object",
        "required": ["status"],
        "properties": {
            "status": {"type": "integer", "minimum": 200, "maximum": 599},
            "checkpoint": _ref("Written"),
            "error": schemas["ErrorBody"],
            "retry_after": {"type": "number", "minimum": 0},
        },
    }
    schemas.update(PATTERNS)
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
    "save_many": ("200", _listing("results", _ref("SaveResult"))),
    "get_checkpoint": ("200", _ref("Checkpoint")),
    "get_manifest": ("200", _ref("Manifest")),
    "get_lineage": (
        "200",
        _listing("chain", {"anyOf": [_ref("Checkpoint"), _ref("TombstoneRecord")]}),
    ),
    "patch_checkpoint": ("200", _ref("Written")),
    "fork_checkpoint": ("201", _ref("Checkpoint")),
    "delete_checkpoints": ("200", _ref("BulkDeleted")),
    "open_upload": ("201", _ref("UploadOpened")),
    "put_file": ("201", _ref("FileStored")),
    "commit": ("2XX", _ref("Written")),
    "commit_all": (  # api/routes/commits.py: records in the order of the commits
        "2XX",
        _listing("checkpoints", _ref("Written"), transaction={"type": "string"}),
    ),
    "resolve": ("2XX", _ref("Written")),
    "open_part": ("201", _ref("UploadOpened")),
    "commit_part": ("201", _ref("PartSaved")),
    "list_parts": ("200", _listing("parts", _ref("PartSaved"))),
    "get_part": ("200", _ref("PartRecord")),
    "ship_part": ("200", _ref("PartRecord")),
    "commit_parts": ("201", _ref("Written")),
    "gc": ("200", _ref("GcReport")),
    "compact": ("200", _ref("CompactReport")),
    "check": ("200", _ref("CheckReport")),
    "verify": ("200", _ref("VerifyReport")),
    "retention": ("200", _ref("RetentionReport")),
    "get_policy": ("200", _ref("PolicyRecord")),
    "put_policy": ("200", _ref("PolicyRecord")),
    "tiering": ("200", _ref("TieringReport")),
    "catalog_backup": ("201", _ref("CatalogBackup")),
    "health": ("200", _ref("Health")),
    "stats": ("200", _ref("StatsReport")),
    "get_storage": ("200", _ref("Usage")),
    "promote": ("200", _ref("Promotion")),
    "create_token": ("201", _ref("TokenIssued")),
    "rotate_token": ("201", _ref("TokenIssued")),
    "list_tokens": ("200", _listing("tokens", _ref("TokenRecord"))),
    "audit_log": (
        "200",
        _listing("entries", _ref("AuditEntry"), next={"type": ["string", "null"]}),
    ),
    # The web console's (api/routes/console.py).
    "whoami": (
        "200",
        {
            "type": "object",
            "required": ["name", "scopes", "admin"],
            "properties": {
                "name": {"type": "string"},
                "scopes": {"type": "array", "items": {"type": "string"}},
                "admin": {"type": "boolean"},
            },
        },
    ),
    "stats_history": (
        "200",
        _listing("samples", _ref("StorageSample"), interval={"type": "number"}),
    ),
}
# Routes answering 204 and no body, by handler name.
NO_CONTENT = frozenset(
    {"abort", "abort_upload", "revoke_token", "delete_checkpoint", "release_part"}
)
_OBJECT: dict[str, Any] = {"type": "object"}
# Raw (non-JSON) request bodies, by handler name: what they hold (docs/API.md has the
# formats). The service reads the bytes whatever the Content-Type says, but for one.
BINARY: dict[str, str] = {
    "put_chunk": "the chunk's plaintext; BLAKE3 of it must be the chunk id",
    "put_file": (
        "the file's bytes, any length; on the local socket only, Content-Type "
        f"{protocol.DESCRIPTOR_TYPE}: one byte carrying the open file (SCM_RIGHTS), "
        "sent after 100 Continue"
    ),
    "put_chunks": f"{protocol.CHUNK_BATCH_TYPE}: records of raw id, u32 length, bytes",
    "save_checkpoint": f"{protocol.BUNDLE_TYPE}: header and files",
    "save_many": (
        f"{protocol.SAVES_TYPE}: bundles one after the other, each header naming its "
        f"namespace; 1 to {protocol.MAX_SAVES}"
    ),
}
# Binary bodies with a structure no JSON Schema can state (a hash over the bytes, a framing
# with lengths inside): a schema-valid string of random bytes is almost never one of them,
# and the service answers such a body 400. Said here, per operation, so that a reader (and
# the fuzzer's configuration, tests/schemathesis.toml) knows a 400 is the contract for
# them, not a refusal of valid input.
BINARY_STRUCTURED: dict[str, str] = {
    "put_chunk": "the body's BLAKE3 is not the chunk id in the path",
    "put_chunks": (
        "a record is truncated, claims bytes past the end, or its bytes do not hash to its id"
    ),
    "save_checkpoint": (
        f"not a bundle: magic {protocol.BUNDLE_MAGIC!r}, u32 header length, a JSON header "
        "object with a files list of [name, size] (parsed with the limits of every JSON "
        "body), then the files' bytes, exactly as long as the header says"
    ),
    "save_many": (
        f"not 1 to {protocol.MAX_SAVES} bundles one after the other (each as in a one-request "
        "save), the body exactly as long as they are"
    ),
}
# JSON bodies a request must carry (the others may be empty, meaning {}).
REQUIRED_BODY = frozenset(
    {
        "missing",
        "create_token",
        "fork_checkpoint",
        "delete_checkpoints",
        "open_part",
        "commit_parts",
    }
    | {"commit_all", "prepare", "resolve"}
)
# JSON request bodies, by handler name: what the handler reads (fields beyond these are
# ignored), so a fuzzer's schema-valid bodies are ones the service can accept.
_COMMIT_FILE = {
    "type": "object",
    "required": ["size", "hash", "chunks"],
    "properties": {
        "size": {"type": "integer", "minimum": 0},
        "hash": {"$ref": _REF + "ChunkId"},
        "chunks": {"type": "array", "maxItems": 16, "items": {"$ref": _REF + "ChunkId"}},
    },
}
_TAGS = {"type": ["array", "null"], "maxItems": 64, "items": {"$ref": _REF + "Tag"}}
REQUESTS: dict[str, dict[str, Any]] = {
    "delete_checkpoints": {
        "type": "object",
        "properties": {
            "ids": {"type": "array", "items": {"type": "string"}},
            "all": {"type": "boolean", "const": True},
        },
        "oneOf": [{"required": ["ids"]}, {"required": ["all"]}],
    },
    "commit": {
        "type": "object",
        "properties": {
            "files": {
                "type": ["object", "null"],
                "propertyNames": {"$ref": _REF + "FileName"},
                "additionalProperties": _COMMIT_FILE,
            }
        },
    },
    "missing": {
        "type": "object",
        "required": ["chunks"],
        "properties": {
            "chunks": {"type": "array", "maxItems": 100, "items": {"$ref": _REF + "ChunkId"}}
        },
    },
    "open_upload": {
        "type": "object",
        "properties": {
            "metadata": {"type": ["object", "null"]},
            "tags": _TAGS,
        },
    },
    "create_token": {
        "type": "object",
        "required": ["name", "scopes"],
        "properties": {
            "name": {"$ref": _REF + "TokenName"},
            "scopes": {"type": "array", "minItems": 1, "items": {"enum": ["admin", "read:*"]}},
        },
    },
    "open_part": {
        "type": "object",
        "required": ["namespace"],
        "properties": {
            "namespace": {"$ref": _REF + "Namespace"},
            "ttl": {"type": ["number", "null"], "exclusiveMinimum": 0},
        },
    },
    "commit_parts": {
        "type": "object",
        "required": ["parts"],
        "properties": {
            "parts": {
                "type": "array",
                "minItems": 1,
                "maxItems": 16,
                "items": {
                    "type": "object",
                    "required": ["node", "id"],
                    "properties": {
                        "node": {"type": "string", "description": "a node's [cluster] url"},
                        "id": {"type": "string", "maxLength": 64},
                    },
                },
            },
            "metadata": {"type": ["object", "null"]},
            "tags": _TAGS,
            "ship_timeout": {"type": "number", "exclusiveMinimum": 0, "maximum": 3600},
        },
    },
    "fork_checkpoint": {
        "type": "object",
        "required": ["namespace"],
        "properties": {"namespace": {"$ref": _REF + "Namespace"}, "tags": _TAGS},
    },
    # Commits across namespaces (api/routes/commits.py).
    "commit_all": {
        "type": "object",
        "required": ["commits"],
        "properties": {
            "transaction": {"$ref": _REF + "TransactionId"},
            "commits": {
                "type": "array",
                "minItems": 1,
                "maxItems": 64,
                "items": {
                    "type": "object",
                    "required": ["namespace", "upload_id"],
                    "properties": {
                        "namespace": {"$ref": _REF + "Namespace"},
                        "upload_id": {"type": "string", "minLength": 1, "maxLength": 64},
                        "files": {
                            "type": ["object", "null"],
                            "propertyNames": {"$ref": _REF + "FileName"},
                            "additionalProperties": _COMMIT_FILE,
                        },
                    },
                },
            },
        },
    },
    "prepare": {
        "type": "object",
        "required": ["transaction", "namespace"],
        "properties": {
            "transaction": {"$ref": _REF + "TransactionId"},
            "namespace": {"$ref": _REF + "Namespace"},
        },
    },
    "resolve": {
        "type": "object",
        "required": ["transaction"],
        "properties": {"transaction": {"$ref": _REF + "TransactionId"}},
    },
}
REQUESTS["commit_part"] = REQUESTS["commit"]  # a part's upload commits like any
# Path parameters by name (file and token names share `name`: told apart by the path).
# Narrower than what the service accepts where the full rule is not a regular language
# (namespaces of up to 8 '/'-separated segments, file paths): one segment here.
_SEGMENT = "[A-Za-z0-9][A-Za-z0-9._:-]{0,127}"
PARAMETERS: dict[str, dict[str, Any]] = {
    "ns": {"$ref": _REF + "Namespace"},
    "ref": {"type": "string", "pattern": "^(latest|latest-valid|[0-9A-HJKMNP-TV-Z]{26})$"},
    "upload_id": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
    "part": {"type": "string", "pattern": "^[0-9A-HJKMNP-TV-Z]{26}$"},
    "chunk_id": {"$ref": _REF + "ChunkId"},
    "name": {"$ref": _REF + "FileName"},
}
_NAMES_HIDE = protocol.character_class(protocol.HIDDEN_IN_NAMES, schema=True)
PATTERNS: dict[str, dict[str, Any]] = {
    "Namespace": {"type": "string", "pattern": f"^{_SEGMENT}$"},
    "ChunkId": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
    "TransactionId": {"type": "string", "pattern": "^[0-9a-f]{16,64}$"},
    "TokenName": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"},
    # Relative, '/'-separated, no empty, '.' or '..' segment, no control, format or
    # line-separator character (the 1024-byte bound is kept by 255 characters of at most 4
    # bytes). The characters are protocol/_text.py's table.
    "FileName": {
        "type": "string",
        "pattern": r"^(?!\.{1,2}(/|$))(?!.*/\.{1,2}(/|$))(?!.*//)(?!.*/$)"
        f"[^/{_NAMES_HIDE}][^{_NAMES_HIDE}]{{0,254}}$",
        "description": "no control (Cc), format (Cf: bidi controls, zero-width characters "
        "but the joiners U+200C/U+200D) or line/paragraph separator (Zl, Zp) character",
    },
    # 1-128 characters shown as themselves (protocol/_text.py): besides the file names'
    # rule, no private-use (Co) or surrogate (Cs) character.
    "Tag": {
        "type": "string",
        "minLength": 1,
        "maxLength": 128,
        "pattern": f"^[^{protocol.character_class(protocol.HIDDEN_IN_TAGS, schema=True)}]+$",
        "description": "no control (Cc), format (Cf: bidi controls, zero-width characters, "
        "soft hyphen, BOM; the joiners U+200C/U+200D are allowed), line/paragraph separator "
        "(Zl, Zp), private-use (Co) or surrogate (Cs) character; refused with 400 "
        "invalid_request",
    },
}
# Where the id a route answers is used next (OpenAPI links), so a stateful fuzzer gets
# from opening an upload to its routes, and from a checkpoint to its changes.
_UPLOAD = {"upload_id": "$response.body#/upload_id"}
_CKPT = {"ns": "$response.body#/namespace", "ref": "$response.body#/id"}
LINKS: dict[str, dict[str, tuple[str, dict[str, str]]]] = {
    "open_part": {
        "PutFile": ("put_file", _UPLOAD),
        "CommitPart": ("commit_part", _UPLOAD),
    },
    "open_upload": {
        "Missing": ("missing", _UPLOAD),
        "PutChunk": ("put_chunk", _UPLOAD),
        "PutChunks": ("put_chunks", _UPLOAD),
        "PutFile": ("put_file", _UPLOAD),
        "Commit": ("commit", _UPLOAD),
        "Abort": ("abort", _UPLOAD),
    },
    "commit": {
        "Get": ("get_checkpoint", _CKPT),
        "Patch": ("patch_checkpoint", _CKPT),
        "Delete": ("delete_checkpoint", _CKPT),
        "Lineage": ("get_lineage", _CKPT),
        "Fork": ("fork_checkpoint", _CKPT),
    },
    "create_token": {
        "Rotate": ("rotate_token", {"name": "$response.body#/name"}),
        "Revoke": ("revoke_token", {"name": "$response.body#/name"}),
    },
}


# Error answers a route documents besides `default`, by handler name: status -> why.
ANSWERS: dict[str, dict[str, str]] = {
    "commit": {
        "413": "too_large: the commit lists more chunk references (uploads.max_commit_chunks) "
        "or more bytes of files (uploads.max_checkpoint_bytes) than this server takes, or a "
        "file more chunks than its size allows",
    },
}
# A part's upload and each upload of a commit across namespaces are checked as a commit is.
ANSWERS["commit_part"] = ANSWERS["commit"]
ANSWERS["commit_all"] = ANSWERS["commit"]


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _parameter(name: str, raw: str) -> dict[str, Any]:
    schema = PARAMETERS.get(name, {"type": "string"})
    if name == "name" and raw.startswith("/v1/admin/tokens/"):
        schema = _ref("TokenName")
    return {"name": name, "in": "path", "required": True, "schema": schema}


def _success(name: str) -> dict[str, Any]:
    """The success answer of a handler: a protocol record, nothing (204), bytes, or (for
    the routes not yet described field by field) some JSON object."""
    if name in RESPONSES:
        status, schema = RESPONSES[name]
        return {status: {"description": "success", "content": _json(schema)}}
    if name in NO_CONTENT:
        return {"204": {"description": "done"}}
    if name == "metrics":
        text = {"text/plain": {"schema": {"type": "string"}}}
        return {"200": {"description": "Prometheus text exposition", "content": text}}
    if name == "get_file":
        octets = {"application/octet-stream": {"schema": {"type": "string"}}}
        return {
            "200": {"description": "the file", "content": octets},
            "206": {"description": "a byte range of it", "content": octets},
            "304": {"description": "not modified (If-None-Match)"},
        }
    if name == "ui_redirect":
        return {"302": {"description": "to /ui/ (Location: ui/)"}}
    if name in ("ui_page", "ui_asset"):  # the web console (api/routes/ui.py)
        files = {t: {"schema": {"type": "string"}} for t in ("text/html", "text/javascript")}
        return {
            "200": {"description": "the console's page or one of its files", "content": files},
            "304": {"description": "not modified (If-None-Match)"},
        }
    if name == "openapi_handler":
        return {"200": {"description": "this document", "content": _json(_OBJECT)}}
    return {"2XX": {"description": "success", "content": _json(_OBJECT)}}


def _operation(route: web.AbstractRoute, raw: str) -> dict[str, Any]:
    doc = (route.handler.__doc__ or "").strip().splitlines()
    name = getattr(route.handler, "__name__", "handler")
    op: dict[str, Any] = {
        "summary": doc[0] if doc else "",
        "operationId": name,
        "parameters": [_parameter(p, raw) for p in _PARAM.findall(raw)],
        "responses": {
            **_success(name),
            "default": {"description": "error", "content": _json(_ref("Error"))},
        },
    }
    if name in REQUESTS:
        op["requestBody"] = {"required": name in REQUIRED_BODY, "content": _json(REQUESTS[name])}
    if name in BINARY:
        raw_body = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
        op["requestBody"] = {"description": BINARY[name], "content": raw_body}
    if name in BINARY_STRUCTURED:
        why = f"the body is not what it must be: {BINARY_STRUCTURED[name]}"
        op["responses"]["400"] = {"description": why, "content": _json(_ref("Error"))}
    for status, why in ANSWERS.get(name, {}).items():
        op["responses"][status] = {"description": why, "content": _json(_ref("Error"))}
    for status, answer in op["responses"].items():
        if name in LINKS and status.startswith("2"):
            answer["links"] = {
                link: {"operationId": target, "parameters": params}
                for link, (target, params) in LINKS[name].items()
            }
    return op


def build_openapi(app: web.Application) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for route in app.router.routes():
        if route.method == "HEAD" or route.resource is None:
            continue
        raw = route.resource.canonical
        path = _PARAM.sub(r"{\1}", raw)
        op = _operation(route, raw)
        if path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES):  # no token needed
            op["security"] = []
        paths.setdefault(path, {})[route.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "Checkpoint Vault", "version": __version__},
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": _component_schemas(),
        },
        "paths": dict(sorted(paths.items())),
    }


async def openapi_handler(request: web.Request) -> web.Response:
    """This document."""
    return web.json_response(build_openapi(request.app))
