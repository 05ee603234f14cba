"""The OpenAPI document states the character rules of tags and file names (protocol/_text.py)
and the commit's 413 (issue 41, low)."""

from __future__ import annotations

import re
from pathlib import Path

from checkpoint_vault.api import Settings, create_app
from checkpoint_vault.api.openapi import PATTERNS, build_openapi
from checkpoint_vault.protocol import UNPRINTABLE


def test_the_tag_pattern_is_the_rule() -> None:
    tag = re.compile(PATTERNS["Tag"]["pattern"])
    for text in ("release-1", "étape 3", "模型", "a\u200db", "👩\u200d🔬"):
        assert tag.search(text), text
    for text in ("a\u2028b", "a\u2029b", "zero\u200bwidth", "\ufeffbom", "soft\xadhy", "\ue000"):
        assert not tag.search(text), text
        assert UNPRINTABLE.search(text), text


def test_file_names_refuse_the_bidi_override() -> None:
    name = re.compile(PATTERNS["FileName"]["pattern"])
    assert name.search("dir/état.json")
    for text in ("evil\u202etxt.exe", "a\u2028b", "a\u200bb", "a\x85b"):
        assert not name.search(text), text


def test_requests_use_the_tag_rule_and_commit_documents_413(tmp_path: Path) -> None:
    doc = build_openapi(create_app(Settings(data_dir=tmp_path)))
    opened = doc["paths"]["/v1/namespaces/{ns}/uploads"]["post"]["requestBody"]
    tags = opened["content"]["application/json"]["schema"]["properties"]["tags"]
    assert tags["items"] == {"$ref": "#/components/schemas/Tag"}
    assert "Tag" in doc["components"]["schemas"]
    commit = doc["paths"]["/v1/uploads/{upload_id}/commit"]["post"]["responses"]
    assert "413" in commit
