"""One rank of a 4-process `dcp.save` across two "hosts" of a cluster (gloo, loopback):
each rank's nearby client is its host's node, the commit goes through the proxy
(client/dcp.py's parts).

    python -m tests.integration.dcp_hosts_worker '<json: proxy, near, token, ns, port,
        rank, world, [kill_pid], [part_ttl]>'

The state is a DTensor sharded by rows over the ranks, a replicated one and a plain object;
its values depend only on a fixed seed. Prints `{"rank", "checkpoint", "error"}` (the id on
the coordinator; the error's class when dcp.save raised); with `kill_pid`, this rank
SIGKILLs that process (its host's node) once its own part is committed.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.futures import Future

from checkpoint_vault.client import VaultClient
from checkpoint_vault.client.dcp import VaultWriter
from checkpoint_vault.client.transport import RetryPolicy

TIMEOUT = timedelta(seconds=60)  # every collective; the test bounds the processes too


def expected() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(44)
    return {"weight": torch.randn(512, 96, generator=gen), "bias": torch.randn(96, generator=gen)}


def state(mesh: Any) -> dict[str, Any]:
    full = expected()
    return {
        "model": {
            "weight": distribute_tensor(full["weight"], mesh, [Shard(0)]),
            "bias": distribute_tensor(full["bias"], mesh, [Replicate()]),
        },
        "extra": {"epoch": 5},
    }


class KillingWriter(VaultWriter):
    """Kills this host's node right after this rank's part is committed."""

    kill_pid = 0

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        written = super().write_data(plan, planner)
        os.kill(self.kill_pid, signal.SIGKILL)
        return written


def main(args: dict[str, Any]) -> dict[str, Any]:
    rank = int(args["rank"])
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{args['port']}",
        rank=rank,
        world_size=int(args["world"]),
        timeout=TIMEOUT,
    )
    once = RetryPolicy(attempts=1)  # a dead node fails the save at once, as the test expects
    try:
        mesh = init_device_mesh("cpu", (int(args["world"]),))
        with (
            VaultClient(args["proxy"], args["token"], progress=False, retry=once) as proxy,
            VaultClient(args["near"], args["token"], progress=False, retry=once) as near,
        ):
            cls = KillingWriter if args.get("kill_pid") else VaultWriter
            writer = cls(
                proxy, args["ns"], nearby=near, part_ttl=args.get("part_ttl"),
                metadata={"step": 5},
            )  # fmt: skip
            if isinstance(writer, KillingWriter):
                writer.kill_pid = int(args["kill_pid"])
            error = None
            try:
                dcp.save(state(mesh), storage_writer=writer)
            except CheckpointException as e:  # a BaseException; the test asserts it
                error = type(e).__name__
            except Exception as e:  # the test asserts which, on every rank
                error = type(e).__name__
            ckpt = writer.checkpoint.id if writer.checkpoint else None
            return {"rank": rank, "checkpoint": ckpt, "error": error}
    finally:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    # Exit without the interpreter's teardown, as tests/client/dcp_worker.py does (gloo's
    # threads can abort a rank whose work succeeded).
    out = main(json.loads(sys.argv[1]))
    print(json.dumps(out))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
