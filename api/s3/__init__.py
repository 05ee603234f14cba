"""The S3-compatible endpoint: frameworks that checkpoint to `s3://` checkpoint into the
vault (docs/API.md, "S3 endpoint"). `s3_context` is the one thing the service needs."""

from .app import s3_context

__all__ = ["s3_context"]
