"""One place that turns a tier URL into a backend: file://, s3://, gs://, az://, memory://."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from checkpoint_vault.vault.errors import InvalidRequest
from checkpoint_vault.vault.tier import Tier

from .backends.local import LocalTier
from .backends.memory import MemoryTier


def open_tier(name: str, url: str, options: dict[str, Any] | None = None) -> Tier:
    """A backend for `url`. `options` are the backend's settings (for s3: endpoint,
    region, access_key_id, secret_access_key, allow_http); credentials may also come from
    the usual environment variables of each provider."""
    options = dict(options or {})
    parsed = urlparse(url)
    if parsed.scheme == "file":
        return LocalTier(parsed.path, name)
    if parsed.scheme == "memory":
        return MemoryTier(name)
    if parsed.scheme in ("s3", "gs", "az"):
        return _object_store(name, parsed.scheme, parsed.netloc, parsed.path.strip("/"), options)
    raise InvalidRequest(
        f"tier {name}: unsupported URL scheme {parsed.scheme!r} (file, s3, gs, az, memory)"
    )


def _object_store(
    name: str, scheme: str, bucket: str, prefix: str, options: dict[str, Any]
) -> Tier:
    from obstore.store import AzureStore, GCSStore, S3Store

    from .backends.objstore import CLIENT, RETRY, ObjectStoreTier

    if not bucket:
        raise InvalidRequest(f"tier {name}: {scheme}:// URL needs a bucket")
    client: dict[str, Any] = {**CLIENT}
    if options.pop("allow_http", False):
        client["allow_http"] = True
    common: dict[str, Any] = {
        "prefix": prefix or None,
        "retry_config": RETRY,
        "client_options": client,
    }
    if scheme == "s3":
        store: Any = S3Store(bucket, virtual_hosted_style_request=False, **common, **options)
    elif scheme == "gs":
        store = GCSStore(bucket, **common, **options)
    else:
        store = AzureStore(bucket, **common, **options)
    return ObjectStoreTier(store, name)
