"""The wire contract of Checkpoint Vault, owned by the client and imported by the server.

Everything both sides must agree on lives here, written once: the JSON records
(`_records`) and the admin answers (`_admin`, converted by `_wire`), the error table
(`_errors`), the binary bodies (`_bodies`), the duration and size grammar (`_units`),
FastCDC chunking (`_chunking`), where tensors lie in a file (`_layout`) and the service
defaults (`_defaults`). Standard library only, except pyfastcdc in `_chunking`, so the
client can ship it without server dependencies; `vault/` and `api/` may import nothing
else of `client` (tests/test_boundaries.py).
"""

from ._admin import (
    CheckReport,
    CompactReport,
    Drift,
    GcReport,
    KeepBestRule,
    PolicyRecord,
    RetentionPlan,
    RetentionReport,
    RetentionRules,
    VerifyReport,
)
from ._bodies import (
    BUNDLE_HEAD,
    BUNDLE_MAGIC,
    BUNDLE_TYPE,
    CHUNK_BATCH_TYPE,
    CHUNK_RECORD_HEAD,
    CHUNK_REFERENCE,
    CONTINUE,
    DESCRIPTOR_TYPE,
    decode_bundle,
    decode_chunk_batch,
    encode_bundle,
    encode_chunk_batch,
)
from ._chunking import ChunkingProfile, StreamChunker
from ._defaults import (
    ADMIN_TOKEN_FILE,
    API_PREFIX,
    DEFAULT_DATA_DIR,
    DEFAULT_PORT,
    DEFAULT_URL,
    LOCAL_SOCKET_FILE,
)
from ._errors import ERROR_CODES, ERROR_SPECS, ERRORS, ErrorSpec, status_of
from ._layout import tensor_regions
from ._records import (
    JSON,
    VALIDITY_STATES,
    BulkDeleted,
    CheckpointRecord,
    ChunkSpan,
    CommitFile,
    ErrorBody,
    FileInfo,
    FileStored,
    JSONObject,
    LineageEntry,
    Manifest,
    ManifestFile,
    NamespaceEntry,
    TombstoneRecord,
    UploadOpened,
    Validity,
    lineage_entry_from_wire,
)
from ._units import format_duration, parse_duration, parse_size

__all__ = [
    "CheckReport",
    "CompactReport",
    "Drift",
    "GcReport",
    "KeepBestRule",
    "PolicyRecord",
    "RetentionRules",
    "RetentionPlan",
    "RetentionReport",
    "VerifyReport",
    "tensor_regions",
    "ADMIN_TOKEN_FILE",
    "LOCAL_SOCKET_FILE",
    "API_PREFIX",
    "BUNDLE_HEAD",
    "BUNDLE_MAGIC",
    "BUNDLE_TYPE",
    "DESCRIPTOR_TYPE",
    "CONTINUE",
    "CHUNK_BATCH_TYPE",
    "CHUNK_RECORD_HEAD",
    "CHUNK_REFERENCE",
    "DEFAULT_DATA_DIR",
    "DEFAULT_PORT",
    "DEFAULT_URL",
    "ERRORS",
    "ERROR_CODES",
    "ERROR_SPECS",
    "JSON",
    "VALIDITY_STATES",
    "CheckpointRecord",
    "ChunkSpan",
    "ChunkingProfile",
    "CommitFile",
    "ErrorBody",
    "BulkDeleted",
    "ErrorSpec",
    "FileInfo",
    "FileStored",
    "JSONObject",
    "LineageEntry",
    "Manifest",
    "ManifestFile",
    "NamespaceEntry",
    "StreamChunker",
    "TombstoneRecord",
    "UploadOpened",
    "Validity",
    "decode_bundle",
    "decode_chunk_batch",
    "encode_bundle",
    "encode_chunk_batch",
    "lineage_entry_from_wire",
    "format_duration",
    "parse_duration",
    "parse_size",
    "status_of",
]
