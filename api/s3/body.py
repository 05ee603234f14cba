"""Request bodies as S3 clients send them: plain, or aws-chunked.

Recent SDKs send PutObject and UploadPart bodies in the aws-chunked encoding (boto3 since
1.36 adds a CRC32 checksum as a trailer, `STREAMING-UNSIGNED-PAYLOAD-TRAILER`; Java SDKs
sign each chunk, `STREAMING-AWS4-HMAC-SHA256-PAYLOAD`). `Body` yields the object's bytes
in pieces whatever the encoding, checks each chunk's signature (chained from the request's
signature) or, for a plain body with a declared SHA-256, the whole body's digest at its
end, so a handler stores nothing it has not checked by the time it attaches the object.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator

from aiohttp import StreamReader

from ..http import read_up_to
from .errors import S3Error, invalid_argument
from .sigv4 import STREAMING, STREAMING_SIGNED, STREAMING_SIGNED_TRAILER, Signed, chunk_signature

PIECE = 8 << 20  # bytes handed to the engine at a time (api/routes/uploads.py's piece)
MAX_CHUNK_HEADER = 4096  # bytes of one aws-chunked chunk header or trailer line


def _mismatch() -> S3Error:
    return S3Error(
        "XAmzContentSHA256Mismatch",
        400,
        "The provided 'x-amz-content-sha256' header does not match what was computed.",
    )


def _bad_signature() -> S3Error:
    return S3Error(
        "SignatureDoesNotMatch",
        403,
        "The chunk signature we calculated does not match the signature you provided.",
    )


class Body:
    """The object bytes of one request body, checked as they are read."""

    def __init__(
        self, content: StreamReader, signed: Signed | None, key: bytes | None, encoding: str
    ) -> None:
        self._content = content
        self._signed = signed
        self._key = key
        payload = signed.payload if signed is not None else ""
        self._chunked = payload in STREAMING or "aws-chunked" in encoding
        self._signed_chunks = payload in (STREAMING_SIGNED, STREAMING_SIGNED_TRAILER)
        self._digest = payload if len(payload) == 64 else None

    async def pieces(self) -> AsyncIterator[bytes]:
        """The object's bytes, at most PIECE at a time; raises S3Error on a bad body."""
        if self._chunked:
            async for piece in self._dechunked():
                yield piece
            return
        hasher = hashlib.sha256() if self._digest is not None else None
        while True:
            piece = await read_up_to(self._content, PIECE)
            if hasher is not None:
                hasher.update(piece)
            if piece:
                yield piece
            if len(piece) < PIECE:
                break
        if hasher is not None and hasher.hexdigest() != self._digest:
            raise _mismatch()

    async def _line(self) -> bytes:
        line = await self._content.readuntil(b"\r\n")
        if len(line) > MAX_CHUNK_HEADER:
            raise invalid_argument("aws-chunked header line too long")
        return line[:-2]

    async def _dechunked(self) -> AsyncIterator[bytes]:
        previous = self._signed.signature if self._signed is not None else ""
        pending: list[bytes] = []
        held = 0
        while True:
            try:
                header = (await self._line()).decode("ascii")
            except (ValueError, EOFError, UnicodeDecodeError):
                raise invalid_argument("malformed aws-chunked body") from None
            size_hex, _, ext = header.partition(";")
            try:
                size = int(size_hex, 16)
            except ValueError:
                raise invalid_argument("malformed aws-chunked chunk size") from None
            data = await self._content.readexactly(size) if size else b""
            if self._signed_chunks:
                previous = self._check_chunk(ext, previous, data)
            if size == 0:
                break
            if await self._content.readexactly(2) != b"\r\n":
                raise invalid_argument("malformed aws-chunked body")
            pending.append(data)
            held += size
            if held >= PIECE:  # one copy per piece, not one per chunk
                yield b"".join(pending)
                pending, held = [], 0
        while (await self._line()) != b"":  # trailers (checksums), up to the empty line
            pass
        if pending:
            yield b"".join(pending)

    def _check_chunk(self, ext: str, previous: str, data: bytes) -> str:
        name, _, given = ext.partition("=")
        if name != "chunk-signature" or self._key is None or self._signed is None:
            raise _bad_signature()
        expected = chunk_signature(
            self._key, self._signed, previous, hashlib.sha256(data).hexdigest()
        )
        if expected != given:
            raise _bad_signature()
        return expected
