"""The duration and size grammar of settings files and namespace policies.

One grammar for both, so an operator writes `36h` or `40GiB` the same way in the server's
TOML and in a policy PUT. Durations: a non-negative number of seconds, or a number (decimals
allowed) with an optional unit `ms`, `s`, `m`, `h`, `d`, `w`; a bare number is seconds.
Sizes: a non-negative integer of bytes, or an integer with an optional unit `B`, `KiB`,
`MiB`, `GiB`, `TiB` (powers of 1024). Space between the number and the unit is allowed.
Errors are `ValueError`; callers re-raise them as their own kind naming the key.
"""

from __future__ import annotations

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


def parse_duration(value: object) -> float:
    """Seconds from a number or a string like `500ms`, `90s`, `36h`, `7d`, `2w`."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return float(value)
    m = _DURATION.fullmatch(value.strip()) if isinstance(value, str) else None
    if not m:
        raise ValueError(f"not a duration: {value!r} (use e.g. 90s, 36h, 7d)")
    return float(m.group(1)) * DURATION_UNITS[m.group(2)]


def parse_size(value: object) -> int:
    """Bytes from an integer or a string like `4194304`, `512MiB` or `40GiB`."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    m = _SIZE.fullmatch(value.strip()) if isinstance(value, str) else None
    if not m:
        raise ValueError(f"not a size: {value!r} (use e.g. 4194304, 512MiB or 40GiB)")
    return int(m.group(1)) * SIZE_UNITS[m.group(2)]


def format_duration(seconds: float) -> str:
    """The shortest whole-unit form `parse_duration` reads back: `7d`, `36h`, `90s`, `0.5s`."""
    for unit in ("w", "d", "h", "m"):
        size = DURATION_UNITS[unit]
        if seconds and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
