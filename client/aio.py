"""`AsyncVaultClient`: every producer and operator call, as coroutines. This is the one
client implementation: `VaultClient` is generated from it (client/_gen_sync.py).

Saving: small checkpoints (all files known and together under `small_save_limit`) go in one
request; larger ones are chunked here with the namespace's FastCDC parameters, hashed with
BLAKE3, and only chunks the vault lacks are sent, in batches, several at a time. Files are
read in 16 MiB pieces: a 10 GiB file never sits in memory. Loading streams each file to a
temporary name, verifies its BLAKE3, then renames it into place; a dropped connection
resumes with a Range request where it stopped (client/transport.py). `open` reads a file
by ranges (client/remotefile.py).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import os
import secrets
from collections.abc import Collection, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal, TypeVar, overload
from urllib.parse import quote

from checkpoint_vault.protocol import (
    BUNDLE_TYPE,
    CHUNK_BATCH_TYPE,
    DEFAULT_URL,
    SAVES_TYPE,
    AuditEntry,
    BulkDeleted,
    CatalogBackup,
    CheckReport,
    ChunkingProfile,
    CommitFile,
    CompactReport,
    FileInfo,
    GcReport,
    Health,
    Manifest,
    NamespaceEntry,
    PolicyRecord,
    Promotion,
    RetentionReport,
    StatsReport,
    StreamChunker,
    TieringReport,
    TokenIssued,
    TokenRecord,
    UploadOpened,
    Usage,
    VerifyReport,
    bundle_parts,
    encode_chunk_batch,
)

from . import fastjson, local
from .background import BackgroundSaves, Prepare, SaveHandle, snapshot_files
from .chunking import (
    FileSpec,
    Reader,
    Source,
    chunk_ids,
    collect_sources,
    contents,
    tensor_layout,
)
from .coalesce import Coalescer
from .endpoint import default_token, file_path, ns_path, tls_from_env, warn_plain_http
from .errors import IntegrityError, MissingChunks, NotFound, TransactionAborted
from .filesink import FileSink
from .models import Checkpoint, Transfer
from .options import SaveFields, SaveOptions
from .parts import Part
from .progress import Progress
from .remotefile import AsyncRemoteFile, OpeningFile, RangeReader, fetch_range
from .restore import FILES_IN_FLIGHT, part_of, restore_targets
from .transport import Prepared, RetryPolicy, Transport

if TYPE_CHECKING:
    from typing_extensions import Unpack

T = TypeVar("T")

# Bytes read, chunked and sent per step, and chunk bytes per POST .../chunks: a piece goes in
# one request. Each request costs ~2 ms of CPU across client and server: 2 MiB batches cost
# ~0.8 s more per GB saved than 8 MiB ones, and 16 MiB pieces saved 5-15% faster than 8.
PIECE = 16 << 20
BATCH_BYTES = PIECE
MAX_IDS_PER_QUERY = 50_000
SMALL_SAVE_LIMIT = 4 << 20  # below this, one request does the whole save
PREPARED_SAVES = 1024  # namespaces whose one-request save's head is kept made
PIECES_IN_FLIGHT = 2  # pieces being sent at once: bounds memory at ~3 x 16 MiB (one cut ahead)
# After this many pieces in a row with nothing the vault already had, send without asking
# (bytes on the wire can exceed the changed bytes by at most what a partly known piece
# holds, and such a piece ends the streak).
NOVEL_STREAK = 2
# Bytes of pieces with nothing new whose references are held for the file's next batch:
# past this they go on their own if the file sent something, else the rest of the file
# goes without its place (the server hashes at most vault.uploads.MAX_REFERENCED_BYTES of
# references per batch).
MAX_HELD_BYTES = 1 << 30


@dataclass(frozen=True)
class _Staged:
    """An upload whose files are all sent or handed over, and its commit listing."""

    upload: UploadSession
    sender: _Sender
    listing: dict[str, dict[str, Any]]
    socket: str | None
    handed: frozenset[str]

    @property
    def entry(self) -> tuple[UploadSession, dict[str, dict[str, Any]]]:
        """Its place in a commit of several uploads (`_commit_uploads`)."""
        return self.upload, self.listing


@dataclass(frozen=True)
class UploadSession:
    """An open upload: any number of writers (threads, processes, ranks) send files into
    it, then one commit makes them a checkpoint. Picklable, to hand to other processes."""

    id: str
    namespace: str
    chunking: dict[str, Any]  # the FastCDC profile every writer must cut with


class AsyncVaultClient:
    """A Checkpoint Vault client for async code: `async with AsyncVaultClient() as vault`.
    Public coroutine methods here get a blocking twin on `VaultClient`: after changing
    one, run `python -m checkpoint_vault.client._gen_sync`."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        connections: int = 8,
        retry: RetryPolicy | None = None,
        timeout: float = 300.0,
        small_save_limit: int = SMALL_SAVE_LIMIT,
        progress: bool | None = None,
        max_background_saves: int = 1,
        local_files: bool = True,
        small_saves_in_flight: int = 4,
    ) -> None:
        """`local_files`: files of a save that are files on disk are handed to a server on
        this machine by descriptor, when it offers its socket (client/local.py), rather
        than sent, and the files of a load are handed over for it to write; False always
        sends and downloads. `small_saves_in_flight`: one-request saves travelling at
        once; saves made while that many are under way go together in the next request
        (client/coalesce.py); 0 sends each on its own at once."""
        self.url = url or os.environ.get("CKPT_URL") or DEFAULT_URL
        token = token if token is not None else default_token(self.url)
        warn_plain_http(self.url, token)
        self._t = Transport(
            self.url,
            token,
            retry=retry,
            connections=connections,
            timeout=timeout,
            tls=tls_from_env(),
        )
        self.small_save_limit = small_save_limit
        self.local_files = local_files
        self.progress = progress
        self.background = BackgroundSaves(max_background_saves)
        self._small = Coalescer(self._send_small, self._send_saves, small_saves_in_flight)
        self._saves_here: dict[str, Prepared] = {}  # by namespace, for `_post_small_here`

    @property
    def transfer(self) -> Transfer:
        return self._t.transfer

    async def close(self) -> None:
        """Waits for background saves first; raises `BackgroundSaveFailed` (once closed)
        if any failed without its handle being asked."""
        try:
            await self.background.wait()
        finally:
            await self._t.close()

    async def __aenter__(self) -> AsyncVaultClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- saving -----------------------------------------------------------------------
    @overload
    async def save(
        self,
        namespace: str,
        files: FileSpec | Mapping[str, FileSpec],
        *,
        background: Literal[False] = False,
        **options: Unpack[SaveFields],
    ) -> Checkpoint: ...
    @overload
    async def save(
        self,
        namespace: str,
        files: FileSpec | Mapping[str, FileSpec],
        *,
        background: Literal[True],
        **options: Unpack[SaveFields],
    ) -> SaveHandle: ...
    @overload
    async def save(
        self,
        namespace: str,
        files: FileSpec | Mapping[str, FileSpec],
        *,
        background: bool,
        **options: Unpack[SaveFields],
    ) -> Checkpoint | SaveHandle: ...
    async def save(
        self,
        namespace: str,
        files: FileSpec | Mapping[str, FileSpec],
        *,
        background: bool = False,
        **options: Unpack[SaveFields],
    ) -> Checkpoint | SaveHandle:
        """Save files as a new checkpoint of `namespace`; returns it once committed.
        `options`: `SaveFields` (parent, inherit, metadata, tags, chunking).
        `background=True`: read the files into memory now (in the caller's thread when
        called through `VaultClient`), upload them behind the caller, and return a
        `SaveHandle` at once (see client/background.py)."""
        opts = SaveOptions.of(options)
        if background:
            return await self.submit(lambda: self._save(namespace, snapshot_files(files), opts))
        return await self._save(namespace, files, opts)

    async def _save(
        self, namespace: str, files: FileSpec | Mapping[str, FileSpec], opts: SaveOptions
    ) -> Checkpoint:
        return await self._save_sources(namespace, collect_sources(files), opts)

    def _fits_one_request(self, sources: Sequence[Source]) -> bool:
        """Whether a save of `sources` is small enough for the one-request path: every size
        known, together at most `small_save_limit`."""
        sizes = [s.size for s in sources]
        return all(n >= 0 for n in sizes) and sum(sizes) <= self.small_save_limit

    async def _save_sources(
        self, namespace: str, sources: list[Source], opts: SaveOptions
    ) -> Checkpoint:
        if self._fits_one_request(sources):
            return await self._save_small(namespace, sources, opts)
        staged = await self._stage_save(namespace, sources, opts)
        return Checkpoint.from_wire(await self._commit(staged, sources))

    async def _stage_save(
        self, namespace: str, sources: list[Source], opts: SaveOptions
    ) -> _Staged:
        """A new upload of `namespace` holding `sources`, not committed yet."""
        up = await self._open_upload(namespace, opts)
        return await self._stage(up, sources, f"save {namespace}")

    async def _stage(self, up: UploadSession, sources: list[Source], what: str) -> _Staged:
        """Every source into the upload (handed over or sent), not committed yet."""
        sizes = [s.size for s in sources]
        socket = await self._t.local_socket() if self.local_files else None
        handed = {s.name for s in sources if socket is not None and s.path is not None}
        with Progress(self.progress, sum(n for n in sizes if n > 0), what) as bar:
            sender = _Sender(self._t, up.id, up.chunking, bar)
            gate = asyncio.Semaphore(FILES_IN_FLIGHT)

            async def hand(source: Source) -> None:
                assert socket is not None
                async with gate:
                    await self._hand_over(socket, up.id, source)
                bar.update(source.size)

            # Files handed over go two at a time, beside those sent: each one's answer
            # waits for its entry to be synced, which the other's reading fills.
            handing = asyncio.ensure_future(_all([hand(s) for s in sources if s.name in handed]))
            try:
                listing = {s.name: await sender.send(s) for s in sources if s.name not in handed}
                await handing
            finally:
                handing.cancel()
                await asyncio.gather(handing, return_exceptions=True)
        return _Staged(up, sender, listing, socket, frozenset(handed))

    async def _hand_over(self, socket: str, upload_id: str, source: Source) -> None:
        """Give the server on this machine the file itself; it becomes part of the upload
        as a file streamed through it would (no listing at the commit)."""
        assert source.path is not None
        path = f"/v1/uploads/{upload_id}/files/{quote(source.name)}"
        await self._t.hand_over(socket, path, source.path)

    async def submit(self, prepare: Prepare, *, timeout: float | None = None) -> SaveHandle:
        """Run a save in the background: wait for one of `max_background_saves` slots (at
        most `timeout` seconds, then TimeoutError), run `prepare` (it takes the snapshot
        and returns the upload coroutine) in the caller's thread (through `VaultClient`)
        or a worker thread, then upload on the client's loop."""
        return await self.background.submit(prepare, timeout=timeout)

    async def flush(self) -> None:
        """Wait for every background save; raise `BackgroundSaveFailed` for failed ones
        whose handles nobody asked."""
        await self.background.wait()

    # -- saving in steps: several writers, one commit --------------------------------
    async def begin_upload(self, namespace: str, **options: Unpack[SaveFields]) -> UploadSession:
        """Open an upload that `send_file` calls (from any client, any process) fill and
        `commit` closes."""
        return await self._open_upload(namespace, SaveOptions.of(options))

    async def send_file(
        self,
        upload: UploadSession,
        name: str,
        file: FileSpec,
        *,
        cuts: Sequence[int] = (),
        regions: Sequence[tuple[int, int]] | None = None,
    ) -> CommitFile:
        """Chunk one file with the upload's profile and send the chunks the vault lacks;
        answer its commit entry (size and chunk ids) for `commit` (the server computes
        the file's hash). `cuts`: byte offsets where a chunk must end (each segment between
        them is cut on its own). `regions`: where the file's tensors lie, when the caller
        knows (a stream), for the profile's tensor pieces; None reads it from the file when
        it can."""
        (source,) = collect_sources({name: file})
        with Progress(self.progress, max(source.size, 0), f"send {name}") as bar:
            sender = _Sender(self._t, upload.id, upload.chunking, bar)
            return CommitFile.from_wire(await sender.send(source, cuts=cuts, regions=regions))

    async def commit(self, upload: UploadSession, files: Mapping[str, CommitFile]) -> Checkpoint:
        """Make the upload a checkpoint of exactly `files` (name -> `send_file` entry)."""
        return Checkpoint.from_wire(await self._post_files(upload, "commit", _listing(files)))

    async def abort(self, upload: UploadSession) -> None:
        await self._t.request("DELETE", f"/v1/uploads/{upload.id}")

    # -- several namespaces, one commit ----------------------------------------------
    async def commit_all(
        self,
        saves: Mapping[str, FileSpec | Mapping[str, FileSpec]],
        *,
        transaction: str | None = None,
        **options: Unpack[SaveFields],
    ) -> dict[str, Checkpoint]:
        """Save files into several namespaces (namespace -> files, as `save` takes them)
        as one commit: every one becomes a checkpoint, or none does, across a cluster's
        shards too (`POST /v1/commits`). `options` apply to each. Returns namespace ->
        checkpoint. `transaction`: its id (default: a new one), which makes retries of
        the call return what the first made. A `missing_chunks` or `transaction_aborted`
        refusal leaves the uploads open: they are committed once more, in a new
        transaction (the lost chunks sent again first)."""
        opts = SaveOptions.of(options)
        sources = [collect_sources(files) for files in saves.values()]
        staged = await _all(
            [self._stage_save(ns, src, opts) for ns, src in zip(saves, sources, strict=True)]
        )
        commits = [s.entry for s in staged]
        try:
            done = await self._commit_uploads(commits, transaction)
        except (MissingChunks, TransactionAborted) as e:
            # The refusal aborted that transaction and opened its uploads again: once more
            # in a new one, the lost chunks sent again first (as `save` does), or after
            # an owner away past the timeout made its resolvers abort.
            if isinstance(e, MissingChunks):
                for one, src in zip(staged, sources, strict=True):
                    lost = set(e.missing)
                    await self._resend(one.sender, src, one.listing, lost, one.socket, one.handed)
            done = await self._commit_uploads(commits, None)
        return {c.namespace: c for c in done}

    async def commit_uploads(
        self,
        commits: Sequence[tuple[UploadSession, Mapping[str, CommitFile]]],
        *,
        transaction: str | None = None,
    ) -> list[Checkpoint]:
        """Commit uploads of several namespaces (from `begin_upload` and `send_file`, each
        with its own options) all or nothing; checkpoints in the order given."""
        listed = [(up, _listing(files)) for up, files in commits]
        return await self._commit_uploads(listed, transaction)

    async def _commit_uploads(
        self,
        commits: Sequence[tuple[UploadSession, Mapping[str, dict[str, Any]]]],
        transaction: str | None,
    ) -> list[Checkpoint]:
        body = {
            "transaction": transaction or secrets.token_hex(16),  # one id for every retry
            "commits": [
                {"namespace": up.namespace, "upload_id": up.id, "files": dict(files)}
                for up, files in commits
            ],
        }
        answer = await self._t.json("POST", "/v1/commits", json_body=body)
        return [Checkpoint.from_wire(rec) for rec in answer["checkpoints"]]

    # -- saving on many hosts, one commit (client/parts.py) ---------------------------
    async def save_part(
        self,
        namespace: str,
        files: FileSpec | Mapping[str, FileSpec],
        *,
        ttl: float | None = None,
    ) -> Part:
        """Save files on this client's node (a node near the caller: on its own host,
        files go by descriptor) as a *part* of a checkpoint of `namespace` that
        `commit_parts` makes, with other hosts' parts, through any node. The part is held
        on its node for its TTL ([uploads] part_ttl, or `ttl` seconds if shorter) unless
        a commit adopts it first."""
        sources = collect_sources(files)
        up = await self.begin_part(namespace, ttl=ttl)
        staged = await self._stage(up, sources, f"part of {namespace}")
        return Part.from_wire(await self._commit(staged, sources, "part"))

    async def begin_part(self, namespace: str, *, ttl: float | None = None) -> UploadSession:
        """Open a part's upload on this client's node: `send_file` fills it (from any
        process on this host), `commit_part` closes it. `ttl` as for `save_part`."""
        body: dict[str, Any] = {"namespace": namespace}
        if ttl is not None:
            body["ttl"] = ttl
        return await self._open_session("/v1/parts", body)

    async def commit_part(self, upload: UploadSession, files: Mapping[str, CommitFile]) -> Part:
        """Commit a part's upload of exactly `files` (as `commit`) and answer the part."""
        return Part.from_wire(await self._post_files(upload, "part", _listing(files)))

    async def commit_parts(
        self,
        namespace: str,
        parts: Sequence[Part],
        *,
        ship_timeout: float | None = None,
        wait_durable: bool = False,
        **options: Unpack[SaveFields],
    ) -> Checkpoint:
        """One checkpoint of `namespace` holding every part's files, committed by the
        namespace's owner (ask through the proxy or any node): visible all or nothing.
        `PartUnavailable`: a part's node is down or the part is not shipped yet (retry);
        `PartGone`: a part is no longer held (save it again). `ship_timeout`: seconds
        the owner waits for part nodes to ship (server default 600), with `wait_durable`.
        `wait_durable`: answer only once every part is in the shared tier (`durable`
        true); else the checkpoint is visible as soon as every part's node answered, with
        `durable` false until the owner adopted them (docs/DESIGN.md)."""
        body = SaveOptions.of(options).wire()
        body["parts"] = [p.ref() for p in parts]
        if ship_timeout is not None:
            body["ship_timeout"] = ship_timeout
        if wait_durable:
            body["wait_durable"] = True
        path = f"/v1/namespaces/{ns_path(namespace)}/parts"
        return Checkpoint.from_wire(await self._t.json("POST", path, json_body=body))

    async def _open_upload(self, namespace: str, opts: SaveOptions) -> UploadSession:
        path = f"/v1/namespaces/{ns_path(namespace)}/uploads"
        return await self._open_session(path, opts.wire())

    async def _open_session(self, path: str, body: dict[str, Any]) -> UploadSession:
        """`POST path` opening an upload (a save's, a part's: `begin_part`): its session."""
        opened = UploadOpened.from_wire(await self._t.json("POST", path, json_body=body))
        return UploadSession(opened.upload_id, opened.namespace, opened.chunking)

    async def _save_small(
        self, namespace: str, sources: list[Source], opts: SaveOptions
    ) -> Checkpoint:
        if all(s.in_memory is not None for s in sources):
            body = _bundle(namespace, contents(sources), opts)
        else:
            files = await asyncio.to_thread(contents, sources)  # reads files
            body = _bundle(namespace, files, opts)
        return Checkpoint.from_wire(await self._small.save(namespace, body))

    async def _send_small(self, namespace: str, body: bytes) -> Any:
        return await self._t.json(
            "POST", _checkpoints_path(namespace), data=body, headers=_BUNDLE_HEADERS
        )

    async def _send_saves(self, bodies: list[bytes]) -> Any:
        return await self._t.json("POST", "/v1/saves", data=bodies, headers=_SAVES_HEADERS)

    def _save_small_here(
        self, namespace: str, files: list[tuple[str, bytes]], opts: SaveOptions
    ) -> Checkpoint:
        """A one-request save on the caller's thread, which it blocks (`VaultClient.save`):
        the same request, retries and errors as `_save_small`, without a hop to the
        client's loop thread and from there to a transport thread and back (through
        LangGraph's VaultSaver: client CPU per call ~1.0 -> ~0.65 ms, put p50 4.0 -> 3.0 ms)."""
        return Checkpoint.from_wire(self._post_small_here(namespace, files, opts, parse=True))

    def _post_small_here(
        self, namespace: str, files: list[tuple[str, bytes]], opts: SaveOptions, *, parse: bool
    ) -> Any:
        """The request of `_save_small_here`: the answer's JSON, or None with `parse=False`
        (a caller that needs no record back, such as a LangGraph writes record: reading
        and checking the record cost ~15% of such a save's client CPU)."""
        request = self._saves_here.get(namespace)
        if request is None:
            if len(self._saves_here) >= PREPARED_SAVES:
                self._saves_here.clear()  # a program saving to ever new namespaces
            request = self._t.prepare("POST", _checkpoints_path(namespace), _BUNDLE_HEADERS)
            self._saves_here[namespace] = request
        return self._t.send_here(request, _bundle_parts(namespace, files, opts), parse=parse)

    async def _commit(self, staged: _Staged, sources: list[Source], verb: str = "commit") -> Any:
        """`POST .../<verb>` of a staged upload: its answer (a checkpoint's record; a
        part's, client/parts.py)."""
        try:
            return await self._post_files(staged.upload, verb, staged.listing)
        except MissingChunks as e:
            # Chunks went missing between our query and the commit (collected, or found
            # damaged, or lost with a server's crash before they were durable): send those
            # again from the files, once, and commit again.
            lost = set(e.missing)
            await self._resend(
                staged.sender, sources, staged.listing, lost, staged.socket, staged.handed
            )
            return await self._post_files(staged.upload, verb, staged.listing)

    async def _post_files(
        self, upload: UploadSession, verb: str, listing: dict[str, dict[str, Any]]
    ) -> Any:
        """`POST /v1/uploads/{id}/<verb>` of the upload's files listing (`commit`: a
        checkpoint; `part`: a part): the answer's JSON."""
        path = f"/v1/uploads/{upload.id}/{verb}"
        return await self._t.json("POST", path, json_body={"files": listing})

    async def _resend(
        self,
        sender: _Sender,
        sources: list[Source],
        listing: dict[str, dict[str, Any]],
        lost: set[str],
        socket: str | None,
        handed: Collection[str],
    ) -> None:
        """Send the `lost` chunks of an upload's files again; files handed over are handed
        over again (their chunk lists are the server's)."""
        for s in sources:
            if s.name in listing and lost & set(listing[s.name]["chunks"]):
                await sender.send(s, force=lost)
            elif s.name in handed and socket is not None:
                await self._hand_over(socket, sender.upload_id, s)

    # -- loading ----------------------------------------------------------------------
    async def load(
        self,
        namespace: str,
        ref: str = "latest-valid",
        dest: str | os.PathLike[str] = ".",
        *,
        durable: bool = False,
    ) -> Checkpoint:
        """Write every file of a checkpoint under `dest`, each verified against its hash.
        `durable`: `latest`/`latest-valid` skip checkpoints not durable yet (`get`)."""
        ckpt = await self.get(namespace, ref, durable=durable)
        targets = await asyncio.to_thread(restore_targets, dest, ckpt.files)
        total = sum(f.size for f in ckpt.files.values())
        slots = asyncio.Semaphore(FILES_IN_FLIGHT)
        socket = await self._t.local_socket() if self.local_files else None  # asked once

        async def one(name: str, bar: Progress) -> None:
            async with slots:
                await self._download(ckpt, name, ckpt.files[name], targets[name], bar, socket)

        with Progress(self.progress, total, f"load {namespace}") as bar:
            await _all([one(name, bar) for name in ckpt.files])
        return ckpt

    async def _download(
        self,
        ckpt: Checkpoint,
        name: str,
        info: FileInfo,
        target: Path,
        bar: Progress,
        socket: str | None = None,
    ) -> None:
        """One file of `load`: written by the server on this machine if `socket` is its
        local socket, else received over HTTP."""
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = part_of(target)
        size = info.size
        path = file_path(ckpt.namespace, ckpt.id, name)
        out = await _create(partial)
        try:
            with out:
                written = socket is not None and await self._restore_into(
                    socket, path, partial, info, bar
                )
                if not written:  # no server here, or one that cannot: over HTTP
                    await self._receive(out, path, size, info.hash, bar, partial)
        except BaseException:
            partial.unlink(missing_ok=True)  # a failed download leaves nothing behind
            raise
        os.replace(partial, target)

    async def _receive(
        self, out: IO[bytes], path: str, size: int, digest: str, bar: Progress, file: Path
    ) -> None:
        """The file's bytes over HTTP into `out` (the file at `file`), hashed and synced as
        they come."""
        sink = FileSink(out, file, size)

        def write(piece: memoryview) -> None:
            sink.write(piece)
            bar.update(len(piece))

        try:
            received = await self._t.download(path, size, write)
            await asyncio.to_thread(sink.sync)
        finally:
            sink.close()
        if received != size or sink.hash.hexdigest() != digest:
            raise IntegrityError(f"{path}: received bytes do not match the recorded hash")

    async def _restore_into(
        self, socket: str, path: str, partial: Path, info: FileInfo, bar: Progress
    ) -> bool:
        """Have the server on this machine write the file into `partial` itself, durably
        (it verifies every chunk against its id as it writes: client/local.py); False if
        it predates that. A shown progress bar follows the file's growth meanwhile."""
        size = info.size
        growth = _Growth(partial, bar) if bar.shown else None
        try:
            answer = await self._t.hand_over(socket, path, partial, restore_size=size)
        except local.Unsupported:
            return False
        finally:
            if growth is not None:
                await growth.stop()
        bar.update(size - (growth.shown if growth is not None else 0))
        await asyncio.to_thread(local.check_restored, path, answer, partial, size, info.hash)
        return True

    async def read_range(
        self, namespace: str, ref: str, name: str, start: int, length: int
    ) -> bytes:
        """`length` bytes of a file from `start` (fewer at the end of the file)."""
        return await fetch_range(self._t, file_path(namespace, ref, name), start, length)

    def open(self, namespace: str, ref: str, name: str) -> OpeningFile:
        """A seekable, read-only file that fetches byte ranges on demand, all from the one
        checkpoint `ref` names now: `async with vault.open(...) as f` or `await`."""
        return OpeningFile(self._open(namespace, ref, name))

    async def _open(self, namespace: str, ref: str, name: str) -> AsyncRemoteFile:
        return AsyncRemoteFile(await self._range_reader(namespace, ref, name), name)

    async def _range_reader(self, namespace: str, ref: str, name: str) -> RangeReader:
        ckpt = await self.get(namespace, ref)  # pin the id: every range comes from one checkpoint
        if name not in ckpt.files:
            raise NotFound(f"checkpoint {ckpt.id} has no file {name!r}")
        path = file_path(namespace, ckpt.id, name)
        return RangeReader(self._t, path, ckpt.files[name].size)

    # -- catalog ----------------------------------------------------------------------
    async def get(
        self, namespace: str, ref: str = "latest", *, durable: bool = False
    ) -> Checkpoint:
        """A checkpoint by id, `latest` or `latest-valid`; `durable`: the newest whose
        bytes are all in the shared tier (a commit of parts adopted by its owner)."""
        path = f"/v1/namespaces/{ns_path(namespace)}/checkpoints/{ref}"
        params = {"durable": "true"} if durable else None
        rec = await self._t.json("GET", path, params=params)
        return Checkpoint.from_wire(rec)

    async def namespaces(self) -> list[NamespaceEntry]:
        """Every namespace: its checkpoint count, newest id, logical bytes and chunking."""
        out = await self._t.json("GET", "/v1/namespaces")
        return [NamespaceEntry.from_wire(n) for n in out["namespaces"]]

    async def lineage(self, namespace: str, ref: str = "latest") -> list[Checkpoint]:
        out = await self._t.json(
            "GET", f"/v1/namespaces/{ns_path(namespace)}/checkpoints/{ref}/lineage"
        )
        return [Checkpoint.from_wire(r) for r in out["chain"]]

    async def manifest(self, namespace: str, ref: str) -> Manifest:
        """Every file of a checkpoint with its chunks in order (for parallel range reads)."""
        path = f"/v1/namespaces/{ns_path(namespace)}/checkpoints/{ref}/manifest"
        return Manifest.from_wire(await self._t.json("GET", path))

    async def storage(self, namespace: str, ref: str = "latest") -> Usage:
        """How a checkpoint is stored: stored vs logical bytes, by codec and by tier."""
        path = f"/v1/namespaces/{ns_path(namespace)}/checkpoints/{ref}/storage"
        return Usage.from_wire(await self._t.json("GET", path))

    async def stats(self, namespaces: bool = False) -> StatsReport:
        """Storage totals; `namespaces=True` adds each namespace's stored and logical bytes."""
        params = {"namespaces": "true"} if namespaces else None
        return StatsReport.from_wire(await self._t.json("GET", "/v1/stats", params=params))

    async def _patch(self, namespace: str, checkpoint_id: str, body: dict[str, Any]) -> Checkpoint:
        rec = await self._t.json(
            "PATCH",
            f"/v1/namespaces/{ns_path(namespace)}/checkpoints/{checkpoint_id}",
            json_body=body,
        )
        return Checkpoint.from_wire(rec)

    async def mark_valid(
        self, namespace: str, checkpoint_id: str, reason: str | None = None
    ) -> Checkpoint:
        return await self._patch(
            namespace, checkpoint_id, {"validity": {"state": "valid", "reason": reason}}
        )

    async def mark_invalid(
        self, namespace: str, checkpoint_id: str, reason: str | None = None
    ) -> Checkpoint:
        return await self._patch(
            namespace, checkpoint_id, {"validity": {"state": "invalid", "reason": reason}}
        )

    async def pin(self, namespace: str, checkpoint_id: str, pinned: bool = True) -> Checkpoint:
        return await self._patch(namespace, checkpoint_id, {"pinned": pinned})

    async def tag(self, namespace: str, checkpoint_id: str, tags: list[str]) -> Checkpoint:
        return await self._patch(namespace, checkpoint_id, {"tags": tags})

    async def delete(self, namespace: str, checkpoint_id: str) -> None:
        await self._t.request(
            "DELETE", f"/v1/namespaces/{ns_path(namespace)}/checkpoints/{checkpoint_id}"
        )

    async def delete_many(
        self, namespace: str, checkpoint_ids: Sequence[str] | None = None
    ) -> BulkDeleted:
        """Delete these checkpoints (None: every one of the namespace) in one request;
        pinned ones stay (listed in `pinned`), ids already gone are in `not_found`."""
        body: dict[str, Any] = (
            {"all": True} if checkpoint_ids is None else {"ids": list(checkpoint_ids)}
        )
        out = await self._t.json(
            "DELETE", f"/v1/namespaces/{ns_path(namespace)}/checkpoints", json_body=body
        )
        return BulkDeleted.from_wire(out)

    async def fork(
        self,
        namespace: str,
        ref: str,
        target: str,
        metadata: dict[str, Any] | None = None,
        tags: list[str] | None = None,
    ) -> Checkpoint:
        rec = await self._t.json(
            "POST",
            f"/v1/namespaces/{ns_path(namespace)}/checkpoints/{ref}/fork",
            json_body={"namespace": target, "metadata": metadata or {}, "tags": tags or []},
        )
        return Checkpoint.from_wire(rec)

    # -- administration ---------------------------------------------------------------
    async def health(self) -> Health:
        """Liveness, version and role (no token needed); a standby's lag."""
        return Health.from_wire(await self._t.json("GET", "/v1/health"))

    async def create_token(
        self, name: str, scopes: list[str], expires: str | None = None
    ) -> TokenIssued:
        """A new token (admin); `expires` a duration like "30d" (None: never)."""
        body: dict[str, Any] = {"name": name, "scopes": scopes}
        if expires is not None:
            body["expires"] = expires
        return TokenIssued.from_wire(await self._t.json("POST", "/v1/admin/tokens", json_body=body))

    async def rotate_token(self, name: str, grace: str = "1h") -> TokenIssued:
        """A new secret for `name` (admin); the old one works for `grace` more."""
        path = f"/v1/admin/tokens/{quote(name)}/rotate"
        return TokenIssued.from_wire(await self._t.json("POST", path, json_body={"grace": grace}))

    async def tokens(self) -> list[TokenRecord]:
        """Every token (admin), never a secret; one entry per secret while rotating."""
        out = await self._t.json("GET", "/v1/admin/tokens")
        return [TokenRecord.from_wire(t) for t in out["tokens"]]

    async def revoke_token(self, name: str) -> None:
        await self._t.request("DELETE", f"/v1/admin/tokens/{quote(name)}")

    async def audit(self, limit: int = 100) -> list[AuditEntry]:
        """The newest audit log entries (admin): who changed what, when, request id."""
        out = await self._t.json("GET", "/v1/admin/audit", params={"limit": str(int(limit))})
        return [AuditEntry.from_wire(e) for e in out["entries"]]

    async def gc(self, dry_run: bool = False) -> GcReport:
        """Collect expired uploads and unreferenced chunks (admin); with tiers, repack."""
        params = {"dry_run": str(dry_run).lower()}
        return GcReport.from_wire(await self._t.json("POST", "/v1/admin/gc", params=params))

    async def policy(self, namespace: str | None = None) -> PolicyRecord:
        """A namespace's policy, or the default one."""
        path = f"/v1/namespaces/{ns_path(namespace)}/policy" if namespace else "/v1/policy/default"
        return PolicyRecord.from_wire(await self._t.json("GET", path))

    async def set_policy(self, namespace: str | None, changes: dict[str, Any]) -> PolicyRecord:
        """Change some keys of a policy ({"retention": {...}, "tiering": {...}})."""
        path = f"/v1/namespaces/{ns_path(namespace)}/policy" if namespace else "/v1/policy/default"
        return PolicyRecord.from_wire(await self._t.json("PUT", path, json_body=changes))

    async def retention(
        self, dry_run: bool = True, namespace: str | None = None
    ) -> RetentionReport:
        """Plan retention (admin) or, not a dry run, apply exactly that plan."""
        params = {"dry_run": str(dry_run).lower()}
        if namespace:
            params["namespace"] = namespace
        out = await self._t.json("POST", "/v1/admin/retention", params=params)
        return RetentionReport.from_wire(out)

    async def verify(self, namespace: str | None = None, sample: float = 1.0) -> VerifyReport:
        """Re-read chunks (a `sample` fraction) and check them against their ids (admin)."""
        params = {"sample": str(sample)}
        if namespace:
            params["namespace"] = namespace
        return VerifyReport.from_wire(await self._t.json("POST", "/v1/admin/verify", params=params))

    async def compact(self, namespace: str | None = None, rate: str | None = None) -> CompactReport:
        """Re-encode older checkpoints into deltas and byte-grouped frames; returns when
        done. `rate`: most bytes read per second, e.g. "50MiB" (default: unpaced)."""
        params = {}
        if namespace:
            params["namespace"] = namespace
        if rate:
            params["rate"] = rate
        return CompactReport.from_wire(
            await self._t.json("POST", "/v1/admin/compact", params=params)
        )

    async def tiering(self, dry_run: bool = True) -> TieringReport:
        """Plan (dry run) or run demotion of old checkpoints' chunks to the tiers (admin)."""
        params = {"dry_run": str(dry_run).lower()}
        return TieringReport.from_wire(
            await self._t.json("POST", "/v1/admin/tiering", params=params)
        )

    async def catalog_backup(self, to: str | None = None) -> CatalogBackup:
        """A consistent copy of the catalog (admin), to tier `to` or a file name in the
        server's backup_dir (None: the last tier)."""
        params = {"to": to} if to else None
        out = await self._t.json("POST", "/v1/admin/catalog/backup", params=params)
        return CatalogBackup.from_wire(out)

    async def promote(self) -> Promotion:
        """Turn the standby this client talks to into the primary (admin): it applies all
        the replica has, fences the old primary, replicates and takes writes."""
        return Promotion.from_wire(await self._t.json("POST", "/v1/admin/promote"))

    async def check(self, repair: bool = False) -> CheckReport:
        """Recompute reference counts from the manifests (admin); `repair` fixes them."""
        params = {"repair": str(repair).lower()}
        return CheckReport.from_wire(await self._t.json("POST", "/v1/admin/check", params=params))

    # Named like the builtin, so it comes last: annotations above must see the builtin.
    async def list(
        self,
        namespace: str,
        *,
        limit: int = 100,
        before: str | None = None,
        tag: str | None = None,
        validity: str | None = None,
        durable: bool = False,
    ) -> list[Checkpoint]:
        """Newest first; pass the last id as `before` for the next page. `durable`: only
        checkpoints durable already (not a commit of parts still being adopted)."""
        params = _list_params(limit, before, tag, validity, durable)
        out = await self._t.json("GET", _checkpoints_path(namespace), params=params)
        return [Checkpoint.from_wire(r) for r in out["checkpoints"]]

    def _list_here(
        self,
        namespace: str,
        limit: int,
        before: str | None,
        tag: str | None,
        validity: str | None,
        durable: bool = False,
    ) -> builtins.list[Checkpoint]:
        """`list` on the caller's thread, which it blocks (`VaultClient.list`): one small
        request, as `_save_small_here` sends a save, with no hop to the loop and back."""
        params = _list_params(limit, before, tag, validity, durable)
        out = self._t.json_here("GET", _checkpoints_path(namespace), params=params)
        return [Checkpoint.from_wire(r) for r in out["checkpoints"]]

    async def _list_wire(
        self, namespace: str, limit: int, before: str | None, tag: str | None
    ) -> builtins.list[dict[str, Any]]:
        """`list`'s records as the server's JSON, for a caller that makes `Checkpoint`s
        only of those it uses (LangGraph's get_tuple uses one record of the four it lists,
        and making one costs ~15 us)."""
        params = _list_params(limit, before, tag, None, False)
        out = await self._t.json("GET", _checkpoints_path(namespace), params=params)
        return _records_of(out)

    def _list_wire_here(
        self, namespace: str, limit: int, before: str | None, tag: str | None
    ) -> builtins.list[dict[str, Any]]:
        """`_list_wire` on the caller's thread, which it blocks (as `_list_here`)."""
        params = _list_params(limit, before, tag, None, False)
        out = self._t.json_here("GET", _checkpoints_path(namespace), params=params)
        return _records_of(out)


_BUNDLE_HEADERS = {"Content-Type": BUNDLE_TYPE}
_SAVES_HEADERS = {"Content-Type": SAVES_TYPE}


def _listing(files: Mapping[str, CommitFile]) -> dict[str, dict[str, Any]]:
    """`send_file` entries as a commit's files listing on the wire."""
    return {name: f.to_wire() for name, f in files.items()}


def _checkpoints_path(namespace: str) -> str:
    return f"/v1/namespaces/{ns_path(namespace)}/checkpoints"


def _records_of(listing: Any) -> builtins.list[dict[str, Any]]:
    """A listing's records, each a JSON object (ValueError otherwise, as `from_wire`)."""
    records = listing.get("checkpoints") if isinstance(listing, dict) else None
    if not isinstance(records, builtins.list) or not all(isinstance(r, dict) for r in records):
        raise ValueError("a listing's answer holds no list of records")
    return records


def _list_params(
    limit: int, before: str | None, tag: str | None, validity: str | None, durable: bool
) -> dict[str, str]:
    params = {"limit": str(limit)}
    for key, value in (("before", before), ("tag", tag), ("validity", validity)):
        if value is not None:
            params[key] = value
    if durable:
        params["durable"] = "true"
    return params


def _bundle(namespace: str, files: list[tuple[str, bytes]], opts: SaveOptions) -> bytes:
    """The body of a one-request save, with a fresh idempotency key (so a retry of this
    body returns the checkpoint its first try made) and its namespace (for `/v1/saves`,
    where it travels with others)."""
    return b"".join(_bundle_parts(namespace, files, opts))


def _bundle_parts(namespace: str, files: list[tuple[str, bytes]], opts: SaveOptions) -> list[bytes]:
    """`_bundle` as parts, the files' bytes not copied (sent by one gathered write)."""
    header = opts.wire()
    if header["parent"] is None:
        del header["parent"]  # absent is none; a header with no null is written faster
    header["namespace"] = namespace
    header["key"] = secrets.token_urlsafe(24)
    return bundle_parts(header, files, fastjson.dumps)


async def _create(path: Path) -> IO[bytes]:
    """`open(path, "wb")` on a thread. If the caller is cancelled meanwhile (a load whose
    other file failed), the file the thread still opens is closed and removed, not leaked."""
    opening = asyncio.ensure_future(asyncio.to_thread(_open_for_writing, path))
    try:
        return await asyncio.shield(opening)
    except asyncio.CancelledError:
        # An open is quick: wait for it, so the file is gone before the caller learns of
        # the cancellation (only a second cancellation leaves it to a callback).
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait([opening])
        if opening.done():
            _discard(opening, path)
        else:
            opening.add_done_callback(lambda opened: _discard(opened, path))
        raise


def _open_for_writing(path: Path) -> IO[bytes]:
    return open(path, "wb")  # noqa: SIM115 - the caller closes it


def _discard(opened: asyncio.Future[IO[bytes]], path: Path) -> None:
    if not opened.cancelled() and opened.exception() is None:
        opened.result().close()
    path.unlink(missing_ok=True)


GROWTH_POLL = 0.25  # seconds between looks at a file the server is restoring into


class _Growth:
    """Moves a progress bar as a file the server restores into grows (it writes in order)."""

    def __init__(self, path: Path, bar: Progress) -> None:
        self.shown = 0
        self._task = asyncio.ensure_future(self._follow(path, bar))

    async def _follow(self, path: Path, bar: Progress) -> None:
        while True:
            await asyncio.sleep(GROWTH_POLL)
            with contextlib.suppress(OSError):
                now = (await asyncio.to_thread(os.stat, path)).st_size
                if now > self.shown:
                    bar.update(now - self.shown)
                    self.shown = now

    async def stop(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


async def _all(jobs: list[Coroutine[Any, Any, T]]) -> list[T]:
    """Run `jobs` together, their results in order; the first failure cancels the others
    (each cleans up after itself) and is raised once they have all ended (`gather` alone
    would leave them running, on a loop that may close before they end)."""
    tasks = [asyncio.ensure_future(job) for job in jobs]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _cut(
    reader: Reader, chunker: StreamChunker
) -> tuple[list[tuple[bytes, memoryview]], bool, int]:
    """Read the next piece, cut it, hash it: (chunks with ids, last piece?, bytes read).
    Runs on a worker thread; pieces are taken in order, one at a time."""
    parts = [reader.read(PIECE)]
    got = len(parts[0])
    while 0 < got < PIECE:  # pipes and raw files may return less before the end
        more = reader.read(PIECE - got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    piece = parts[0] if len(parts) == 1 else b"".join(parts)
    final = len(piece) < PIECE
    chunks = chunker.feed(piece, final)
    return list(zip(chunk_ids(chunks), chunks, strict=True)), final, len(piece)


def _batches(
    chunks: list[tuple[bytes, memoryview | None]], limit: int
) -> list[list[tuple[bytes, memoryview | None]]]:
    """Runs of about `limit` bytes carried (references count for nothing)."""
    out: list[list[tuple[bytes, memoryview | None]]] = [[]]
    size = 0
    for cid, data in chunks:
        if size >= limit:
            out.append([])
            size = 0
        out[-1].append((cid, data))
        size += 0 if data is None else len(data)
    return [b for b in out if b]


class _Sender:
    """Sends one upload's files: chunk, ask what is missing, send only that."""

    def __init__(
        self, t: Transport, upload_id: str, profile: dict[str, Any], bar: Progress
    ) -> None:
        self._t = t
        self.upload_id = upload_id
        self._profile = profile
        self._bar = bar
        self._known: set[bytes] = set()  # ids the vault has (or we sent) in this upload
        self._novel_streak = 0  # consecutive pieces in which every chunk was missing
        # Pieces decide what to send in file order (a piece's query, then the next one's),
        # so a batch's place in the file, and the references held for it, follow the file.
        self._deciding = asyncio.Lock()
        self._held: list[bytes] = []  # this file's pieces with nothing new, not yet placed
        self._held_at: tuple[str, int] | None = None  # where the held ones start
        self._held_bytes = 0
        self._placing = True  # False once this file's place was given up
        self._placed_any = False  # a batch of this file went with its place

    async def send(
        self,
        source: Source,
        force: set[str] | None = None,
        cuts: Sequence[int] = (),
        regions: Sequence[tuple[int, int]] | None = None,
    ) -> dict[str, Any]:
        """Stream one file; return its commit listing. `force`: hex ids to send anyway;
        `cuts`: offsets where a chunk must end; `regions`: the file's tensors (None: read
        them from the file if it is one)."""
        profile = ChunkingProfile.from_wire(self._profile)
        if regions is None:
            regions = tensor_layout(source, profile.tensor_pieces) if profile.tensor_pieces else []
        chunker = StreamChunker(profile, cuts=cuts, regions=regions)
        self._held, self._held_at, self._held_bytes = [], None, 0
        self._placing, self._placed_any = force is None, False
        ids: list[bytes] = []
        size = 0
        cut = 0  # bytes in the chunks cut so far: where the next piece's chunks start
        reader = source.open()
        sending: list[asyncio.Future[None]] = []
        cutting: asyncio.Future[Any] | None = None
        try:
            cutting = asyncio.ensure_future(asyncio.to_thread(_cut, reader, chunker))
            while True:
                chunks, final, nbytes = await cutting
                size += nbytes
                if not final:  # read and cut the next piece while this one is sent
                    cutting = asyncio.ensure_future(asyncio.to_thread(_cut, reader, chunker))
                ids.extend(cid for cid, _ in chunks)
                at = (source.name, cut)
                cut += sum(len(data) for _, data in chunks)
                # Several pieces in flight: the server stores piece k while k+1 travels.
                sent = self._send_chunks(chunks, force, nbytes, at)
                sending.append(asyncio.ensure_future(sent))
                if len(sending) >= PIECES_IN_FLIGHT:
                    await sending.pop(0)
                if final:
                    break
            for task in sending:
                await task
            if self._held and self._placed_any:
                # The file ends with pieces the vault had: their references complete the
                # running hash, or the commit would read the whole file back.
                await self._post_all(*self._take_held())
        finally:
            for task in sending:
                task.cancel()
            if cutting is not None and not cutting.done():
                # Let the worker thread finish its read before the file is closed.
                await asyncio.gather(cutting, return_exceptions=True)
            reader.close()
        # No whole-file hash: the server verifies every chunk against its id and computes
        # the file's BLAKE3 at commit (a second pass over the file here cost ~0.5 s of CPU
        # per GB on the cores the save shares with the server).
        return {"size": size, "chunks": [c.hex() for c in ids]}

    async def _send_chunks(
        self,
        chunks: list[tuple[bytes, memoryview]],
        force: set[str] | None,
        nbytes: int,
        at: tuple[str, int],
    ) -> None:
        """`at`: (file name, offset of the first chunk) of this piece."""
        async with self._deciding:
            fresh: dict[bytes, memoryview] = {}
            for cid, data in chunks:
                if cid not in self._known or (force and cid.hex() in force):
                    fresh.setdefault(cid, data)
            self._known.update(fresh)
            todo = await self._missing(fresh, force) if fresh else []
            batch, place = self._place(chunks, todo, at)
        if batch:
            await self._post_all(batch, place)
        self._bar.update(nbytes)

    def _place(
        self,
        chunks: list[tuple[bytes, memoryview]],
        todo: list[tuple[bytes, memoryview]],
        at: tuple[str, int],
    ) -> tuple[list[tuple[bytes, memoryview | None]], tuple[str, int] | None]:
        """What to send of a piece, and where it lies. With its place, the server hashes
        the file as it arrives and the commit need not read it back (vault/filehash.py):
        the piece goes whole, what the vault lacks with its bytes (once) and the rest as
        references, after the references of earlier pieces with nothing new. Those are
        held rather than sent, so a file with nothing new costs no batch at all (its
        commit finds it identical to the parent's); a file that sent something sends the
        references still held at its end on their own (`send`)."""
        if not self._placing:
            return list(todo), None
        if not todo:
            self._held_at = self._held_at or at
            self._held.extend(cid for cid, _ in chunks)
            self._held_bytes += sum(len(data) for _, data in chunks)
            if self._held_bytes <= MAX_HELD_BYTES:
                return [], None
            if not self._placed_any:  # maybe a file with nothing new: no batch for it
                self._held, self._placing = [], False
                return [], None
            return self._take_held()
        lacking: dict[bytes, memoryview | None] = dict(todo)
        batch, held_at = self._take_held()
        batch.extend((cid, lacking.pop(cid, None)) for cid, _ in chunks)
        self._placed_any = True
        return batch, held_at or at

    def _take_held(self) -> tuple[list[tuple[bytes, memoryview | None]], tuple[str, int] | None]:
        """The held references and where they start; none are held after."""
        held: list[tuple[bytes, memoryview | None]] = [(cid, None) for cid in self._held]
        place = self._held_at
        self._held, self._held_at, self._held_bytes = [], None, 0
        return held, place

    async def _missing(
        self, fresh: dict[bytes, memoryview], force: set[str] | None
    ) -> list[tuple[bytes, memoryview]]:
        """What of `fresh` the vault lacks (and `force` names), in order."""
        if self._novel_streak >= NOVEL_STREAK:
            # The last pieces were all new (a fresh file): asking would only add a round trip
            # per piece; the server keeps what it already has and stores the rest.
            return list(fresh.items())
        ask = [c.hex() for c in fresh]
        missing: set[str] = set()
        for i in range(0, len(ask), MAX_IDS_PER_QUERY):
            out = await self._t.json(
                "POST",
                f"/v1/uploads/{self.upload_id}/missing",
                json_body={"chunks": ask[i : i + MAX_IDS_PER_QUERY]},
            )
            missing.update(out["missing"])
        if force:
            missing |= force & set(ask)
        self._novel_streak = self._novel_streak + 1 if len(missing) == len(ask) else 0
        return [(c, d) for c, d in fresh.items() if c.hex() in missing]

    async def _post_all(
        self, todo: list[tuple[bytes, memoryview | None]], at: tuple[str, int] | None
    ) -> None:
        """Send `todo`: a placed piece (`at`: where it lies in its file, references
        included) in one batch, however far the chunker's tail carried from the previous
        piece takes it past BATCH_BYTES (under one chunk); anything else in batches."""
        batches = [todo] if at is not None else _batches(todo, BATCH_BYTES)
        await _all([self._post(b, at) for b in batches])

    async def _post(
        self, batch: list[tuple[bytes, memoryview | None]], at: tuple[str, int] | None
    ) -> None:
        params = None if at is None else {"file": at[0], "offset": str(at[1])}
        await self._t.request(
            "POST",
            f"/v1/uploads/{self.upload_id}/chunks",
            data=encode_chunk_batch(batch),
            headers={"Content-Type": CHUNK_BATCH_TYPE},
            params=params,
        )
