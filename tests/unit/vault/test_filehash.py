"""Files hashed as their chunk batches arrive (vault/filehash.py): used by the commit only
when exactly the file's chunks were hashed in order, whatever the batches claimed."""

from __future__ import annotations

import os

import blake3
import pytest

from checkpoint_vault.protocol import CommitFile
from checkpoint_vault.vault import Vault
from checkpoint_vault.vault import uploads as vault_uploads
from checkpoint_vault.vault.errors import InvalidRequest
from checkpoint_vault.vault.filehash import MAX_FILES, RunningHashes
from checkpoint_vault.vault.frame import chunk_id

from .helpers import read_file


def _pieces(data: bytes, size: int) -> list[tuple[bytes, bytes]]:
    return [(chunk_id(data[i : i + size]), data[i : i + size]) for i in range(0, len(data), size)]


def _batches(
    chunks: list[tuple[bytes, bytes]], per: int
) -> list[tuple[int, list[tuple[bytes, bytes]]]]:
    """(offset of the first chunk, chunks) for runs of `per` chunks."""
    out = []
    offset = 0
    for i in range(0, len(chunks), per):
        run = chunks[i : i + per]
        out.append((offset, run))
        offset += sum(len(d) for _, d in run)
    return out


@pytest.mark.parametrize("order", ["in order", "one ahead"])
def test_batches_in_order_or_one_ahead_give_the_file_hash(vault: Vault, order: str) -> None:
    data = os.urandom(600_000)
    chunks = _pieces(data, 50_000)
    batches = _batches(chunks, 3)
    if order == "one ahead":  # the second batch verified before the first, and so on
        batches[0], batches[1] = batches[1], batches[0]
        batches[2], batches[3] = batches[3], batches[2]
    session, _ = vault.open_upload("ns")
    for offset, run in batches:
        vault.uploads.put_chunks(session.id, run, at=("f", offset))
    ids = [cid for cid, _ in chunks]
    assert vault.uploads.running.digest(session.id, "f", ids) == blake3.blake3(data).digest()
    record, _ = vault.committer.commit(
        session.id, {"f": CommitFile(len(data), None, [c.hex() for c in ids])}
    )
    assert record.files["f"]["hash"] == blake3.blake3(data).hexdigest()
    assert vault.uploads.running.digest(session.id, "f", ids) is None  # forgotten once committed
    assert read_file(vault, "ns", record.id, "f") == data


@pytest.mark.parametrize(
    "claim",
    ["gap", "two ahead", "resent", "wrong offsets", "another file", "a chunk not sent"],
)
def test_what_batches_claim_never_changes_a_hash(vault: Vault, claim: str) -> None:
    data = os.urandom(400_000)
    chunks = _pieces(data, 40_000)
    batches = _batches(chunks, 2)
    sends: list[tuple[str, int, list[tuple[bytes, bytes]]]] = [("f", o, r) for o, r in batches]
    if claim == "gap":
        sends = sends[:2] + sends[3:] + [("x", 0, sends[2][2])]
    elif claim == "two ahead":
        sends = [sends[2], sends[1], sends[0], *sends[3:]]
    elif claim == "resent":
        sends = [*sends, sends[1]]
    elif claim == "wrong offsets":
        sends = [(n, o + 1, r) for n, o, r in sends]
    elif claim == "another file":  # a batch of f claims to be at the start of g
        sends = [sends[0], ("g", 0, sends[1][2]), *sends[2:]]
    else:  # the last chunk is never sent with a position: f's running hash stops short
        sends[-1] = ("y", 0, sends[-1][2])
    session, _ = vault.open_upload("ns")
    for name, offset, run in sends:
        vault.uploads.put_chunks(session.id, run, at=(name, offset))
    ids = [cid for cid, _ in chunks]
    assert vault.uploads.running.digest(session.id, "f", ids) is None
    listing = {"f": CommitFile(len(data), None, [c.hex() for c in ids])}
    record, _ = vault.committer.commit(session.id, listing)
    assert record.files["f"]["hash"] == blake3.blake3(data).hexdigest()


def test_a_running_hash_names_the_chunks_it_took(vault: Vault) -> None:
    """A client listing other chunks than the ones hashed gets no digest from it."""
    running = RunningHashes(vault.reader.hash_into)
    a, b = b"a" * 1000, b"b" * 1000
    running.feed("u", "f", 0, [(chunk_id(a), a), (chunk_id(b), b)])
    assert running.digest("u", "f", [chunk_id(a), chunk_id(b)]) == blake3.blake3(a + b).digest()
    assert running.digest("u", "f", [chunk_id(a)]) is None
    assert running.digest("u", "f", [chunk_id(b), chunk_id(a)]) is None
    assert running.digest("v", "f", [chunk_id(a), chunk_id(b)]) is None


def test_files_past_the_bound_drop_the_oldest(vault: Vault) -> None:
    running = RunningHashes(vault.reader.hash_into)
    data = b"x" * 100
    for i in range(MAX_FILES + 1):
        running.feed(f"u{i}", "f", 0, [(chunk_id(data), data)])
    assert running.digest("u0", "f", [chunk_id(data)]) is None
    assert running.digest(f"u{MAX_FILES}", "f", [chunk_id(data)]) is not None


def _hashed(vault: Vault) -> dict[str, int]:
    hashed: dict[str, int] = vault.observe().commit_file_hashes
    return hashed


def test_references_keep_the_hash_running(vault: Vault) -> None:
    """A batch may name chunks the vault has instead of carrying them (another file of the
    upload sent them, or they repeat inside the batch): read from the store, they keep the
    file's hash running, and the commit does not read the file back."""
    shared = os.urandom(120_000)
    other = _pieces(shared, 40_000)
    own = _pieces(os.urandom(200_000), 40_000)
    session, _ = vault.open_upload("ns")
    vault.uploads.put_chunks(session.id, other, at=("weights", 0))
    chunks = [*other, *own[:2], own[0], *own[2:]]  # the weights again, then a repeat
    data = b"".join(d for _, d in chunks)
    refs: list[tuple[bytes, bytes | None]] = [(cid, None) for cid, _ in other]
    first = [*refs, *own[:2], (own[0][0], None)]
    vault.uploads.put_chunks(session.id, first, at=("train", 0))
    vault.uploads.put_chunks(session.id, own[2:], at=("train", len(shared) + 120_000))
    before = _hashed(vault)
    listing = {
        "weights": CommitFile(len(shared), None, [c.hex() for c, _ in other]),
        "train": CommitFile(len(data), None, [c.hex() for c, _ in chunks]),
    }
    record, _ = vault.committer.commit(session.id, listing)
    after = _hashed(vault)
    assert after["on_arrival"] - before["on_arrival"] == 2
    assert after["read_back"] == before["read_back"]
    assert record.files["train"]["hash"] == blake3.blake3(data).hexdigest()
    assert read_file(vault, "ns", record.id, "train") == data


@pytest.mark.parametrize("target", ["absent", "another tenant's"])
def test_a_reference_the_caller_may_not_use_answers_the_same(vault: Vault, target: str) -> None:
    """A reference to a chunk the caller could not count as stored (absent, or stored only
    outside its dedup domain) stores nothing, answers as any other, and only leaves the
    commit to read the file back; the file still has to be sent to be committed."""
    secret = os.urandom(50_000)
    if target == "another tenant's":
        theirs, _ = vault.open_upload("b")
        vault.uploads.put_chunks(theirs.id, [(chunk_id(secret), secret)])
        vault.committer.commit(
            theirs.id, {"s": CommitFile(len(secret), None, [chunk_id(secret).hex()])}
        )
    mine = os.urandom(50_000)
    session, _ = vault.open_upload("a")
    batch: list[tuple[bytes, bytes | None]] = [(chunk_id(mine), mine), (chunk_id(secret), None)]
    assert (
        vault.uploads.put_chunks(session.id, batch, domain=lambda ns: ns == "a", at=("f", 0)) == 1
    )
    ids = [chunk_id(mine), chunk_id(secret)]
    assert vault.uploads.running.digest(session.id, "f", ids) is None
    hexid = chunk_id(secret).hex()
    assert vault.uploads.missing(session.id, [hexid], domain=lambda ns: ns == "a") == [hexid]


def test_references_need_a_place(vault: Vault) -> None:
    data = os.urandom(10_000)
    session, _ = vault.open_upload("ns")
    with pytest.raises(InvalidRequest, match="place"):
        vault.uploads.put_chunks(session.id, [(chunk_id(data), data), (chunk_id(data), None)])
    assert vault.uploads.missing(session.id, [chunk_id(data).hex()]) == [chunk_id(data).hex()]


def test_references_past_the_bound_stop_the_running_hash(
    vault: Vault, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch may have at most MAX_REFERENCED_BYTES of references hashed from the store:
    past it the file is read back at its commit instead, and its hash is the same."""
    monkeypatch.setattr(vault_uploads, "MAX_REFERENCED_BYTES", 100_000)
    stored = _pieces(os.urandom(120_000), 40_000)
    session, _ = vault.open_upload("ns")
    vault.uploads.put_chunks(session.id, stored, at=("first", 0))
    refs: list[tuple[bytes, bytes | None]] = [(cid, None) for cid, _ in stored]
    vault.uploads.put_chunks(session.id, refs, at=("again", 0))
    ids = [cid for cid, _ in stored]
    assert vault.uploads.running.digest(session.id, "again", ids) is None
    data = b"".join(d for _, d in stored)
    listing = {n: CommitFile(len(data), None, [c.hex() for c in ids]) for n in ("first", "again")}
    before = _hashed(vault)
    record, _ = vault.committer.commit(session.id, listing)
    after = _hashed(vault)
    assert after["on_arrival"] - before["on_arrival"] == 1  # "first"
    assert after["same_file"] - before["same_file"] == 1  # "again": a copy of "first"
    assert after["read_back"] == before["read_back"]
    assert record.files["again"]["hash"] == blake3.blake3(data).hexdigest()


def test_a_copy_of_a_file_in_the_same_upload_is_read_back_once(vault: Vault) -> None:
    data = os.urandom(300_000)
    chunks = _pieces(data, 50_000)
    session, _ = vault.open_upload("ns")
    vault.uploads.put_chunks(session.id, chunks)  # no position: the commit reads the file back
    ids = [cid.hex() for cid, _ in chunks]
    before = _hashed(vault)
    record, _ = vault.committer.commit(
        session.id, {n: CommitFile(len(data), None, ids) for n in "abc"}
    )
    after = _hashed(vault)
    assert after["read_back"] - before["read_back"] == 1
    assert after["same_file"] - before["same_file"] == 2
    assert {record.files[n]["hash"] for n in "abc"} == {blake3.blake3(data).hexdigest()}
