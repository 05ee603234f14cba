"""Configuration: file, environment and flags, validated at start with the bad key named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from checkpoint_vault.api.settings import Settings, SettingsError, effective_config, load_settings
from checkpoint_vault.node.serve import cannot_hold_socket


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ckpt.toml"
    path.write_text(text)
    return path


def test_file_then_environment_then_flags(tmp_path: Path) -> None:
    cfg = write(tmp_path, '[server]\nport = 9000\n[gc]\ngrace = "2h"\n[uploads]\nttl = "1d"\n')
    settings = load_settings(
        cfg,
        environ={"CKPT_SERVER_PORT": "9100", "CKPT_URL": "x"},
        overrides={("server", "host"): "0.0.0.0"},
    )
    assert settings.port == 9100
    assert settings.host == "0.0.0.0"
    assert settings.vault.gc_grace == 7200
    assert settings.vault.upload_ttl == 86400
    shown = effective_config(settings)
    assert shown["server"]["port"] == 9100
    assert shown["maintenance"]["scrub_interval"] == 86400


@pytest.mark.parametrize(
    ("text", "env", "named"),
    [
        ("[server]\nprot = 1\n", {}, "[server] prot"),
        ('[gc]\ngrace = "soon"\n', {}, "[gc] grace"),
        ("[server]\nport = 70000\n", {}, "[server] port"),
        ("", {"CKPT_STORAGE_MAP_SIZE": "lots"}, "[storage] map_size"),
        ("", {"CKPT_NOPE_X": "1"}, "[nope] x"),
        ('[log]\nformat = "xml"\n', {}, "[log] format"),
        ("server = 1\n", {}, "not a section"),
        ('[maintenance]\ncompact_rate = "512KiB"\n', {}, "[maintenance] compact_rate"),
        ("", {"CKPT_MAINTENANCE_SCRUB_RATE": "1"}, "[maintenance] scrub_rate"),
    ],
)
def test_bad_settings_name_the_key(
    tmp_path: Path, text: str, env: dict[str, str], named: str
) -> None:
    with pytest.raises(SettingsError, match=named.replace("[", r"\[").replace("]", r"\]")):
        load_settings(write(tmp_path, text), environ=env)


def test_config_show_command(tmp_path: Path) -> None:
    cfg = write(tmp_path, '[storage]\nmax_chunk_size = "8MiB"\n')
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "checkpoint_vault.cli",
            "config",
            "show",
            "--config",
            str(cfg),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["storage"]["max_chunk_size"] == 8 << 20
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "checkpoint_vault.cli",
            "config",
            "show",
            "--config",
            str(write(tmp_path, "[server]\nprot = 1\n")),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2
    assert "[server] prot" in bad.stderr


@pytest.mark.parametrize("spelling", ["replica:cold", "tier:cold", "cold"])
def test_follow_spellings_and_the_shared_poll_interval(tmp_path: Path, spelling: str) -> None:
    text = '[tiers.cold]\nurl = "file:///tmp/x"\n[standby]\npoll_interval = "100ms"\n'
    cfg = write(tmp_path, text)
    assert load_settings(cfg, environ={}).following is None  # a primary may share the file
    settings = load_settings(cfg, environ={}, overrides={("standby", "follow"): spelling})
    assert settings.following is not None
    assert (settings.following.tier, settings.following.poll_interval) == ("cold", 0.1)


def test_a_standby_promotes_into_the_tier_it_follows(tmp_path: Path) -> None:
    text = '[tiers.cold]\nurl = "file:///tmp/x"\n[tiers.warm]\nurl = "file:///tmp/y"\n'
    cfg = write(tmp_path, text + '[replication]\ntier = "warm"\n')
    with pytest.raises(SettingsError, match="differ"):
        load_settings(cfg, environ={}, overrides={("standby", "follow"): "replica:cold"})
    with pytest.raises(SettingsError, match="no such"):
        load_settings(cfg, environ={}, overrides={("standby", "follow"): "replica:gone"})


def test_the_local_socket_lives_in_the_data_dir_unless_it_cannot(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data")
    assert settings.socket_path == (tmp_path / "data").absolute() / "ckpt.sock"
    assert replace(settings, local_socket=False).socket_path is None
    # Plain HTTP beside TLS would be a way around it (and around client certificates).
    assert replace(settings, tls_cert=tmp_path / "cert.pem").socket_path is None
    # A socket address holds 108 bytes: a longer path means no socket, not a failed start.
    assert replace(settings, data_dir=tmp_path / ("d" * 120)).socket_path is None
    env = {"CKPT_SERVER_LOCAL_SOCKET": "false"}
    assert not load_settings(None, environ=env).local_socket


def test_a_directory_that_cannot_hold_a_socket_is_told(tmp_path: Path) -> None:
    """`ckpt serve` probes the data dir under a name of its own before listening there
    (some network file systems refuse sockets): it then serves without one."""
    assert cannot_hold_socket(tmp_path / "data") is None
    assert list((tmp_path / "data").iterdir()) == []  # the probe leaves nothing behind
    (tmp_path / "file").write_text("not a directory")
    assert cannot_hold_socket(tmp_path / "file" / "data") is not None


def test_processes_follow_the_usable_cpus_and_the_exceptions(tmp_path: Path) -> None:
    """`[server] workers` 0 means one process per usable CPU (a cgroup quota counts, as in
    a container), at most MAX_AUTO_WORKERS; a standby, TLS and an explicit count differ."""
    from checkpoint_vault.api.settings import MAX_AUTO_WORKERS, usable_cpus

    quota = tmp_path / "cpu.max"
    quota.write_text("150000 100000\n")  # --cpus 1.5
    assert usable_cpus(quota) == min(2, len(os.sched_getaffinity(0)))
    quota.write_text("max 100000\n")
    assert usable_cpus(quota) == len(os.sched_getaffinity(0))
    settings = Settings(data_dir=tmp_path / "d")
    assert settings.answering == min(usable_cpus(), MAX_AUTO_WORKERS)
    assert settings.processes == (1 if settings.answering == 1 else settings.answering + 1)
    three = Settings(data_dir=tmp_path / "d", workers=3)
    assert (three.answering, three.processes) == (3, 4)  # and one that writes
    one = Settings(data_dir=tmp_path / "d", workers=1)
    assert (one.answering, one.processes) == (1, 1)  # answers and writes
    tls = Settings(
        data_dir=tmp_path / "d", workers=3, tls_cert=tmp_path / "c", tls_key=tmp_path / "k"
    )
    assert tls.processes == 1
    deep = Settings(data_dir=tmp_path / ("x" * 120), workers=3)
    assert deep.processes == 1  # no room for the engine sockets' paths


def test_a_shared_tier_names_a_tier_and_gives_the_writer_its_name(tmp_path: Path) -> None:
    base = (
        '[cluster]\nnode = "{node}"\nurl = "http://n:1"\nshard = 1\nshards = 2\n'
        'store = "file:///tmp/c"\nshared_tier = "{tier}"\n'
        '[tiers.shared]\nurl = "file:///tmp/s"\n'
    )
    settings = load_settings(write(tmp_path, base.format(node="n0", tier="shared")), environ={})
    assert settings.vault.shared_tier == "shared"
    assert settings.vault.shared_writer == "n0-s1"  # object names in the shared tier
    with pytest.raises(SettingsError, match="shared_tier"):
        load_settings(write(tmp_path, base.format(node="n0", tier="nope")), environ={})
    with pytest.raises(SettingsError, match="node"):
        load_settings(write(tmp_path, base.format(node="Node A", tier="shared")), environ={})
