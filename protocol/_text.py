"""Characters that change what a terminal or a log line shows rather than being shown.

Control characters (C0, DEL, C1: ESC, CR, LF, CSI ...) and the bidirectional overrides
that reorder a line. The server refuses them where a person reads a value back as text (a
checkpoint's tags); the CLI escapes them in whatever it prints (older data, metadata).
"""

from __future__ import annotations

import re

UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
