"""A read from one node to another on behalf of an S3 caller: checked as S3 checks it.

The owner serves a file of a checkpoint not adopted yet from the node of the part that
holds it (api/cluster/durable.py), node to node, as the caller: the JSON API's caller
lends its `Authorization: Bearer`; an S3 caller has no token to lend (its requests carry
a SigV4 signature, never the token). Every node holds every token's secret hash (the
cluster mirrors the token table, cluster/tokens.py), and a token's S3 secret derives
from that hash (protocol/_s3.py), so the owner signs the node-to-node request with the
caller's S3 credentials (api/s3/signing.py `as_caller`), and the part node checks it as
its S3 endpoint would (`signed_principal`): the same token, the same scopes, nothing new
to trust. The part node accepts such a signature on `GET|HEAD /v1/parts/{id}/files/{name}`
only; the rest of the JSON API stays Bearer-only.
"""

from __future__ import annotations

import re

from aiohttp import web

from ..auth import Principal
from ..errors import Unauthorized
from ..keys import TOKENS
from ..s3.errors import S3Error
from ..s3.signing import authenticate

PART_FILE = re.compile(r"/v1/parts/[^/]+/files/.+")


def signed_principal(request: web.Request) -> Principal:
    """The caller of a part-file read an owner signed for an S3 caller (module doc); the
    token's rate is charged here, as the S3 endpoint charges it."""
    if request.method not in ("GET", "HEAD") or not PART_FILE.fullmatch(request.path):
        raise Unauthorized(
            "a SigV4 signature is accepted only on reads of a part's files; use "
            "'Authorization: Bearer <token>'"
        )
    request.app[TOKENS].refresh()  # a worker's copy: a revocation holds here too
    try:
        return authenticate(request)
    except S3Error as e:
        raise Unauthorized(f"signature refused: {e.message}") from None


__all__ = ["PART_FILE", "signed_principal"]
