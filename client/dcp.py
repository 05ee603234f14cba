"""torch.distributed.checkpoint storage in the vault: one checkpoint per `dcp.save`.

    import torch.distributed.checkpoint as dcp
    from checkpoint_vault.client.dcp import VaultReader, VaultWriter
    dcp.save(state, storage_writer=VaultWriter(vault, "runs/exp1"))
    dcp.load(state, storage_reader=VaultReader(vault, "runs/exp1"))   # latest-valid

How the steps of a distributed save map onto one upload session: the coordinator opens
the upload in `prepare_global_plan` and hands it to every rank inside its plan; each rank
streams its items as one safetensors file, `__<rank>_0.distcp`, into that same upload
(chunks the vault already holds are not sent) and reports where each item landed plus its
file's commit entry; the coordinator, in `finish`, adds the pickled DCP `Metadata` as
`.metadata` and commits every rank's file at once. Until then nothing is visible; a rank
that fails leaves an uncommitted upload that expires.

Across hosts (`nearby=`, a client of a node on the rank's own host): each rank saves its
file as a *part* on its own node instead (client/parts.py), so no node takes every rank's
bytes; the coordinator saves `.metadata` as a part too and commits every part as one
checkpoint through `client` (the namespace's owner fetches the parts from their nodes).
Until that commit nothing is visible; parts of a save that failed expire on their nodes.

Loading pins one checkpoint id: each rank resolves the ref, and the coordinator refuses
to go on if the ranks saw different checkpoints (a save landed in between).
`.metadata` is a pickle, as in torch's FileSystemReader: load only from a vault you trust.
"""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItem,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from checkpoint_vault.protocol import CommitFile

from .aio import UploadSession
from .errors import ClientError, IntegrityError
from .models import Checkpoint
from .options import SaveFields
from .parts import Part
from .sync import VaultClient
from .torch import _as_file, _read_into, safetensors_layout, tensor_bytes

if TYPE_CHECKING:
    from typing_extensions import Unpack

METADATA_FILE = ".metadata"

__all__ = ["CheckpointMoved", "VaultReader", "VaultWriter"]


class CheckpointMoved(ClientError):
    """The ranks of one `dcp.load` resolved their ref to different checkpoints."""

    code = "checkpoint_moved"


@dataclass(frozen=True)
class _RankTarget:
    """What the coordinator tells each rank: the shared upload and the rank's file."""

    upload: UploadSession
    file: str


@dataclass(frozen=True)
class _PartTarget:
    """Across hosts: each rank saves its file as a part on its own node."""

    file: str


@dataclass(frozen=True)
class _Stored:
    """Where one item's bytes are, as kept in the checkpoint's Metadata.storage_data."""

    file: str
    offset: int
    length: int
    dtype: torch.dtype | None  # None: a bytes item
    shape: tuple[int, ...]


@dataclass(frozen=True)
class _Written:
    """A rank's WriteResult.storage_data: the item's place, and (on one item per file)
    the file's commit entry, which the coordinator needs and the metadata does not."""

    stored: _Stored
    entry: CommitFile | None
    part: Part | None = None  # across hosts: the rank's part (on its file's first item)


def _done(value: Any) -> Future[Any]:
    fut: Future[Any] = Future()
    fut.set_result(value)
    return fut


class VaultWriter(StorageWriter):
    """Saves a DCP checkpoint as one checkpoint of `namespace` (a `checkpoint_id` given to
    `dcp.save` names the namespace instead). After `dcp.save`, the coordinator's
    `writer.checkpoint` is the committed record. `nearby`: a client of the node on this
    rank's host (each rank's own): ranks save there as parts, and the coordinator commits
    them once through `client` (the proxy). `wait_durable` (across hosts): that commit
    answers once every part is in the cluster's shared tier, so the checkpoint is
    `durable` when `dcp.save` returns rather than visible at once and adopted seconds
    later (docs/DESIGN.md, "A checkpoint from many hosts"); a save on one node is
    durable anyway."""

    def __init__(
        self,
        client: VaultClient,
        namespace: str,
        *,
        nearby: VaultClient | None = None,
        part_ttl: float | None = None,
        wait_durable: bool = False,
        **options: Unpack[SaveFields],
    ) -> None:
        super().__init__()
        self.client = client
        self.nearby = nearby
        self.part_ttl = part_ttl  # across hosts: how long a part outlives a failed save
        self.wait_durable = wait_durable
        self.namespace = namespace
        self.options = options
        self.checkpoint: Checkpoint | None = None
        self._upload: UploadSession | None = None

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id:
            self.namespace = os.fspath(checkpoint_id)
        self.checkpoint = None
        self._upload = None

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if not kwargs.get("use_collectives", True):
            raise ValueError(
                "VaultWriter commits every rank's files at once; it needs dcp.save's "
                "collectives (use_collectives=True)"
            )

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """Coordinator: open the upload every rank sends into (across hosts: none, each
        rank makes its own part)."""
        if self.nearby is not None:
            return [
                dataclasses.replace(plan, storage_data=_PartTarget(f"__{rank}_0.distcp"))
                for rank, plan in enumerate(plans)
            ]
        self._upload = self.client.begin_upload(self.namespace, **self.options)
        return [
            dataclasses.replace(plan, storage_data=_RankTarget(self._upload, f"__{rank}_0.distcp"))
            for rank, plan in enumerate(plans)
        ]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Every rank: its items as one safetensors file, streamed into the shared upload,
        a chunk boundary at each item so an unchanged tensor dedups whatever moved."""
        target = plan.storage_data
        if not isinstance(target, (_RankTarget, _PartTarget)):
            raise TypeError("VaultWriter.write_data needs a plan from its prepare_global_plan")
        if not plan.items:
            return _done([])
        data = {_key(item): _as_tensor(planner.resolve_data(item)) for item in plan.items}
        layout = safetensors_layout(data)
        part = None
        if isinstance(target, _PartTarget):
            near = self.nearby or self.client
            upload = near.begin_part(self.namespace, ttl=self.part_ttl)
            entry = near.send_file(upload, target.file, _as_file(layout.reader()), cuts=layout.cuts)
            part = near.commit_part(upload, {target.file: entry})
        else:
            entry = self.client.send_file(
                target.upload, target.file, _as_file(layout.reader()), cuts=layout.cuts
            )
        results = []
        for n, item in enumerate(plan.items):
            offset, length = layout.spans[_key(item)]
            t = layout.tensors[_key(item)]
            tensor_item = item.tensor_data is not None
            stored = _Stored(
                target.file, offset, length, t.dtype if tensor_item else None, tuple(t.shape)
            )
            written = _Written(stored, entry if n == 0 else None, part if n == 0 else None)
            results.append(
                WriteResult(index=item.index, size_in_bytes=length, storage_data=written)
            )
        return _done(results)

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Coordinator: store the metadata next to the ranks' files and commit them all."""
        files: dict[str, CommitFile] = {}
        parts: list[Part] = []
        where: dict[MetadataIndex, _Stored] = {}
        for rank_results in results:
            for result in rank_results:
                written: _Written = result.storage_data
                where[result.index] = written.stored
                if written.entry is not None:
                    files[written.stored.file] = written.entry
                if written.part is not None:
                    parts.append(written.part)
        metadata.storage_data = where
        raw = pickle.dumps(metadata, protocol=pickle.HIGHEST_PROTOCOL)
        if self.nearby is not None:
            meta = self.nearby.save_part(self.namespace, {METADATA_FILE: raw}, ttl=self.part_ttl)
            parts.append(meta)
            self.checkpoint = self.client.commit_parts(
                self.namespace, parts, wait_durable=self.wait_durable, **self.options
            )
            return
        if self._upload is None:
            raise RuntimeError("VaultWriter.finish before prepare_global_plan")
        files[METADATA_FILE] = self.client.send_file(self._upload, METADATA_FILE, raw)
        self.checkpoint = self.client.commit(self._upload, files)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False  # never picked by dcp from a bare path: pass the writer explicitly


class VaultReader(StorageReader):
    """Loads the DCP checkpoint `ref` of `namespace` (a `checkpoint_id` given to
    `dcp.load` is the ref instead: a checkpoint id, `latest` or `latest-valid`)."""

    def __init__(
        self,
        client: VaultClient,
        namespace: str,
        ref: str = "latest-valid",
        *,
        durable: bool = False,
    ) -> None:
        super().__init__()
        self.client = client
        self.namespace = namespace
        self.ref = ref
        self.durable = durable  # `latest`/`latest-valid`: only a checkpoint durable already
        self.checkpoint: Checkpoint | None = None
        self._stored: dict[MetadataIndex, _Stored] = {}

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id:
            self.ref = os.fspath(checkpoint_id)
        self.checkpoint = None
        self._stored = {}

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        self.checkpoint = self.client.get(self.namespace, self.ref, durable=self.durable)
        with self.client.open(self.namespace, self.checkpoint.id, METADATA_FILE) as f:
            metadata = pickle.load(f)  # noqa: S301 - trusted as FileSystemReader trusts its dir
        if not isinstance(metadata, Metadata):
            raise IntegrityError(f"{METADATA_FILE} of {self.checkpoint.id} is not DCP metadata")
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.checkpoint_id = self.checkpoint.id
        return metadata

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        self._stored = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        plan.storage_data = self.checkpoint.id if self.checkpoint else None
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        """Coordinator: every rank must have read the same checkpoint."""
        seen = {plan.storage_data for plan in plans}
        if len(seen) > 1:
            raise CheckpointMoved(
                f"ranks resolved {self.ref!r} of {self.namespace} to different checkpoints "
                f"{sorted(map(str, seen))}; load by checkpoint id"
            )
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Per file, in file order through one range-reading file object: consecutive
        small items come out of its buffer, large ones in one range request each."""
        if self.checkpoint is None:
            raise RuntimeError("VaultReader.read_data before read_metadata")
        by_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            by_file.setdefault(self._stored[item.storage_index].file, []).append(item)
        for name, items in by_file.items():
            items.sort(key=lambda it: self._stored[it.storage_index].offset)
            with self.client.open(self.namespace, self.checkpoint.id, name) as f:
                for item in items:
                    self._read_item(f, item, planner)
        return _done(None)

    def _read_item(self, f: io.BufferedReader, item: ReadItem, planner: LoadPlanner) -> None:
        stored = self._stored[item.storage_index]
        f.seek(stored.offset)
        if item.type == LoadItemType.BYTE_IO:
            data = f.read(stored.length)
            if len(data) != stored.length:
                raise IntegrityError(f"{stored.file} ended inside an item")
            planner.load_bytes(item, io.BytesIO(data))
            return
        if stored.dtype is None:
            raise IntegrityError(f"{item.storage_index.fqn} was stored as bytes, not a tensor")
        t = torch.empty(stored.shape, dtype=stored.dtype)
        _read_into(f, tensor_bytes(t))
        for dim, (start, length) in enumerate(zip(item.storage_offsets, item.lengths, strict=True)):
            t = t.narrow(dim, start, length)
        target = planner.resolve_tensor(item).detach()
        if target.size() != t.size():
            raise IntegrityError(
                f"{item.storage_index.fqn}: stored {t.size()}, want {target.size()}"
            )
        target.copy_(t)
        planner.commit_tensor(item, target)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False


def _key(item: WriteItem) -> str:
    """The item's name in its rank file: the fqn, plus the shard's offsets unless zero."""
    offset = item.index.offset
    return item.index.fqn if not offset or not any(offset) else f"{item.index.fqn}@{list(offset)}"


def _as_tensor(data: Any) -> torch.Tensor:
    """A write item's bytes as a CPU tensor (tensors: the projection DCP asked for)."""
    if isinstance(data, io.BytesIO):
        raw = data.getbuffer()
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8) if len(raw) else _empty()
    if isinstance(data, torch.Tensor):
        return data.detach().to("cpu").contiguous()
    raise TypeError(f"cannot store a write item of type {type(data).__name__}")


def _empty() -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8)
