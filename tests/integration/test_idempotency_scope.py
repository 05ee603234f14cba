"""Idempotency keys are their token's own (issue 41, low): two tenants saving with the same
key each get their own checkpoint, and neither learns from the answer that the other used
it; a retry by the same token still returns the first save's checkpoint."""

from __future__ import annotations

from checkpoint_vault.protocol import BUNDLE_TYPE, encode_bundle

from ..conftest import Api

KEY = "predictable-key-0001"


async def _save(api: Api, token: str, ns: str, data: bytes, expect: int) -> dict[str, object]:
    body = encode_bundle({"key": KEY}, [("state", data)])
    out: dict[str, object] = await api.json(
        "POST",
        f"/v1/namespaces/{ns}/checkpoints",
        expect,
        token=token,
        data=body,
        headers={"Content-Type": BUNDLE_TYPE},
    )
    return out


async def test_one_key_from_two_tenants_makes_two_checkpoints(api: Api) -> None:
    a = await api.token_for("read:ns-a/*", "write:ns-a/*", name="a-rw")
    b = await api.token_for("read:ns-b/*", "write:ns-b/*", name="b-rw")
    first_a = await _save(api, a, "ns-a/agent", b"A's state", 201)
    # Before: 409 "in use by another request", which told B that A had used the key.
    first_b = await _save(api, b, "ns-b/agent", b"B's state", 201)
    assert first_b["id"] != first_a["id"]
    assert first_b["namespace"] == "ns-b/agent"
    again_a = await _save(api, a, "ns-a/agent", b"A's retry", 200)
    again_b = await _save(api, b, "ns-b/agent", b"B's retry", 200)
    assert (again_a["id"], again_b["id"]) == (first_a["id"], first_b["id"])
    assert await api.read("ns-b/agent", str(first_b["id"]), "state", token=b) == b"B's state"


async def test_a_key_taken_first_by_another_tenant_is_not_squatted(api: Api) -> None:
    """B saves first with the key A will use: A's save is still made, in A's namespace."""
    a = await api.token_for("read:ns-a/*", "write:ns-a/*", name="a-rw")
    b = await api.token_for("read:ns-b/*", "write:ns-b/*", name="b-rw")
    await _save(api, b, "ns-b/agent", b"squat", 201)
    made = await _save(api, a, "ns-a/agent", b"A's state", 201)
    assert made["namespace"] == "ns-a/agent"
    assert await api.read("ns-a/agent", "latest", "state", token=a) == b"A's state"
