"""A cluster for tests: shard processes (`ckpt serve` with a `[cluster]` section, each its
own data dir and port) over one SeaweedFS, and HAProxy (Debian's 2.6) in front, its
configuration written by `ckpt cluster proxy-config`. Everything is polled with bounds."""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import pytest

from checkpoint_vault.client import VaultClient
from checkpoint_vault.client.errors import ClientError, TransportError

from .aptlock import apt_lock
from .seaweed import SeaweedFS
from .serverproc import ServerProcess, free_port

BEAT = 0.5  # seconds: the tests' beat interval (the default is 1 s)
TTL = 4.0  # seconds: the tests' lease TTL (the default is 6 s)


NAMESPACES = [f"prod-{i}" for i in range(12)]  # what producers save into: every shard


def wait_for(what: str, check: Callable[[], bool], timeout: float = 30.0) -> float:
    """Poll `check` until it holds (bounded); returns the seconds it took."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if check():
            return time.monotonic() - start
        time.sleep(0.05)  # polling a condition, bounded by `timeout`
    raise AssertionError(f"not within {timeout} s: {what}")


def call(
    url: str, token: str, method: str, path: str, body: Any = None, headers: Any = None
) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method=method, headers=headers or {})
    req.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, json.loads(raw) if raw else None


def shard_config(
    path: Path,
    seaweed: SeaweedFS,
    run: str,
    node: str,
    shard: int,
    shards: int,
    port: int,
    standby: bool = False,
    extra: str = "",
    shared: bool = False,
    s3_port: int | None = None,
) -> Path:
    o = seaweed.options()
    creds = (
        f'endpoint = "{o["endpoint"]}"\nregion = "{o["region"]}"\n'
        f'access_key_id = "{o["access_key_id"]}"\n'
        f'secret_access_key = "{o["secret_access_key"]}"\nallow_http = true\n'
    )
    path.write_text(
        "[maintenance]\ntiering_interval = 0\nbackup_interval = 0\n"
        "[tiers.cold]\n"
        f'url = "s3://vault/{run}/shards/{shard}"\nendpoint = "{o["endpoint"]}"\n'
        f'region = "{o["region"]}"\naccess_key_id = "{o["access_key_id"]}"\n'
        f'secret_access_key = "{o["secret_access_key"]}"\nallow_http = true\n'
        '[replication]\ntier = "cold"\nmode = "sync"\n'
        "[cluster]\n"
        f'node = "{node}"\nurl = "http://127.0.0.1:{port}"\nshard = {shard}\n'
        f'shards = {shards}\nstore = "s3://vault/{run}/cluster"\ntier = "cold"\n'
        f"beat_interval = {BEAT}\nlease_ttl = {TTL}\n"
        + ('shared_tier = "shared"\n' if shared else "")
        + ('[standby]\nfollow = "replica:cold"\n' if standby else "")
        + extra
        + (f"[s3]\nport = {s3_port}\n" if s3_port is not None else "")
        + (f'[tiers.shared]\nurl = "s3://vault/{run}/shared"\n{creds}' if shared else "")
    )
    return path


class HAProxy:
    def __init__(self, root: Path, port: int, s3_port: int | None = None) -> None:
        self.root = root
        self.port = port
        self.url = f"http://127.0.0.1:{self.port}"
        self.s3_port = s3_port  # its S3 frontend's (a cluster made with `s3`)
        self.s3_url = f"http://127.0.0.1:{s3_port}"
        self.config = root / "haproxy.cfg"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @staticmethod
    def binary() -> str:
        found = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin")
        if found is None:  # a fresh machine: Debian's package, as pgserver.py and chromium.py do
            with apt_lock():  # another xdist worker may be installing it (tests/aptlock.py)
                found = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin")
                if found is None:
                    subprocess.run(
                        ["apt-get", "install", "-y", "haproxy"], capture_output=True, timeout=600
                    )
                    found = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin")
        if found is None:
            pytest.fail(
                "haproxy not found: the cluster tests need HAProxy 2.6 or later "
                "(Debian 12: apt-get install haproxy), which pip cannot install"
            )
        return found

    def write_config(self, node_url: str, token: str) -> None:
        """Through the CLI, as an operator would: `ckpt cluster proxy-config`."""
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "checkpoint_vault.cli",
                "--url",
                node_url,
                "--token",
                token,
                "cluster",
                "proxy-config",
                "--bind",
                f"127.0.0.1:{self.port}",
                *(["--s3-bind", f"127.0.0.1:{self.s3_port}"] if self.s3_port else []),
                "-o",
                str(self.config),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr

    def start(self) -> None:
        self._log = open(self.root / "haproxy.log", "ab")  # noqa: SIM115 - closed in stop()
        self._proc = subprocess.Popen(
            [self.binary(), "-db", "-f", str(self.config)],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

        def up() -> bool:
            assert self._proc is not None
            assert self._proc.poll() is None, self.log_tail()
            try:
                with urllib.request.urlopen(self.url + "/v1/health", timeout=1) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        wait_for("haproxy answering health", up)

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGKILL)
            self._proc.wait(timeout=10)
        self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self) -> str:
        try:
            return (self.root / "haproxy.log").read_text(errors="replace")[-3000:]
        except OSError:
            return ""


class Cluster:
    """`shards` primaries, node `n<k>` holding shard k, and a proxy in front; with
    `standbys`, node `n<k+1>` also runs shard k's standby (`standbys[k]`)."""

    def __init__(
        self,
        root: Path,
        seaweed: SeaweedFS,
        run: str,
        shards: int = 3,
        standbys: bool = False,
        workers: int = 1,
        extra: str = "",
        shared: bool = False,
        s3: bool = False,
    ) -> None:
        self.root = root
        self.extra = extra  # more TOML for every process's config
        self.workers = workers
        self.seaweed = seaweed
        self.run = run
        self.shards = shards
        self.shared = shared  # one tier and chunk index for every node (issue 44)
        # with `s3`, each process's S3 endpoint (api/s3/) by its process name
        self.s3_ports: dict[str, int] = {}
        self._s3 = s3
        self.nodes: list[ServerProcess] = []
        self.standbys: list[ServerProcess] = []
        self._ports: set[int] = set()  # every process's and the proxy's: all different
        for k in range(shards):
            self.nodes.append(self._process(f"n{k}", k, standby=False))
        if standbys:
            for k in range(shards):
                self.standbys.append(self._process(f"n{(k + 1) % shards}", k, standby=True))
        self.proxy = HAProxy(root, self._port(), self._port() if s3 else None)

    def _port(self) -> int:
        """A free port none of this cluster's processes was given: ports are all picked
        before any is bound, and free_port may hand out one twice."""
        port = free_port()
        while port in self._ports:
            port = free_port()
        self._ports.add(port)
        return port

    def _process(self, node: str, shard: int, standby: bool) -> ServerProcess:
        name = f"{node}-s{shard}"
        port = self._port()
        if self._s3:  # a standby's too: it serves its shard's buckets once it takes over
            self.s3_ports[name] = self._port()
        config = shard_config(
            self.root / f"{name}.toml", self.seaweed, self.run, node, shard, self.shards, port,
            standby, self.extra, self.shared, self.s3_ports.get(name),
        )  # fmt: skip
        return ServerProcess(
            self.root / name, port, self.root / f"{name}.log", config, workers=self.workers
        )

    def start_standby(self, proc: ServerProcess) -> None:
        """A standby has no admin token of its own: the operator's copy of the cluster's."""
        proc.data_dir.mkdir(parents=True, exist_ok=True)
        (proc.data_dir / "admin.token").write_text(self.token)
        proc.start()

    def reconfigure(self, proc: ServerProcess, standby: bool) -> None:
        """Rewrite `proc`'s config as its shard's primary or standby (same node, port)."""
        assert proc.config is not None
        node, shard = proc.data_dir.name.split("-s")
        shard_config(
            proc.config, self.seaweed, self.run, node, int(shard), self.shards, proc.port, standby,
            self.extra,
            self.shared,
            self.s3_ports.get(proc.data_dir.name),
        )  # fmt: skip

    def s3_url(self, node: int) -> str:
        """Primary `node`'s S3 endpoint (a cluster made with `s3`)."""
        return f"http://127.0.0.1:{self.s3_ports[self.nodes[node].data_dir.name]}"

    def processes(self) -> list[ServerProcess]:
        return [*self.nodes, *self.standbys]

    @property
    def token(self) -> str:
        return self.nodes[0].token

    def state(self, node: int = 0) -> dict[str, Any]:
        status, body = call(self.nodes[node].url, self.nodes[node].token, "GET", "/v1/cluster")
        assert status == 200, body
        assert isinstance(body, dict)
        return body

    def start(self) -> None:
        for node in self.nodes:
            node.start()

        def everyone_known() -> bool:
            for i in range(self.shards):
                owners = self.state(i)["shard_owners"]
                if any(o["owner"] is None for o in owners):
                    return False
            return True

        wait_for("every node seeing every shard's owner", everyone_known)
        for proc in self.standbys:
            self.start_standby(proc)
        if self.standbys:
            wait_for(
                "every shard with a live standby",
                lambda: all(s["standbys"] for s in self.state(0)["shard_owners"]),
            )
        # node 0's admin token, mirrored to every node through the store
        wait_for(
            "node 0's token accepted everywhere",
            lambda: all(
                call(n.url, self.token, "GET", "/v1/cluster")[0] == 200 for n in self.nodes
            ),
        )
        self.proxy.write_config(self.nodes[0].url, self.token)
        self.proxy.start()

    def stop(self) -> None:
        self.proxy.stop()
        for proc in self.processes():
            proc.stop()


class Producers:
    """Threads saving through the proxy; what was acknowledged, and what failed."""

    def __init__(self, url: str, token: str, threads: int = 2) -> None:
        self.acked: list[tuple[str, str, bytes]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, args=(url, token, i), daemon=True)
            for i in range(threads)
        ]

    def _run(self, url: str, token: str, seed: int) -> None:
        rng = random.Random(seed)
        with VaultClient(url, token, progress=False) as client:
            n = 0
            while not self._stop.is_set():
                ns = rng.choice(NAMESPACES)
                body = f'{{"seed": {seed}, "n": {n}, "pad": "{rng.randbytes(64).hex()}"}}'
                n += 1
                try:
                    ckpt = client.save(ns, {"state.json": body.encode()})
                except (ClientError, TransportError) as e:
                    with self._lock:
                        self.errors.append(f"{type(e).__name__}: {e}")
                    continue
                with self._lock:
                    self.acked.append((ns, ckpt.id, body.encode()))

    def __enter__(self) -> Producers:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=120)

    def count(self) -> int:
        with self._lock:
            return len(self.acked)
