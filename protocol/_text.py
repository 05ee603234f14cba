"""Characters that are not shown as themselves: the one rule for text a person reads back.

Controls (Cc: C0, DEL, C1: ESC, CR, LF, CSI ...), format characters (Cf: the bidirectional
overrides that reorder a line, zero-width spaces, the BOM, soft hyphens), the line and
paragraph separators (Zl, Zp), private-use characters (Co, shown as whatever a font puts
there) and surrogates (Cs, not characters at all). A tag holding one reads as another tag or
breaks the line it is printed on, so the server refuses them in tags; file names, which are
paths on a user's disk, may not hold controls, format characters or separators (private use
and surrogates stay: the latter carry the bytes of names that are not UTF-8). The CLI
escapes all of them in whatever it prints (older data, metadata).

Spelled out as of Unicode 14.0 (Python 3.11), so that a name valid on one server is valid
on every other; tests/unit/test_text.py checks the table against `unicodedata`. The zero
width (non-)joiners U+200C and U+200D are format characters too, but allowed: Persian,
Indic scripts and emoji sequences are spelled with them, and a joiner fakes a name no better
than a look-alike letter does.
"""

from __future__ import annotations

import re

Ranges = tuple[tuple[int, int], ...]  # inclusive code point ranges

_CONTROLS: Ranges = ((0x00, 0x1F), (0x7F, 0x9F))  # Cc
# Cf less the two joiners, with Zl and Zp (U+2028, U+2029, inside 2028-202E)
_FORMAT: Ranges = (
    (0xAD, 0xAD), (0x600, 0x605), (0x61C, 0x61C), (0x6DD, 0x6DD), (0x70F, 0x70F),
    (0x890, 0x891), (0x8E2, 0x8E2), (0x180E, 0x180E), (0x200B, 0x200B), (0x200E, 0x200F),
    (0x2028, 0x202E), (0x2060, 0x2064), (0x2066, 0x206F), (0xFEFF, 0xFEFF),
    (0xFFF9, 0xFFFB), (0x110BD, 0x110BD), (0x110CD, 0x110CD), (0x13430, 0x13438),
    (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A), (0xE0001, 0xE0001), (0xE0020, 0xE007F),
)  # fmt: skip
_SURROGATES: Ranges = ((0xD800, 0xDFFF),)  # Cs
_PRIVATE: Ranges = ((0xE000, 0xF8FF), (0xF0000, 0xFFFFD), (0x100000, 0x10FFFD))  # Co

HIDDEN_IN_NAMES: Ranges = _CONTROLS + _FORMAT
HIDDEN_IN_TAGS: Ranges = HIDDEN_IN_NAMES + _SURROGATES + _PRIVATE


def character_class(ranges: Ranges, *, schema: bool = False) -> str:
    """The body of a regular expression class holding `ranges`. `schema`: for a JSON Schema
    pattern read by other regex engines too: BMP characters as `\\uXXXX`, others as
    themselves, surrogates left out (no UTF-8 text holds one, and some engines refuse them)."""

    def one(cp: int) -> str:
        return f"\\u{cp:04x}" if schema and cp < 0x10000 else chr(cp)

    parts = []
    for lo, hi in ranges:
        if schema and (lo, hi) in _SURROGATES:
            continue
        parts.append(one(lo) if lo == hi else f"{one(lo)}-{one(hi)}")
    return "".join(parts)


UNPRINTABLE = re.compile(f"[{character_class(HIDDEN_IN_TAGS)}]")  # refused in tags
NOT_IN_NAMES = re.compile(f"[{character_class(HIDDEN_IN_NAMES)}]")  # refused in file names
