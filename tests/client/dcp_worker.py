"""One rank of a 2-process torch.distributed.checkpoint run against a vault (gloo, loopback).

    python -m tests.client.dcp_worker save|load URL TOKEN NAMESPACE PORT RANK [REF]

The state is a DTensor sharded by rows over the two ranks, a replicated one, and a plain
object; its values depend only on a fixed seed, so every process (and the test) can build
the expected tensors. `save` prints `{"rank", "checkpoint"}` (the id on the coordinator);
`load` fills zeroed tensors of the same sharding and exits 1 unless they match.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from checkpoint_vault.client import VaultClient
from checkpoint_vault.client.dcp import VaultReader, VaultWriter

WORLD = 2
TIMEOUT = timedelta(seconds=60)  # every collective; the test bounds the processes too


def expected() -> dict[str, torch.Tensor]:
    """The full tensors, the same in every process."""
    gen = torch.Generator().manual_seed(7)
    return {
        "weight": torch.randn(256, 96, generator=gen),
        "bias": torch.randn(96, generator=gen),
    }


def state(mesh: Any, zeros: bool) -> dict[str, Any]:
    full = expected()
    if zeros:
        full = {k: torch.zeros_like(v) for k, v in full.items()}
    return {
        "model": {
            "weight": distribute_tensor(full["weight"], mesh, [Shard(0)]),
            "bias": distribute_tensor(full["bias"], mesh, [Replicate()]),
        },
        "extra": {"epoch": 0 if zeros else 3},
    }


def main(argv: list[str]) -> int:
    mode, url, token, namespace, port, rank = argv[:6]
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=int(rank),
        world_size=WORLD,
        timeout=TIMEOUT,
    )
    try:
        mesh = init_device_mesh("cpu", (WORLD,))
        with VaultClient(url, token, progress=False) as vault:
            if mode == "save":
                writer = VaultWriter(vault, namespace, metadata={"step": 3})
                dcp.save(state(mesh, zeros=False), storage_writer=writer)
                ckpt = writer.checkpoint.id if writer.checkpoint else None
                dist.barrier()
                print(json.dumps({"rank": int(rank), "checkpoint": ckpt}))
                return 0
            loaded = state(mesh, zeros=True)
            dcp.load(loaded, storage_reader=VaultReader(vault, namespace, argv[6]))
            full = expected()
            ok = (
                torch.equal(loaded["model"]["weight"].full_tensor(), full["weight"])
                and torch.equal(loaded["model"]["bias"].full_tensor(), full["bias"])
                and loaded["extra"] == {"epoch": 3}
            )
            dist.barrier()
            print(json.dumps({"rank": int(rank), "ok": ok}))
            return 0 if ok else 1
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    # Both ranks pass a barrier before either tears its process group down, and the process
    # ends without the interpreter's teardown: gloo's threads can still be joinable when
    # C++ destructors run at exit, which aborts ("terminate called without an active
    # exception", SIGABRT) a rank whose work had succeeded (seen once in CI).
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
