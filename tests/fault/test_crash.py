"""Crash consistency over HTTP: SIGKILL a real `ckpt serve` while producers upload and commit.

Producers open uploads, send one or two files each (streamed through `files/{name}`,
handed over by descriptor on the local socket, or cut client-side and sent through
`missing` + `chunks/{id}`) and commit. A killer task SIGKILLs
the server at seeded random moments and restarts it on the same data dir and port. Every
attempt is tracked with the exact bytes sent and what the server answered:

- acked: the commit answered 201/200 with a checkpoint id -> must be listed and read back
  bit-identical after every restart;
- unknown: the commit request may have reached the server before it died -> may be listed,
  and if so must read back bit-identical; retrying the commit later returns that same
  checkpoint (200), or commits it now (201) if it was not;
- unsent: every file was acknowledged but the commit could not even connect -> not listed;
  a later commit of the same upload must succeed (the session and its files are durable);
- abandoned: the upload broke off before its files were acknowledged -> never listed.

Each checkpoint carries its attempt key in its metadata, so a listed checkpoint maps to
exactly one attempt. After the last restart the test also runs GC and the consistency
check, which must report no reference-count drift, no missing and no damaged chunks.

Seed: `CRASH_SEED` in the environment (default below); it is printed on failure.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import blake3
import pytest
from pyfastcdc import FastCDC

from checkpoint_vault.client import local
from checkpoint_vault.client.connections import Broken
from checkpoint_vault.protocol import encode_bundle

from ..serverproc import ServerProcess

SEED = int(os.environ.get("CRASH_SEED", "20240611"))
KILLS = 6
PRODUCERS = (("crash-a", 0), ("crash-a", 1), ("crash-b", 2))
MAX_ATTEMPTS = 400  # per producer; the killer's schedule stops them long before
MAX_FILE = 6 << 20
ACKS_PER_ROUND = 4  # commits acknowledged after a (re)start before the next kill is armed
PROGRESS_TIMEOUT = 30.0  # seconds to wait for those acks (or a server restart)
MAX_KILL_DELAY = 1.2  # seconds: the kill lands uniformly in [0, this) once armed
MAX_COMMIT_KILL_DELAY = 0.03  # seconds after a commit request leaves, in "at-commit" rounds
READ_CONCURRENCY = 4
FILE_NAMES = ("weights.bin", "optim/state.pt", "meta/step.json", "shards/part-0001")

ABANDONED, UNSENT, COMMITTING, UNKNOWN, ACKED = (
    "abandoned",
    "unsent",
    "committing",
    "unknown",
    "acked",
)
TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, Broken)


class ServerFault(AssertionError):
    """The server answered something the contract forbids (a 5xx, a wrong status or body)."""


# -- deterministic data ---------------------------------------------------------------------
def fresh_bytes(rng: random.Random, size: int) -> bytes:
    """`size` bytes of random segments mixed with repetitive (compressible) ones."""
    parts: list[bytes] = []
    left = size
    while left > 0:
        n = min(left, rng.randint(1, 1 << 20))
        if rng.random() < 0.7:
            parts.append(rng.randbytes(n))
        else:
            pattern = rng.randbytes(rng.randint(1, 64))
            parts.append((pattern * (n // len(pattern) + 1))[:n])
        left -= n
    return b"".join(parts)


def mutate(rng: random.Random, base: bytes) -> bytes:
    """A file sharing most of its bytes with `base`: a few overwrites, inserts, cuts."""
    data = bytearray(base)
    for _ in range(rng.randint(1, 4)):
        op = rng.random()
        pos = rng.randint(0, len(data))
        if op < 0.5 and data:
            n = rng.randint(1, 8192)
            data[pos : pos + n] = rng.randbytes(min(n, max(len(data) - pos, 1)))
        elif op < 0.7:
            data[pos:pos] = rng.randbytes(rng.randint(1, 4096))
        elif op < 0.85:
            del data[pos : pos + rng.randint(1, 65536)]
        else:
            data += fresh_bytes(rng, rng.randint(1, 256 << 10))
    return bytes(data[:MAX_FILE])


def next_file(rng: random.Random, history: list[bytes]) -> bytes:
    r = rng.random()
    if r < 0.08:
        return b"" if rng.random() < 0.5 else rng.randbytes(rng.randint(1, 100))
    if r < 0.55 and history:
        data = mutate(rng, rng.choice(history[-6:]))
    else:
        size = rng.choice(
            (
                rng.randint(0, 64 << 10),
                rng.randint(64 << 10, 1 << 20),
                rng.randint(1 << 20, MAX_FILE),
            )
        )
        data = fresh_bytes(rng, size)
    history.append(data)
    return data


def fixed_cuts(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def cdc_cuts(data: bytes, chunking: dict[str, Any]) -> list[bytes]:
    """Cut as the server would (its advertised FastCDC profile), so ids meet streamed ones."""
    cdc = FastCDC(
        int(chunking["avg_size"]),
        min_size=int(chunking["min_size"]),
        max_size=int(chunking["max_size"]),
    )
    return [bytes(c.data) for c in cdc.cut_buf(data)] if data else []


def hexhash(data: bytes) -> str:
    return blake3.blake3(data).hexdigest()


async def pieces(data: bytes, rng: random.Random) -> AsyncIterator[bytes]:
    """A streamed (chunked transfer-encoding) request body in uneven pieces."""
    pos = 0
    while pos < len(data):
        n = rng.randint(1, 512 << 10)
        yield data[pos : pos + n]
        pos += n


# -- the record of what was sent and answered ------------------------------------------------
@dataclass
class Attempt:
    key: str
    namespace: str
    files: dict[str, bytes]
    chunked: set[str] = field(default_factory=set)  # files sent client-chunked
    handed: set[str] = field(default_factory=set)  # files handed over by descriptor
    bundle: bool = False  # sent as one request (POST .../checkpoints) with an idempotency key
    upload_id: str | None = None
    commit_body: dict[str, Any] = field(default_factory=dict)
    state: str = ABANDONED
    checkpoint_id: str | None = None
    generation: int = 0

    def expected_files(self) -> dict[str, dict[str, Any]]:
        return {n: {"size": len(d), "hash": hexhash(d)} for n, d in self.files.items()}


@dataclass
class Run:
    server: ServerProcess
    http: aiohttp.ClientSession
    attempts: list[Attempt] = field(default_factory=list)
    up: asyncio.Event = field(default_factory=asyncio.Event)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    progress: asyncio.Event = field(default_factory=asyncio.Event)
    committing: asyncio.Event = field(default_factory=asyncio.Event)
    generation: int = 0
    acks: int = 0
    kills: int = 0

    def url(self, path: str) -> str:
        return self.server.url + path

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.server.token}"}

    def acked(self, a: Attempt, checkpoint_id: str) -> None:
        a.state, a.checkpoint_id = ACKED, checkpoint_id
        self.acks += 1
        self.progress.set()


async def answer(resp: aiohttp.ClientResponse, *statuses: int) -> Any:
    """The JSON body if the status is one of `statuses`; otherwise a ServerFault."""
    body = await resp.read()
    if resp.status not in statuses:
        raise ServerFault(
            f"{resp.method} {resp.url.path} -> {resp.status}, wanted {statuses}: {body[:500]!r}"
        )
    return await resp.json() if body else None


# -- producers -----------------------------------------------------------------------------
class Producer:
    def __init__(self, run: Run, ns: str, index: int) -> None:
        self.run = run
        self.ns = ns
        self.index = index
        self.rng = random.Random(f"{SEED}/producer/{index}")
        self.history: list[bytes] = []

    def plan(self, seq: int) -> Attempt:
        names = self.rng.sample(FILE_NAMES, self.rng.choice((1, 1, 2)))
        a = Attempt(
            f"p{self.index}-{seq}", self.ns, {n: next_file(self.rng, self.history) for n in names}
        )
        a.chunked = {n for n in names if self.rng.random() < 0.3}
        small = sum(len(d) for d in a.files.values()) <= 4 << 20
        a.bundle = small and not a.chunked and self.rng.random() < 0.3
        return a

    async def loop(self) -> None:
        run = self.run
        for seq in range(MAX_ATTEMPTS):
            await wait_up(run)
            # No await from here to `a.generation`: the server is up in this generation.
            if run.stop.is_set():
                return
            a = self.plan(seq)
            a.generation = run.generation
            run.attempts.append(a)
            try:
                await self.attempt(a)
            except TRANSPORT_ERRORS as e:
                if run.generation == a.generation:
                    raise ServerFault(f"{a.key}: {e!r} while no kill happened") from e
                if a.state == COMMITTING:
                    a.state = UNSENT if isinstance(e, aiohttp.ClientConnectorError) else UNKNOWN
        raise AssertionError(f"producer {self.index} ran out of attempts")

    async def attempt(self, a: Attempt) -> None:
        run = self.run
        if a.bundle:
            a.state = COMMITTING
            run.committing.set()
            record = await commit(run, a, 201)
            run.acked(a, record["id"])
            return
        async with run.http.post(
            run.url(f"/v1/namespaces/{a.namespace}/uploads"),
            json={"metadata": {"attempt": a.key}, "tags": ["crash"]},
            headers=run.auth,
        ) as resp:
            opened = await answer(resp, 201)
        a.upload_id = opened["upload_id"]
        listed: dict[str, Any] = {}
        for name, data in a.files.items():
            if name in a.chunked:
                listed[name] = await self.send_chunks(a, name, data, opened["chunking"])
            else:
                await self.send_file(a, name, data)
        a.commit_body = {"files": listed}
        a.state = COMMITTING
        run.committing.set()
        record = await commit(run, a, 201)
        run.acked(a, record["id"])

    async def send_file(self, a: Attempt, name: str, data: bytes) -> None:
        if self.rng.random() < 0.3:
            got = await self.hand_over(a, name, data)
        else:
            body: io.BytesIO | AsyncIterator[bytes] = io.BytesIO(data)
            if self.rng.random() < 0.5:
                body = pieces(data, random.Random(f"{a.key}/{name}"))
            async with self.run.http.put(
                self.run.url(f"/v1/uploads/{a.upload_id}/files/{name}"),
                data=body,
                headers=self.run.auth,
            ) as resp:
                got = await answer(resp, 201)
        want = {"name": name, "size": len(data), "hash": hexhash(data)}
        assert {k: got[k] for k in want} == want, f"{a.key}: server saw other bytes for {name}"

    async def hand_over(self, a: Attempt, name: str, data: bytes) -> dict[str, Any]:
        """The file as a client on the server's machine gives it: its descriptor."""
        server = self.run.server
        path = server.data_dir.parent / "handed" / f"{a.key}-{name.replace('/', '_')}"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
        fd = os.open(path, os.O_RDONLY)
        try:
            status, _, payload = await asyncio.to_thread(
                local.hand_over,
                server.socket_path,
                f"/v1/uploads/{a.upload_id}/files/{name}",
                self.run.auth,
                fd,
                len(data),
                30,
            )
        finally:
            os.close(fd)
            path.unlink()
        if status != 201:
            raise ServerFault(f"{a.key}: handing {name} over answered {status}: {payload[:300]!r}")
        a.handed.add(name)
        got: dict[str, Any] = json.loads(payload)
        return got

    async def send_chunks(
        self, a: Attempt, name: str, data: bytes, chunking: dict[str, Any]
    ) -> dict[str, Any]:
        run = self.run
        if self.rng.random() < 0.5:
            chunks = cdc_cuts(data, chunking)
        else:
            chunks = fixed_cuts(data, self.rng.choice((4096, 32768, 200_000)))
        ids = [hexhash(c) for c in chunks]
        async with run.http.post(
            run.url(f"/v1/uploads/{a.upload_id}/missing"), json={"chunks": ids}, headers=run.auth
        ) as resp:
            missing = set((await answer(resp, 200))["missing"])
        assert missing <= set(ids), f"{a.key}: missing names ids never asked about"
        sent: set[str] = set()
        for cid, chunk in zip(ids, chunks, strict=True):
            if cid in missing and cid not in sent:
                sent.add(cid)
                async with run.http.put(
                    run.url(f"/v1/uploads/{a.upload_id}/chunks/{cid}"), data=chunk, headers=run.auth
                ) as resp:
                    await answer(resp, 200, 201)
        return {"size": len(data), "hash": hexhash(data), "chunks": ids}


def bundle_body(a: Attempt) -> bytes:
    """The one-request save of an attempt; its key makes a retry return the same record."""
    header = {
        "metadata": {"attempt": a.key},
        "tags": ["crash"],
        "key": f"crash-idempotency-{a.key}",
    }
    return encode_bundle(header, list(a.files.items()))


async def commit(run: Run, a: Attempt, *statuses: int) -> dict[str, Any]:
    """POST the attempt's commit (or its one-request save) and check the record describes
    exactly what was sent."""
    if a.bundle:
        post = run.http.post(
            run.url(f"/v1/namespaces/{a.namespace}/checkpoints"),
            data=io.BytesIO(bundle_body(a)),
            headers=run.auth,
        )
    else:
        post = run.http.post(
            run.url(f"/v1/uploads/{a.upload_id}/commit"), json=a.commit_body, headers=run.auth
        )
    async with post as resp:
        record: dict[str, Any] = await answer(resp, *statuses)
    assert record["files"] == a.expected_files(), f"{a.key}: commit record lists other files"
    assert record["metadata"] == {"attempt": a.key}, f"{a.key}: commit record metadata"
    assert record["namespace"] == a.namespace
    return record


# -- the killer ----------------------------------------------------------------------------
async def wait_for(event: asyncio.Event, what: str) -> None:
    try:
        await asyncio.wait_for(event.wait(), PROGRESS_TIMEOUT)
    except asyncio.TimeoutError:
        pytest.fail(f"no {what} within {PROGRESS_TIMEOUT}s (seed {SEED})")


async def wait_up(run: Run) -> None:
    """Return (with no await after the last check) once the server is up."""
    for _ in range(KILLS + 2):  # each turn outlasts at least one restart
        if run.up.is_set():
            return
        # wait_for runs the wait in a task: `up` may be cleared again before we resume.
        await wait_for(run.up, "server restart")
    pytest.fail("server never stayed up")


async def wait_for_acks(run: Run, target: int) -> None:
    for _ in range(10_000):  # each turn consumes at least one ack
        if run.acks >= target:
            return
        run.progress.clear()
        await wait_for(run.progress, "commit acknowledged")
    pytest.fail("ack counter did not advance")


async def killer(run: Run) -> None:
    rng = random.Random(f"{SEED}/killer")
    for _ in range(KILLS):
        await wait_for_acks(run, run.acks + ACKS_PER_ROUND)
        if rng.random() < 0.5:  # aim at a commit in flight
            run.committing.clear()
            await wait_for(run.committing, "commit sent")
            await asyncio.sleep(rng.uniform(0, MAX_COMMIT_KILL_DELAY))
        else:  # anywhere: opening, streaming, chunk PUTs, committing
            # The sleeps here are the fault schedule (when to strike), not synchronisation.
            await asyncio.sleep(rng.uniform(0, MAX_KILL_DELAY))
        assert run.server.alive(), f"server exited on its own:\n{run.server.log_tail()}"
        acked_before = {str(a.checkpoint_id) for a in run.attempts if a.state == ACKED}
        run.up.clear()
        run.generation += 1
        run.kills += 1
        await asyncio.to_thread(run.server.restart)
        listed = {r["id"] for ns in namespaces(run) for r in await list_checkpoints(run, ns)}
        lost = acked_before - listed
        assert not lost, f"kill {run.kills}: acknowledged checkpoints gone: {sorted(lost)}"
        run.up.set()
    await wait_for_acks(run, run.acks + ACKS_PER_ROUND)
    run.stop.set()


def namespaces(run: Run) -> list[str]:
    """Namespaces known to exist: an upload was opened in each (that creates it)."""
    return sorted({a.namespace for a in run.attempts if a.upload_id is not None})


async def list_checkpoints(run: Run, ns: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    params = {"limit": "1000"}
    for _ in range(1000):
        async with run.http.get(
            run.url(f"/v1/namespaces/{ns}/checkpoints"), params=params, headers=run.auth
        ) as resp:
            page = await answer(resp, 200)
        out.extend(page["checkpoints"])
        if page["next"] is None:
            return out
        params = {"limit": "1000", "before": page["next"]}
    raise AssertionError("checkpoint listing never ended")


# -- verification --------------------------------------------------------------------------
async def read_back(run: Run, a: Attempt, checkpoint_id: str, gate: asyncio.Semaphore) -> None:
    """Every file of the checkpoint must come back byte for byte as it was sent."""
    for name, data in a.files.items():
        async with (
            gate,
            run.http.get(
                run.url(f"/v1/namespaces/{a.namespace}/checkpoints/{checkpoint_id}/files/{name}"),
                headers=run.auth,
            ) as resp,
        ):
            got = await resp.read()
            assert resp.status == 200, f"{a.key} {name}: {resp.status} {got[:300]!r}"
            assert resp.headers.get("ETag") == f'"{hexhash(data)}"', f"{a.key} {name}: ETag"
        if got != data:
            first = next(
                (i for i, (x, y) in enumerate(zip(got, data, strict=False)) if x != y),
                min(len(got), len(data)),
            )
            raise AssertionError(
                f"{a.key} {name} in {checkpoint_id}: {len(got)} bytes read, {len(data)} sent, "
                f"first difference at byte {first} (seed {SEED})"
            )


async def visible(run: Run) -> dict[str, tuple[Attempt, dict[str, Any]]]:
    """Listed checkpoints by id, each matched to the one attempt that made it."""
    by_key = {a.key: a for a in run.attempts}
    out: dict[str, tuple[Attempt, dict[str, Any]]] = {}
    seen_keys: dict[str, str] = {}
    for ns in namespaces(run):
        for rec in await list_checkpoints(run, ns):
            key = str(rec["metadata"].get("attempt"))
            a = by_key.get(key)
            assert a is not None, f"listed checkpoint {rec['id']} matches no attempt: {rec}"
            assert key not in seen_keys, f"{key} committed twice: {seen_keys[key]}, {rec['id']}"
            seen_keys[key] = rec["id"]
            assert a.state in (ACKED, UNKNOWN), f"{a.key} is listed but its state is {a.state}"
            if a.state == ACKED:
                assert rec["id"] == a.checkpoint_id, f"{a.key}: listed under another id"
            assert rec["namespace"] == a.namespace == ns
            assert rec["files"] == a.expected_files(), f"{a.key}: listed with other files"
            out[rec["id"]] = (a, rec)
    return out


async def verify_visible(run: Run) -> dict[str, tuple[Attempt, dict[str, Any]]]:
    shown = await visible(run)
    listed_attempts = {a.key for a, _ in shown.values()}
    lost = [a.key for a in run.attempts if a.state == ACKED and a.key not in listed_attempts]
    assert not lost, f"acknowledged commits not listed after the last restart: {lost}"
    gate = asyncio.Semaphore(READ_CONCURRENCY)
    await asyncio.gather(*(read_back(run, a, cid, gate) for cid, (a, _) in shown.items()))
    return shown


async def retry_commits(run: Run, shown: dict[str, tuple[Attempt, dict[str, Any]]]) -> int:
    """Re-commit every unknown and unsent upload: the same checkpoint again, or a new one."""
    listed = {a.key: cid for cid, (a, _) in shown.items()}
    gate = asyncio.Semaphore(READ_CONCURRENCY)
    retried = 0
    for a in run.attempts:
        if a.state not in (UNKNOWN, UNSENT):
            continue
        retried += 1
        if a.key in listed:
            record = await commit(run, a, 200)
            assert record["id"] == listed[a.key], f"{a.key}: retry answered another checkpoint"
        else:
            record = await commit(run, a, 201)
            await read_back(run, a, record["id"], gate)
        run.acked(a, record["id"])
    return retried


async def gc_and_check(run: Run, expected_checkpoints: int) -> dict[str, Any]:
    """GC, then the consistency check; the counters must agree with what is listed."""
    try:
        async with run.http.post(run.url("/v1/admin/gc"), headers=run.auth) as resp:
            await answer(resp, 200)
        async with run.http.post(run.url("/v1/admin/check"), headers=run.auth) as resp:
            report = await answer(resp, 200)
    except ServerFault as e:  # the traceback is in the server's log
        raise ServerFault(f"{e}\nserver log:\n{run.server.log_tail()}") from None
    assert report["drift"] == [], f"reference-count drift: {report['drift'][:20]}"
    assert report["missing"] == [], f"missing chunks: {report['missing'][:20]}"
    assert report["damaged"] == [], f"damaged chunks: {report['damaged'][:20]}"
    assert report["ok"] is True
    assert report["checkpoints"] == expected_checkpoints
    async with run.http.get(run.url("/v1/stats"), headers=run.auth) as resp:
        stats: dict[str, Any] = await answer(resp, 200)
    assert stats["checkpoints"] == expected_checkpoints, f"stats counter: {stats}"
    async with run.http.get(run.url("/v1/namespaces"), headers=run.auth) as resp:
        listed = {n["name"]: n["checkpoints"] for n in (await answer(resp, 200))["namespaces"]}
    want = {ns: sum(a.namespace == ns and a.state == ACKED for a in run.attempts) for ns in listed}
    assert sorted(listed) == namespaces(run), f"namespaces: {sorted(listed)}"
    assert listed == want, f"namespace checkpoint counts {listed}, expected {want}"
    return stats


async def drive(run: Run) -> None:
    """Producers and the killer until the killer is done; the first failure ends it all."""
    tasks = [asyncio.ensure_future(Producer(run, ns, i).loop()) for ns, i in PRODUCERS]
    tasks.append(asyncio.ensure_future(killer(run)))
    try:
        # Returns when one task fails or all are done (the killer sets `stop` when it is).
        done, _pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()  # re-raises the first failure
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.slow
@pytest.mark.crash
@pytest.mark.timeout(180)
async def test_sigkill_during_uploads_loses_no_acknowledged_checkpoint(
    crash_server: ServerProcess,
) -> None:
    timeout = aiohttp.ClientTimeout(total=60, sock_connect=5)
    connector = aiohttp.TCPConnector(force_close=True)  # a kill leaves no stale pooled socket
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
        run = Run(crash_server, http)
        run.up.set()
        await drive(run)
        assert run.kills == KILLS
        states = {
            s: sum(a.state == s for a in run.attempts) for s in (ACKED, UNKNOWN, UNSENT, ABANDONED)
        }

        shown = await verify_visible(run)
        retried = await retry_commits(run, shown)
        acked = [a for a in run.attempts if a.state == ACKED]
        stats = await gc_and_check(run, len(acked))
        after = await verify_visible(run)
        assert {a.key for a, _ in after.values()} == {a.key for a in acked}
        assert any(a.bundle for a in acked), "no one-request save was exercised"
        assert any(a.chunked for a in acked), "no client-chunked upload was exercised"
        assert any(a.handed for a in acked), "no file handed over by descriptor was exercised"

    assert crash_server.alive(), f"server exited on its own:\n{crash_server.log_tail()}"
    log = crash_server.log_tail(100_000)
    assert "Traceback" not in log, f"server logged a traceback:\n{log}"
    sent = sum(len(d) for a in run.attempts for d in a.files.values())
    print(
        f"seed {SEED}: {len(run.attempts)} attempts ({sent >> 20} MiB), {run.kills} kills, "
        f"{len(shown)} visible before {retried} retries, {states}, "
        f"dedup ratio {stats['dedup_ratio']}"
    )
