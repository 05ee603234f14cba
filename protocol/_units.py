"""The duration and size grammar of settings files and namespace policies.

One grammar for both, so an operator writes `36h` or `40GiB` the same way in the server's
TOML and in a policy PUT. Durations: a non-negative number of seconds, or a number (decimals
allowed) with an optional unit `ms`, `s`, `m`, `h`, `d`, `w`; a bare number is seconds.
Sizes: a non-negative integer of bytes, or an integer with an optional unit `B`, `KiB`,
`MiB`, `GiB`, `TiB` (powers of 1024). Space between the number and the unit is allowed.
Errors are `ValueError`; callers re-raise them as their own kind naming the key.

Both are bounded: a duration of `1e400s` (or 400 digits) used to become infinity, which a
listing then emitted as `Infinity` (not JSON), made a rotated secret never expire and a
`keep_within` that broke retention for every namespace; a 400-digit size overflowed the
float a rate is kept as. So a duration is finite and at most `MAX_DURATION` (100 years),
a size at most `MAX_SIZE` (1 EiB), and either text at most 64 characters.
"""

from __future__ import annotations

import math
import re

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?")
DURATION_UNITS: dict[str | None, float] = {
    None: 1,
    "ms": 0.001,
    "s": 1,
    "m": 60,
    "h": 3600,
    "d": 86400,
    "w": 604800,
}
_SIZE = re.compile(r"(\d+)\s*(B|KiB|MiB|GiB|TiB)?")
SIZE_UNITS: dict[str | None, int] = {
    None: 1,
    "B": 1,
    "KiB": 1 << 10,
    "MiB": 1 << 20,
    "GiB": 1 << 30,
    "TiB": 1 << 40,
}
MAX_DURATION = 100 * 365 * 86400.0  # 100 years: longer than any expiry or retention means
MAX_SIZE = 1 << 60  # 1 EiB: past any disk, quota or rate
_MAX_TEXT = 64  # characters of a duration or size string


def parse_duration(value: object) -> float:
    """Seconds from a number or a string like `500ms`, `90s`, `36h`, `7d`, `2w`."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        seconds = float(value) if not isinstance(value, int) or value <= MAX_DURATION else math.inf
    else:
        text = value.strip() if isinstance(value, str) and len(value) <= _MAX_TEXT else None
        m = _DURATION.fullmatch(text) if text is not None else None
        if not m:
            raise ValueError(f"not a duration: {_short(value)} (use e.g. 90s, 36h, 7d)")
        seconds = float(m.group(1)) * DURATION_UNITS[m.group(2)]
    if not math.isfinite(seconds) or seconds > MAX_DURATION:
        raise ValueError(f"duration {_short(value)} is longer than the limit of 100 years")
    return seconds


def parse_size(value: object) -> int:
    """Bytes from an integer or a string like `4194304`, `512MiB` or `40GiB`."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        size = value
    else:
        text = value.strip() if isinstance(value, str) and len(value) <= _MAX_TEXT else None
        m = _SIZE.fullmatch(text) if text is not None else None
        if not m:
            raise ValueError(f"not a size: {_short(value)} (use e.g. 4194304, 512MiB or 40GiB)")
        size = int(m.group(1)) * SIZE_UNITS[m.group(2)]
    if size > MAX_SIZE:
        raise ValueError(f"size {_short(value)} is larger than the limit of 1 EiB (2**60 bytes)")
    return size


def _short(value: object) -> str:
    """`value` for an error message, cut short: the message is echoed to the caller."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def format_duration(seconds: float) -> str:
    """The shortest whole-unit form `parse_duration` reads back: `7d`, `36h`, `90s`, `0.5s`."""
    for unit in ("w", "d", "h", "m"):
        size = DURATION_UNITS[unit]
        if seconds and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
