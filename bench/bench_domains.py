"""What dedup domains (issue 16, vault/domains.py) cost: bytes on the wire, bytes stored,
and save time, for tenants with their own tokens against one real server.

    python bench/bench_domains.py [--size 32MiB] [--json]

Scenarios, each on a fresh server and data dir:
- `series`: one token (read+write ns-a/*) saves a base file then 4 versions with 5% of
  it changed, in one namespace. Domains must change nothing here.
- `two_tenants`: tenant A saves the base in ns-a, then tenant B (its own token, ns-b/*)
  saves the identical file in ns-b. Without domains B sent almost nothing (the vault
  confirmed A's chunks); with them B sends every byte, stored once all the same.
- `one_token_two_ns`: the same, but one token holds both namespaces: dedup as before.
- `resave`: 20 saves of the unchanged base (all chunks known): the commit path, where the
  per-namespace reference index adds one LMDB get+put per distinct chunk.

Run it once with this tree and once with an older one on PYTHONPATH to compare; the
server is started with the same interpreter and environment.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_ingest import Server, parse_size

from checkpoint_vault.client import VaultClient
from checkpoint_vault.client.errors import ClientError

MiB = 1 << 20


def _wait(url: str, server: Server) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        server.check_alive()
        try:
            with VaultClient(url, "none", progress=False) as probe:
                probe.health()
                return
        except ClientError:
            time.sleep(0.05)  # polling a starting process; nothing to wait on instead
    raise RuntimeError("server did not become healthy")


def _mutate(data: bytes, fraction: float, rng: random.Random) -> bytes:
    """`fraction` of the file rewritten in 64 KiB runs at random places."""
    out = bytearray(data)
    runs = max(1, int(len(data) * fraction) // (64 << 10))
    for _ in range(runs):
        at = rng.randrange(0, len(data) - (64 << 10))
        out[at : at + (64 << 10)] = rng.randbytes(64 << 10)
    return bytes(out)


def _save(vault: VaultClient, ns: str, data: bytes) -> tuple[int, float]:
    before = vault.transfer.bytes_sent
    start = time.perf_counter()
    vault.save(ns, {"model.bin": data})
    return vault.transfer.bytes_sent - before, time.perf_counter() - start


def scenario(name: str, size: int, work: Path) -> dict[str, Any]:
    rng = random.Random(7)
    base = rng.randbytes(size)
    server = Server(work / name / "data", work / name / "server.log")
    (work / name).mkdir(parents=True)
    server.start()
    try:
        _wait(server.url, server)
        with VaultClient(server.url, server.token(), progress=False) as admin:
            both = ["read:ns-a/*", "write:ns-a/*", "read:ns-b/*", "write:ns-b/*"]
            a_tok = admin.create_token("a", both if name == "one_token_two_ns" else both[:2])
            b_tok = admin.create_token("b", both[2:])
            stored0 = admin.stats().stored_bytes
            out: dict[str, Any] = {"scenario": name, "size": size}
            with (
                VaultClient(server.url, a_tok.token, progress=False) as a,
                VaultClient(server.url, b_tok.token, progress=False) as b,
            ):
                if name == "series":
                    data, sent, secs = base, [], []
                    for _ in range(5):
                        n, t = _save(a, "ns-a/run", data)
                        sent.append(n)
                        secs.append(t)
                        data = _mutate(data, 0.05, rng)
                    out.update(bytes_sent=sent, seconds=[round(s, 3) for s in secs])
                elif name == "resave":
                    _save(a, "ns-a/run", base)
                    secs = sorted(_save(a, "ns-a/run", base)[1] for _ in range(20))
                    out.update(p50_s=round(secs[10], 4), max_s=round(secs[-1], 4))
                else:
                    sent_a, _ = _save(a, "ns-a/run", base)
                    second = a if name == "one_token_two_ns" else b
                    sent_b, _ = _save(second, "ns-b/run", base)
                    out.update(bytes_sent_first=sent_a, bytes_sent_second=sent_b)
            stats = admin.stats()
            out.update(
                stored_growth=stats.stored_bytes - stored0,
                dedup_ratio=stats.dedup_ratio,
            )
            return out
    finally:
        server.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=parse_size, default=32 * MiB)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    os.environ.pop("CKPT_TOKEN", None)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-domains-") as tmp:
        for name in ("series", "two_tenants", "one_token_two_ns", "resave"):
            rows.append(scenario(name, args.size, Path(tmp)))
            print(json.dumps(rows[-1]), file=sys.stderr)
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
