"""Where the large tensors lie in a `torch.save` archive or a safetensors file.

Content-defined chunking finds shared bytes, but a tensor whose every float changed a little
shares none with its previous version, and its CDC boundaries land somewhere else each
time. Cut instead at the tensor's first byte and in fixed pieces from there, and piece k of
a tensor is a chunk of the same length at the same offset in every version of the file: the
server can then store an old piece as a small delta against the new one (vault/compact.py),
and an unchanged tensor still dedups piece for piece, in any file that holds it at a
piece-aligned start (safetensors and torch.save both align tensor data).

Detected by content, never by name: a zip archive (torch.save's format: every tensor is a
stored member, its size in the central directory) or a safetensors file (an 8-byte header
length, then a JSON header of offsets). Anything else, or anything that fails to parse, has
no regions and is chunked with FastCDC as before. Reading the layout needs a seekable file;
streams are chunked with FastCDC throughout.
"""

from __future__ import annotations

import json
import struct
import zipfile
from typing import IO

Region = tuple[int, int]  # [start, end) of one tensor's bytes in the file

_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature ... name length, extra length
_ZIP_MAGIC = b"PK\x03\x04"
_MAX_SAFETENSORS_HEADER = 100 << 20  # the format's own limit


def tensor_regions(f: IO[bytes], size: int, min_region: int) -> list[Region]:
    """The byte ranges of tensors of at least `min_region` bytes, sorted, not overlapping;
    [] for a file of another format. Leaves `f` positioned at 0."""
    try:
        f.seek(0)
        head = f.read(9)
        if head[:4] == _ZIP_MAGIC:
            regions = _zip_regions(f, min_region)
        elif len(head) == 9 and head[8:9] == b"{":
            regions = _safetensors_regions(f, size, int.from_bytes(head[:8], "little"), min_region)
        else:
            regions = []
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile, struct.error):
        regions = []  # not the format it looked like: plain CDC is always correct
    f.seek(0)
    return _sane(regions, size)


def _zip_regions(f: IO[bytes], min_region: int) -> list[Region]:
    out: list[Region] = []
    with zipfile.ZipFile(f) as archive:
        for info in archive.infolist():
            if info.compress_type != zipfile.ZIP_STORED or info.file_size < min_region:
                continue
            f.seek(info.header_offset)
            magic, name_len, extra_len = _LOCAL_HEADER.unpack(f.read(_LOCAL_HEADER.size))
            if magic != _ZIP_MAGIC:
                return []
            start = info.header_offset + _LOCAL_HEADER.size + name_len + extra_len
            out.append((start, start + info.file_size))
    return out


def _safetensors_regions(f: IO[bytes], size: int, header_len: int, min_region: int) -> list[Region]:
    if header_len > min(_MAX_SAFETENSORS_HEADER, size - 8):
        return []
    f.seek(8)
    header = json.loads(f.read(header_len))
    base = 8 + header_len
    out: list[Region] = []
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        begin, end = (int(x) for x in spec["data_offsets"])
        if end - begin >= min_region:
            out.append((base + begin, base + end))
    return out


def _sane(regions: list[Region], size: int) -> list[Region]:
    """Sorted, inside the file, not overlapping: anything else is not a layout to trust."""
    regions.sort()
    end = 0
    for start, stop in regions:
        if start < end or stop > size or stop <= start:
            return []
        end = stop
    return regions
