"""A loopback TCP proxy that can cut connections: the network fault client tests need."""

from __future__ import annotations

import asyncio
import threading

from ..serverproc import free_port


class CuttingProxy:
    """Forwards 127.0.0.1:port to a server; `cut_after(n)` drops, once, the connection
    that carries the n-th request byte from now on (counted over all connections)."""

    def __init__(self, target_port: int) -> None:
        self.port = free_port()
        self._target = target_port
        self._cut_at: int | None = None
        self._sent = 0
        self._cut_down_at: int | None = None
        self._received = 0
        self.cuts = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    def cut_after(self, nbytes: int) -> None:
        self._cut_at = self._sent + nbytes

    def cut_download_after(self, nbytes: int) -> None:
        """The same, counting response bytes (server to client)."""
        self._cut_down_at = self._received + nbytes

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", self.port)
        )
        self._ready.set()
        self._loop.run_forever()
        server.close()
        pending = asyncio.all_tasks(self._loop)
        for task in pending:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self._loop.run_until_complete(server.wait_closed())
        self._loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._target)
        except OSError:
            writer.transport.abort()
            return

        async def upstream() -> None:
            while data := await reader.read(1 << 16):
                self._sent += len(data)
                if self._cut_at is not None and self._sent >= self._cut_at:
                    self._cut_at = None
                    self.cuts += 1
                    raise ConnectionResetError("cut by the test proxy")
                up_writer.write(data)
                await up_writer.drain()

        async def downstream() -> None:
            while data := await up_reader.read(1 << 16):
                self._received += len(data)
                if self._cut_down_at is not None and self._received >= self._cut_down_at:
                    self._cut_down_at = None
                    self.cuts += 1
                    raise ConnectionResetError("cut by the test proxy")
                writer.write(data)
                await writer.drain()

        try:
            await asyncio.gather(upstream(), downstream())
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass
        finally:
            for w in (writer, up_writer):
                w.transport.abort()

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
