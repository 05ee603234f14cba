"""vault/parts.py on one engine: parts are checkpoints of the reserved namespace `_parts`,
committed once into their namespace by `commit_parts`, held until their deadline, released
or expired, then collected by GC. (Across nodes: tests/integration/test_cluster_parts.py.)"""

from __future__ import annotations

import pytest

from checkpoint_vault.protocol import CommitFile
from checkpoint_vault.vault import FakeClock, Vault
from checkpoint_vault.vault.errors import Conflict, InvalidName, InvalidRequest, PartGone
from checkpoint_vault.vault.frame import chunk_id
from checkpoint_vault.vault.parts import PartManifest, PartsCommit

from .helpers import read_file


def save_part(
    vault: Vault, ns: str, files: dict[str, bytes], by: str | None = "t", **kw: float
) -> PartManifest:
    session, _ = vault.parts.open(ns, by, **kw)
    listing = {}
    for name, data in files.items():
        pieces = [data[i : i + 1000] for i in range(0, len(data), 1000)]
        ids = [chunk_id(p).hex() for p in pieces]
        for cid, piece in zip(ids, pieces, strict=True):
            vault.uploads.put_chunk(session.id, cid, piece)
        listing[name] = CommitFile(len(data), chunk_id(data).hex(), ids)
    return vault.parts.commit(session.id, listing)


def commit(vault: Vault, ns: str, parts: list[PartManifest], by: str | None = "t") -> str:
    refs = [("", p.id) for p in parts]
    return vault.parts.commit_parts(PartsCommit(ns, parts, by, refs, metadata={"k": 1})).id


def test_parts_commit_once_into_their_namespace_and_stay_out_of_listings(vault: Vault) -> None:
    a = save_part(vault, "job/x", {"a.bin": b"A" * 5000})
    b = save_part(vault, "job/x", {"b.bin": b"B" * 3000, "c.json": b"{}"})
    assert [ns.name for ns, _ in vault.namespaces()] == []  # `_parts` is never listed
    assert {p.id for p in vault.parts.held()} == {a.id, b.id}

    first = commit(vault, "job/x", [a, b])
    rec, files = vault.manifest("job/x", "latest")
    assert rec.id == first
    assert sorted(files) == ["a.bin", "b.bin", "c.json"]
    assert rec.metadata == {"k": 1}
    assert read_file(vault, "job/x", first, "b.bin") == b"B" * 3000
    assert [ns.name for ns, _ in vault.namespaces()] == ["job/x"]
    # the same commit again answers the first checkpoint, never a second
    assert commit(vault, "job/x", [b, a]) == first
    assert [c.id for c in vault.checkpoints("job/x")[0]] == [first]


def test_a_commit_of_parts_refuses_what_it_cannot_take_and_makes_nothing(vault: Vault) -> None:
    a = save_part(vault, "job/y", {"a.bin": b"A" * 2000})
    same_name = save_part(vault, "job/y", {"a.bin": b"Z" * 2000})
    other_ns = save_part(vault, "job/other", {"o.bin": b"O"})
    other_token = save_part(vault, "job/y", {"t.bin": b"T"}, by="u")
    for parts, why in (
        ([a, same_name], "more than one part"),
        ([a, other_ns], "saved for"),
        ([a, other_token], "another token"),
    ):
        with pytest.raises(InvalidRequest, match=why):
            commit(vault, "job/y", parts)
    with pytest.raises(InvalidName):
        vault.parts.open("_parts", "t")  # the reserved namespace is nobody's
    upload, _ = vault.open_upload("job/y")
    with pytest.raises(Conflict):
        vault.parts.commit(upload.id, {})  # a plain upload is not a part
    assert not vault.checkpoints("job/y")[0]  # nothing was committed


def test_released_and_expired_parts_are_gone_and_collected(vault: Vault, clock: FakeClock) -> None:
    a = save_part(vault, "job/z", {"a.bin": b"A" * 4000}, ttl=60.0)
    b = save_part(vault, "job/z", {"b.bin": b"B" * 4000})
    assert vault.parts.release(b.id)
    with pytest.raises(PartGone):
        vault.parts.manifest(b.id)
    assert not vault.parts.release(b.id)
    clock.advance(61.0)
    with pytest.raises(PartGone):
        vault.parts.manifest(a.id)  # past its deadline: gone to owners at once
    assert [p.id for p in vault.parts.held()] == [a.id]  # until the expiry pass
    assert vault.parts.expire() == 1
    assert vault.parts.held() == []
    clock.advance(vault.config.gc_grace)
    vault.gc()
    assert vault.stats().chunks == 1  # b's: released, still reserved until b's deadline
    clock.advance(vault.parts.ttl + vault.config.gc_grace)
    vault.gc()
    assert vault.stats().chunks == 0
