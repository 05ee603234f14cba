"""SIGKILL a process while it shrinks the hot store: after every kill each acknowledged
checkpoint reads back byte-identical and `check` finds nothing wrong.

A forked child opens the vault and, on one thread, saves checkpoints of 3 MiB (a line on
stdout once each is acknowledged), deletes all but the newest two (a line before each) and
collects them, while another thread shrinks (`Vault.shrink(above=0)`) over and over,
printing a line as each shrink starts and ends. The parent kills the child at a seeded
random moment, then reads what the child printed up to its death: a kill counts as landed
in a shrink when the last shrink line is a start. Twenty rounds over one data dir; at
least a quarter must land in a shrink (most do: the loop shrinks nearly all the time).
Forked, not a `ckpt serve`: the kill is about the engine's steps (recovery at the next
open is the server's own open), and a fork costs no interpreter start per round.
"""

from __future__ import annotations

import os
import random
import signal
import threading
from pathlib import Path

import numpy as np
import pytest

from checkpoint_vault.vault import FakeClock, Vault, VaultConfig

from ..unit.vault.helpers import client_save, read_file

SEED = int(os.environ.get("CRASH_SEED", "20261127"))
ROUNDS = 20
NS = "crash/shrink"
PIECE = 128 << 10


def config() -> VaultConfig:
    return VaultConfig(map_size=1 << 26, gc_grace=0.0)


def content(n: int) -> bytes:
    return np.random.default_rng(n).bytes(3 << 20)


def child(path: Path, first: int, out: int) -> None:
    """Save, delete and collect on this thread while another shrinks; never returns."""
    clock = FakeClock(1_800_000_000.0 + first * 86400.0)  # later than every earlier round
    vault = Vault(path, config(), clock)

    def say(line: str) -> None:
        os.write(out, (line + "\n").encode())

    def shrink_forever() -> None:
        while True:
            say("shrink start")
            vault.shrink(above=0.0)
            say("shrink end")

    threading.Thread(target=shrink_forever, daemon=True).start()
    n = first
    while True:
        ckpt = client_save(vault, NS, {"w.bin": content(n)}, chunk_size=PIECE)
        say(f"saved {ckpt.id} {n}")
        for old in vault.checkpoints(NS)[0][2:]:
            say(f"deleting {old.id}")  # before: a kill may land once it is done
            vault.lifecycle.delete(NS, old.id)
        clock.advance(7 * 3600.0)  # past the uploads' reservations
        vault.gc()
        n += 1


def run_round(path: Path, first: int, rng: random.Random) -> list[str]:
    """Fork a child, kill it after a random number of saves and then of further lines
    (their pieces, as the pipe hands them over), and return every line it wrote before it
    died."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        try:
            child(path, first, write)
        finally:
            os._exit(1)
    os.close(write)
    lines: list[str] = []
    buffered = b""
    saves, then = rng.randrange(1, 4), rng.randrange(0, 12)
    with os.fdopen(read, "rb", buffering=0) as pipe:
        while sum(line.startswith("saved") for line in lines) < saves or then > 0:
            then -= sum(line.startswith("saved") for line in lines) >= saves
            piece = pipe.read(4096)
            if not piece:
                break
            buffered += piece
            *whole, buffered = buffered.split(b"\n")
            lines += [w.decode() for w in whole]
        os.kill(pid, signal.SIGKILL)
        buffered += pipe.read()  # what it wrote before it died
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status), f"the child ended by itself: {lines[-5:]}"
    return lines + [w.decode() for w in buffered.split(b"\n") if w]


@pytest.mark.slow
def test_sigkill_during_shrink_loses_nothing(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    path = tmp_path / "vault"
    acknowledged: dict[str, int] = {}
    landed = 0
    first = 0
    for _ in range(ROUNDS):
        lines = run_round(path, first, rng)
        shrink_lines = [line for line in lines if line.startswith("shrink")]
        landed += bool(shrink_lines) and shrink_lines[-1] == "shrink start"
        for line in lines:
            word, *rest = line.split()
            if word == "saved":
                acknowledged[rest[0]] = int(rest[1])
                first = max(first, int(rest[1]) + 1)
            elif word == "deleting":
                acknowledged.pop(rest[0], None)
        first += 1  # a save under way at the kill may have committed: never reuse its seed
        vault = Vault(path, config(), FakeClock(1_800_000_000.0 + first * 86400.0))
        try:
            for ckpt, n in acknowledged.items():
                assert read_file(vault, NS, ckpt, "w.bin") == content(n)
            report = vault.check()
            assert report.ok, report
        finally:
            vault.close()
    assert len(acknowledged) >= 2
    assert landed >= ROUNDS // 4, f"only {landed} of {ROUNDS} kills landed in a shrink"
