"""The XML documents of the S3 subset: answers built, request bodies parsed.

Answers use S3's namespace and element names as the API reference gives them, so every
SDK's parser reads them; text is escaped, times are ISO 8601 with milliseconds (what S3
sends and what botocore, s3fs and object_store parse). Request bodies (DeleteObjects,
CompleteMultipartUpload) are small and read whole, at most MAX_XML_BODY bytes.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from xml.sax.saxutils import escape

from .errors import S3Error

NS = "http://s3.amazonaws.com/doc/2006-03-01/"
HEAD = '<?xml version="1.0" encoding="UTF-8"?>\n'
MAX_XML_BODY = 2 << 20  # DeleteObjects names up to 1,000 keys of up to 1 KiB each
MAX_DELETE_KEYS = 1000


def iso(at: float) -> str:
    return datetime.fromtimestamp(at, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def http_date(at: float) -> str:
    return datetime.fromtimestamp(at, timezone.utc).strftime("%a, %d %b %Y %H:%M:%S GMT")


def _el(name: str, value: object) -> str:
    return f"<{name}>{escape(str(value))}</{name}>"


def error(code: str, message: str, resource: str, request_id: str) -> bytes:
    return (
        HEAD
        + "<Error>"
        + _el("Code", code)
        + _el("Message", message)
        + (_el("Resource", resource) if resource else "")
        + _el("RequestId", request_id)
        + "</Error>"
    ).encode()


@dataclass(frozen=True)
class Listed:
    """One object in a listing."""

    key: str
    size: int
    etag: str
    modified: float


def list_objects_v2(
    bucket: str,
    query: dict[str, str],
    objects: Sequence[Listed],
    prefixes: Sequence[str],
    next_token: str | None,
    max_keys: int,
) -> bytes:
    parts = [HEAD, f'<ListBucketResult xmlns="{NS}">', _el("Name", bucket)]
    parts.append(_el("Prefix", query.get("prefix", "")))
    if "delimiter" in query:
        parts.append(_el("Delimiter", query["delimiter"]))
    if "start-after" in query:
        parts.append(_el("StartAfter", query["start-after"]))
    if "continuation-token" in query:
        parts.append(_el("ContinuationToken", query["continuation-token"]))
    parts += [
        _el("MaxKeys", max_keys),
        _el("KeyCount", len(objects) + len(prefixes)),
        _el("IsTruncated", "true" if next_token else "false"),
    ]
    if next_token:
        parts.append(_el("NextContinuationToken", next_token))
    for o in objects:
        parts.append(
            "<Contents>"
            + _el("Key", o.key)
            + _el("LastModified", iso(o.modified))
            + _el("ETag", o.etag)
            + _el("Size", o.size)
            + _el("StorageClass", "STANDARD")
            + "</Contents>"
        )
    parts += [f"<CommonPrefixes>{_el('Prefix', p)}</CommonPrefixes>" for p in prefixes]
    parts.append("</ListBucketResult>")
    return "".join(parts).encode()


def list_buckets(buckets: Iterable[tuple[str, float]], owner: str) -> bytes:
    items = "".join(
        f"<Bucket>{_el('Name', name)}{_el('CreationDate', iso(at))}</Bucket>"
        for name, at in buckets
    )
    owner_xml = f"<Owner>{_el('ID', owner)}{_el('DisplayName', owner)}</Owner>"
    return (
        f'{HEAD}<ListAllMyBucketsResult xmlns="{NS}">{owner_xml}'
        f"<Buckets>{items}</Buckets></ListAllMyBucketsResult>"
    ).encode()


def location() -> bytes:
    return f'{HEAD}<LocationConstraint xmlns="{NS}"></LocationConstraint>'.encode()


def initiated(bucket: str, key: str, upload_id: str) -> bytes:
    return (
        f'{HEAD}<InitiateMultipartUploadResult xmlns="{NS}">{_el("Bucket", bucket)}'
        f"{_el('Key', key)}{_el('UploadId', upload_id)}</InitiateMultipartUploadResult>"
    ).encode()


def completed(bucket: str, key: str, etag: str) -> bytes:
    return (
        f'{HEAD}<CompleteMultipartUploadResult xmlns="{NS}">{_el("Location", f"/{bucket}/{key}")}'
        f"{_el('Bucket', bucket)}{_el('Key', key)}{_el('ETag', etag)}"
        "</CompleteMultipartUploadResult>"
    ).encode()


def copied(etag: str, modified: float) -> bytes:
    return (
        f'{HEAD}<CopyObjectResult xmlns="{NS}">{_el("LastModified", iso(modified))}'
        f"{_el('ETag', etag)}</CopyObjectResult>"
    ).encode()


def deleted(done: Sequence[str], failed: Sequence[tuple[str, S3Error]], quiet: bool) -> bytes:
    ok = "" if quiet else "".join(f"<Deleted>{_el('Key', k)}</Deleted>" for k in done)
    bad = "".join(
        f"<Error>{_el('Key', k)}{_el('Code', e.code)}{_el('Message', e.message)}</Error>"
        for k, e in failed
    )
    return f'{HEAD}<DeleteResult xmlns="{NS}">{ok}{bad}</DeleteResult>'.encode()


def _malformed() -> S3Error:
    return S3Error(
        "MalformedXML", 400, "The XML you provided was not well-formed or did not validate."
    )


def _parse(body: bytes) -> ET.Element:
    if b"<!DOCTYPE" in body or b"<!ENTITY" in body:  # no entity expansion, ever
        raise _malformed()
    try:
        return ET.fromstring(body)
    except ET.ParseError:
        raise _malformed() from None


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _children(el: ET.Element, name: str) -> list[ET.Element]:
    return [c for c in el if _local(c.tag) == name]


def _text(el: ET.Element, name: str) -> str | None:
    found = _children(el, name)
    return found[0].text or "" if found else None


def parse_delete(body: bytes) -> tuple[list[str], bool]:
    """DeleteObjects: the keys, and whether only errors are to be answered (Quiet)."""
    root = _parse(body)
    if _local(root.tag) != "Delete":
        raise _malformed()
    keys = []
    for obj in _children(root, "Object"):
        key = _text(obj, "Key")
        if key is None:
            raise _malformed()
        keys.append(key)
    if not keys or len(keys) > MAX_DELETE_KEYS:
        raise _malformed()
    return keys, (_text(root, "Quiet") or "").strip().lower() == "true"


def parse_complete(body: bytes) -> list[tuple[int, str]]:
    """CompleteMultipartUpload: (part number, ETag) in the order given."""
    root = _parse(body)
    if _local(root.tag) != "CompleteMultipartUpload":
        raise _malformed()
    parts = []
    for part in _children(root, "Part"):
        number, etag = _text(part, "PartNumber"), _text(part, "ETag")
        if number is None or not number.strip().isdigit():
            raise _malformed()
        parts.append((int(number), (etag or "").strip()))
    if not parts:
        raise _malformed()
    return parts


def buckets(body: bytes) -> list[tuple[str, float]]:
    """Another shard owner's ListBuckets answer (api/s3/cluster.py): (name, created)."""
    root = _parse(body)
    out = []
    for listed in _children(root, "Buckets"):
        for bucket in _children(listed, "Bucket"):
            name, created = _text(bucket, "Name"), _text(bucket, "CreationDate")
            if name is None or created is None:
                raise _malformed()
            out.append((name, datetime.fromisoformat(created).timestamp()))
    return out
