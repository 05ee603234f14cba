"""protocol/_text.py: the table of characters not shown as themselves is exactly the
Unicode categories it names (Cc, Cf less the two joiners, Zl, Zp; Co and Cs for tags)."""

from __future__ import annotations

import re
import sys
import unicodedata

import pytest

from checkpoint_vault.protocol import NOT_IN_NAMES, UNPRINTABLE

_JOINERS = {0x200C, 0x200D}
_NAMES = {"Cc", "Cf", "Zl", "Zp"}
_TAGS = _NAMES | {"Co", "Cs"}


def _in(categories: set[str]) -> set[int]:
    return {
        cp
        for cp in range(sys.maxunicode + 1)
        if unicodedata.category(chr(cp)) in categories and cp not in _JOINERS
    }


def _matched(pattern: re.Pattern[str], among: set[int]) -> set[int]:
    return {cp for cp in among if pattern.fullmatch(chr(cp))}


@pytest.mark.skipif(unicodedata.unidata_version != "14.0.0", reason="the table is Unicode 14")
def test_the_table_is_the_categories() -> None:
    every = set(range(sys.maxunicode + 1))
    assert _matched(UNPRINTABLE, every) == _in(_TAGS)
    assert _matched(NOT_IN_NAMES, every) == _in(_NAMES)


def test_every_refused_character_is_of_those_categories() -> None:
    """Whatever Python's Unicode version: the table refuses nothing visible."""
    every = set(range(sys.maxunicode + 1))
    assert {unicodedata.category(chr(cp)) for cp in _matched(UNPRINTABLE, every)} <= _TAGS
