"""A file GET reads its checkpoint's record once: the files route resolves the reference
(and the checkpoint's files) and hands both to the part's node check and the download,
which used to resolve it again. Counted in the real service, in every thread it runs in
(the event loop's and the pool's), by a profile hook that only watches."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from checkpoint_vault.api import Settings, create_app
from checkpoint_vault.vault import FakeClock
from checkpoint_vault.vault.catalog import Catalog

from ..conftest import Api, hexhash


class Resolves:
    """Calls of `Catalog.resolve` (one record read for a reference) while `counting`."""

    def __init__(self) -> None:
        self.calls = 0
        self.counting = False
        self._lock = threading.Lock()

    def note(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and self.counting and frame.f_code is Catalog.resolve.__code__:
            with self._lock:
                self.calls += 1

    @contextmanager
    def during(self) -> Iterator[None]:
        self.calls, self.counting = 0, True
        try:
            yield
        finally:
            self.counting = False


async def test_a_file_get_resolves_its_checkpoint_once(
    aiohttp_client: Any, settings: Settings, clock: FakeClock
) -> None:
    seen = Resolves()
    # before the app starts: every pool thread it starts from now on is watched
    threading.setprofile(seen.note)
    sys.setprofile(seen.note)
    try:
        client = await aiohttp_client(create_app(settings, clock))
        token = (settings.data_dir / "admin.token").read_text().strip()
        api = Api(client, token, settings.data_dir)
        data = bytes(range(256)) * 40
        rec = await api.save("reads/a", {"f.bin": data})
        etag = f'"{hexhash(data)}"'
        base = "/v1/namespaces/reads/a/checkpoints"
        with seen.during():
            assert await api.read("reads/a", "latest", "f.bin") == data
        assert seen.calls == 1
        with seen.during():
            got = await api.read("reads/a", rec["id"], "f.bin", headers={"Range": "bytes=10-19"})
        assert got == data[10:20]
        assert seen.calls == 1
        with seen.during():
            resp = await api.call(
                "GET", f"{base}/latest/files/f.bin", headers={"If-None-Match": etag}, expect=304
            )
        assert resp.headers["ETag"] == etag
        assert seen.calls == 1
        with seen.during():
            await api.call("GET", f"{base}/latest/files/none.bin", expect=404)
        assert seen.calls == 1
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
