"""Which FastCDC parameters suit agent state? Prints stored bytes per chunk size.

Simulates an agent whose state (a JSON message list) grows by 1-3 messages a step, with an
occasional edit in the middle, re-serialized whole at every step, for 200 steps; counts the
unique chunks each profile would store (after zstd) against the size of the last snapshot.
Run: python bench/chunk_profiles.py
"""

from __future__ import annotations

import json
import random

import zstandard

from checkpoint_vault.vault.chunking import ChunkingProfile
from checkpoint_vault.vault.frame import chunk_id

WORDS = [
    "the",
    "a",
    "model",
    "tool",
    "call",
    "result",
    "plan",
    "step",
    "user",
    "assistant",
    "error",
    "retry",
    "search",
    "file",
    "read",
    "write",
    "data",
    "loss",
    "eval",
]
CANDIDATES = [
    (256, 768, 4096),
    (512, 1536, 8192),
    (1024, 3072, 16384),
    (2048, 6144, 32768),
    (16384, 49152, 262144),
]


def snapshots(steps: int = 200, seed: int = 1) -> list[bytes]:
    rng = random.Random(seed)
    msgs: list[dict[str, str]] = []
    out = []
    for step in range(steps):
        for _ in range(rng.randint(1, 3)):
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 120)))
            role = rng.choice(["user", "assistant", "tool"])
            msgs.append({"role": role, "id": f"m{len(msgs)}", "content": words})
        if step % 17 == 5 and len(msgs) > 4:
            k = rng.randrange(len(msgs) // 2, len(msgs))
            msgs[k] = dict(msgs[k], content=msgs[k]["content"] + " (edited)")
        state = {"messages": msgs, "step": step, "scratchpad": {"plan": f"step {step}"}}
        out.append(json.dumps(state).encode())
    return out


def main() -> None:
    snaps = snapshots()
    last = len(snaps[-1])
    z = zstandard.ZstdCompressor(level=1)
    print(f"200 snapshots, last {last:,} B, logical {sum(map(len, snaps)):,} B")
    for lo, avg, hi in CANDIDATES:
        profile = ChunkingProfile("candidate", lo, avg, hi)
        stored: dict[bytes, int] = {}
        for snap in snaps:
            for c in profile.chunker().cut_buf(snap):
                cid = chunk_id(c.data)
                if cid not in stored:
                    stored[cid] = len(z.compress(bytes(c.data)))
        total = sum(stored.values())
        print(
            f"min {lo:6} avg {avg:6} (mean ~{lo + avg:6}): {len(stored):5} chunks, "
            f"{total:10,} B stored = {total / last:5.2f}x last snapshot"
        )


if __name__ == "__main__":
    main()
