"""Where a load puts a checkpoint's files, and `ckpt pull` from a server on this machine
without the client machinery.

Each file is restored under a part name and renamed into place once complete and verified,
so a failed load leaves no file that looks restored. On the server's machine a restore is
one request per file on its local socket: the server writes the file itself
(client/local.py). What a fresh process paid before that request, the event loop and the
whole client (~60 ms of imports here, ~90 ms with their start-up), was a fifth to a third
of restoring a 300 MB checkpoint at the disk's speed; `load_here` pays for `http.client`
only. Whatever it does not handle (no local socket, a refusal, a broken connection, a
server that predates restores by descriptor) it hands to `VaultClient.load` by returning
None, having left no part file behind: one implementation then retries, reports errors and
shows progress, as for every other command.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from checkpoint_vault.protocol import DEFAULT_URL, FileInfo

from . import local
from .connections import Broken
from .endpoint import LOOPBACK, default_token, file_path, ns_path
from .errors import IntegrityError
from .models import Checkpoint

# Files of one checkpoint loaded, or handed over to save, at once (finetune series: +10-15%).
FILES_IN_FLIGHT = 2


def load_here(
    url: str | None,
    token: str | None,
    namespace: str,
    ref: str,
    dest: str | os.PathLike[str],
    timeout: float = 300.0,
    durable: bool = False,
) -> Checkpoint | None:
    """`VaultClient(url, token).load(namespace, ref, dest)` done by a server on this machine,
    or None (nothing written) when it cannot be done so; an error only for a restore that
    went wrong (the server wrote something else than asked)."""
    url = url or os.environ.get("CKPT_URL") or DEFAULT_URL
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname not in LOOPBACK:
        return None
    token = token if token is not None else default_token(url)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    prefix = parts.path.rstrip("/")
    health = local.get_json(
        http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout),
        prefix + "/v1/health",
    )
    sock = local.socket_of(health, timeout)
    if sock is None:
        return None
    path = f"{prefix}/v1/namespaces/{ns_path(namespace)}/checkpoints/{ref}"
    path += "?durable=true" if durable else ""
    record = local.get_json(local.UnixConnection(sock, timeout), path, headers)
    if record is None:
        return None
    ckpt = Checkpoint.from_wire(record)
    targets = restore_targets(dest, ckpt.files)

    def one(name: str) -> bool:
        target = prefix + file_path(ckpt.namespace, ckpt.id, name)
        return _restore(sock, target, headers, targets[name], ckpt.files[name], timeout)

    return ckpt if _all(one, list(ckpt.files)) else None


def _all(fn: Callable[[str], bool], names: list[str]) -> bool:
    """`fn` of every name, `FILES_IN_FLIGHT` at a time, until one is False or raises (then
    raised here); True if all were True."""
    pending = iter(names)
    outcome: list[BaseException | None] = []  # the first False (None) or failure ends it
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                name = None if outcome else next(pending, None)
            if name is None:
                return
            try:
                if fn(name):
                    continue
                failure: BaseException | None = None
            except BaseException as e:  # noqa: BLE001 - raised by the caller's thread
                failure = e
            with lock:
                outcome.append(failure)
            return

    threads = [threading.Thread(target=work) for _ in range(min(FILES_IN_FLIGHT, len(names)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if outcome and outcome[0] is not None:
        raise outcome[0]
    return not outcome


def restore_targets(dest: str | os.PathLike[str], files: Mapping[str, Any]) -> dict[str, Path]:
    """Where each file of a checkpoint goes under `dest`; a name that would leave it is
    refused (a checkpoint's names come from whoever saved it)."""
    root = Path(dest).resolve()
    targets = {name: (root / name).resolve() for name in files}
    for name, target in targets.items():
        if root not in target.parents:
            raise IntegrityError(f"file name {name!r} escapes {root}")
    return targets


def part_of(target: Path) -> Path:
    """The name `target` is restored under until it is complete."""
    return target.with_name(target.name + ".ckpt-part")


def _restore(
    sock: str,
    target: str,
    headers: Mapping[str, str],
    dest: Path,
    info: FileInfo,
    timeout: float,
) -> bool:
    """One file written by the server into its part file, then renamed into place; False
    (no part file left) for anything `VaultClient.load` should take over."""
    size, digest = info.size, info.hash
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = part_of(dest)
    partial.touch()
    try:
        try:
            status, _, payload = local.hand_over_file(
                sock, target, headers, partial, timeout, restore_size=size
            )
        except (local.Unsupported, Broken):
            status, payload = 0, b""
        if status != 200:
            partial.unlink(missing_ok=True)
            return False
        local.check_restored(target, _json(payload), partial, size, digest)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, dest)
    return True


def _json(payload: bytes) -> Any:
    try:
        return json.loads(payload)
    except ValueError:
        return None
