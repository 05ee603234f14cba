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

# Cc
_CONTROLS = "\x00-\x1f\x7f-\x9f"
# Cf less the two joiners, then Zl and Zp (U+2028, U+2029, inside 2028-202E)
_FORMAT = (
    "\xad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u180e\u200b\u200e-\u200f"
    "\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd"
    "\U00013430-\U00013438\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001"
    "\U000e0020-\U000e007f"
)
# Cs, then Co
_PRIVATE = "\ud800-\udfff\ue000-\uf8ff\U000f0000-\U000ffffd\U00100000-\U0010fffd"

UNPRINTABLE = re.compile(f"[{_CONTROLS}{_FORMAT}{_PRIVATE}]")  # refused in tags
NOT_IN_NAMES = re.compile(f"[{_CONTROLS}{_FORMAT}]")  # refused in file names
# A tag as a JSON Schema pattern (api/openapi.py): the same characters, as a class.
TAG_PATTERN = f"^[^{_CONTROLS}{_FORMAT}{_PRIVATE}]+$"
FILE_NAME_CHARACTERS = f"[^{_CONTROLS}{_FORMAT}]"
