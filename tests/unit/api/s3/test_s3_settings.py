"""The endpoint's settings and policy keys: read once at start, refused when malformed."""

from __future__ import annotations

from pathlib import Path

import pytest

from checkpoint_vault.api.settings import SettingsError, load_settings
from checkpoint_vault.vault.errors import InvalidRequest
from checkpoint_vault.vault.policy import Policy


def test_the_endpoint_is_off_unless_a_port_is_set(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("")
    assert load_settings(cfg, environ={}).s3_port is None
    cfg.write_text('[s3]\nport = 9000\ncommit_after = "5s"\n')
    on = load_settings(cfg, environ={})
    assert (on.s3_port, on.s3_commit_after) == (9000, 5.0)
    assert load_settings(cfg, environ={"CKPT_S3_PORT": "0"}).s3_port is None
    with pytest.raises(SettingsError, match=r"\[s3\] port"):
        load_settings(cfg, environ={"CKPT_S3_PORT": "70000"})
    with pytest.raises(SettingsError, match=r"\[s3\] commit_after"):
        load_settings(cfg, environ={"CKPT_S3_COMMIT_AFTER": "soon"})


def test_policy_s3_keys_merge_and_are_checked() -> None:
    policy = Policy().updated({"s3": {"markers": ["*.ckpt", "_metadata"]}})
    policy = policy.updated({"s3": {"commit_after": "30s"}})
    assert policy.s3 == {"markers": ["*.ckpt", "_metadata"], "commit_after": "30s"}
    assert Policy.from_json(policy.to_json()).s3 == policy.s3
    assert policy.updated({"s3": {"markers": None}}).s3 == {"commit_after": "30s"}
    bads: list[dict[str, object]] = [
        {"s3": {"marker": ["x"]}},
        {"s3": {"markers": "x"}},
        {"s3": {"markers": ["a/b"]}},
        {"s3": {"markers": ["x"] * 33}},
        {"s3": {"commit_after": "soon"}},
        {"s3": []},
    ]
    for bad in bads:
        with pytest.raises(InvalidRequest):
            Policy().updated(bad)
