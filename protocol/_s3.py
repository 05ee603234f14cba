"""S3 credentials of a vault token: an access key id and a secret derived from the token.

The S3 endpoint (api/s3/) authenticates by AWS Signature Version 4, which needs a secret
both sides hold. The token itself is never sent: the access key id names the token (its
key id), and the secret is an HMAC keyed by the SHA-256 of the token's secret, which is
what the server stores (vault/tokens.py). So `ckpt token s3` computes the pair from the
token on the client's machine, and the server from its token table, with no new state.
The cost, written down in docs/SECURITY.md: whoever reads the catalog's token hashes can
sign S3 requests (as with any SigV4 service, the verifier holds a signing-capable key),
though never present a Bearer token.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

S3_KEY_PREFIX = "CKPT"  # an access key id reads CKPT<key id of the token>
_LABEL = b"checkpoint-vault s3 secret v1"


def s3_secret_from_hash(secret_hash: str) -> str:
    """The S3 secret access key of a token whose secret hashes (SHA-256, hex) to this."""
    mac = hmac.new(bytes.fromhex(secret_hash), _LABEL, hashlib.sha256).digest()
    return base64.b64encode(mac).decode().rstrip("=").replace("+", "A").replace("/", "B")


def s3_credentials(token: str) -> tuple[str, str]:
    """(access key id, secret access key) of a token `ckpt_<key id>_<secret>`."""
    parts = token.strip().split("_", 2)
    if len(parts) != 3 or parts[0] != "ckpt" or not parts[1] or not parts[2]:
        raise ValueError("not a vault token (ckpt_<key id>_<secret>)")
    secret_hash = hashlib.sha256(parts[2].encode()).hexdigest()
    return S3_KEY_PREFIX + parts[1], s3_secret_from_hash(secret_hash)
