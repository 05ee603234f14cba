"""An owner's error answer, raised by the coordinator of a commit across namespaces
(api/txn/coordinator.py `relayed`) as the class of its wire code, the one lookup by code the
engine's tree and the service's share (protocol `TabledError.of_code`, as node/calls.py
does for a worker's errors)."""

from __future__ import annotations

import pytest

from checkpoint_vault.api.ratelimit import RateLimited
from checkpoint_vault.api.txn.coordinator import relayed
from checkpoint_vault.cluster import NotOwner
from checkpoint_vault.protocol import ERROR_SPECS
from checkpoint_vault.vault.errors import MissingChunks, NotFound, PartGone, VaultError

# The codes the coordinator's own table listed: each answers as the owner said.
REFUSALS = [
    "not_found",
    "invalid_request",
    "invalid_name",
    "hash_mismatch",
    "too_large",
    "conflict",
    "transaction_aborted",
    "upload_expired",
    "quota_exceeded",
    "too_many_uploads",
    "forbidden",
    "unauthorized",
]


def _answer(code: str, message: str = "the owner's words", **more: object) -> dict[str, object]:
    return {"error": {"code": code, "message": message, **more}}


@pytest.mark.parametrize("code", REFUSALS)
def test_a_refusal_keeps_the_owners_code_status_and_message(code: str) -> None:
    status = ERROR_SPECS[code].status
    e = relayed(status, _answer(code))
    assert not isinstance(e, NotOwner)
    assert (e.code, e.status, e.message) == (code, status, "the owner's words")  # type: ignore[attr-defined]


def test_the_most_general_class_of_a_code_and_missing_chunks_with_its_list() -> None:
    assert type(relayed(404, _answer("not_found"))) is NotFound
    e = relayed(409, _answer("missing_chunks", "2 missing", missing=["ab", "cd"]))
    assert isinstance(e, MissingChunks)
    assert (e.chunks, e.message) == (["ab", "cd"], "2 missing")


def test_codes_the_table_did_not_list() -> None:
    """A refusal of the request now answers as the owner said (it was a 503 `NotOwner`):
    a part gone is a 409 the client must not retry, a token's rate a 429 with the owner's
    wait. The owner's own state, a failure there or an unknown code: `NotOwner`, as before."""
    gone = relayed(409, _answer("part_gone", "part p1 is gone"))
    assert isinstance(gone, PartGone)
    assert (gone.status, gone.message) == (409, "part p1 is gone")
    limited = relayed(429, _answer("rate_limited"), "3")
    assert isinstance(limited, RateLimited)
    assert (limited.status, limited.retry_after) == (429, 3)
    for status, code in [
        (409, "fenced"),
        (409, "read_only"),
        (408, "body_timeout"),
        (503, "unavailable"),
        (503, "part_unavailable"),
        (500, "internal"),
        (500, "tier_error"),
        (418, "no_such_code"),
    ]:
        e = relayed(status, _answer(code, "why"))
        assert isinstance(e, NotOwner), code
        assert e.message == f"a shard's owner answered {status}: why"
    assert isinstance(relayed(502, "<html>proxy</html>"), NotOwner)


def test_only_classes_of_the_tree_are_picked() -> None:
    assert VaultError.of_code("not_found", "Popen") is NotFound
    assert VaultError.of_code("no_such_code") is None
    assert VaultError.of_code("internal") is VaultError
