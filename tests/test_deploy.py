"""Deploy files are checked with what this machine has; a check whose tool is absent is
skipped and says so."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from .cluster import HAProxy

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"


@pytest.mark.parametrize("path", sorted(p.name for p in DEPLOY.rglob("*.yaml")))
def test_yaml_parses(path: str) -> None:
    docs = list(yaml.safe_load_all(next(DEPLOY.rglob(path)).read_text()))
    assert docs
    assert all(isinstance(d, dict) for d in docs)


def test_k8s_manifests_have_what_an_operator_relies_on() -> None:
    docs = {d["kind"]: d for d in yaml.safe_load_all((DEPLOY / "k8s" / "vault.yaml").read_text())}
    assert {"ConfigMap", "Secret", "Service", "StatefulSet"} <= set(docs)
    pod = docs["StatefulSet"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/v1/health"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v1/health"
    assert "requests" in container["resources"]
    assert docs["StatefulSet"]["spec"]["volumeClaimTemplates"]


def test_example_config_is_valid() -> None:
    from checkpoint_vault.api.settings import load_settings

    settings = load_settings(DEPLOY / "ckpt.example.toml", environ={})
    assert settings.port == 8470


def test_dockerfile_runs_unprivileged_with_a_healthcheck() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    assert "USER ckpt" in text
    assert "HEALTHCHECK" in text
    assert "/v1/health" in text
    assert "VOLUME" in text


def test_compose_config_when_docker_is_present() -> None:
    if shutil.which("docker") is None:
        pytest.skip("docker client not installed: compose file checked as YAML only")
    out = subprocess.run(
        ["docker", "compose", "-f", str(DEPLOY / "compose.yaml"), "config", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if "is not a docker command" in out.stderr or "unknown" in out.stderr.lower():
        pytest.skip("docker compose plugin not installed: compose file checked as YAML only")
    assert out.returncode == 0, out.stderr


def test_systemd_unit_when_systemd_analyze_is_present() -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze not installed: unit file checked by content only")
    out = subprocess.run(
        ["systemd-analyze", "verify", str(DEPLOY / "ckpt.service")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # The unit names where `pip install` puts ckpt on a host; this machine has it elsewhere.
    problems = [ln for ln in out.stderr.splitlines() if "is not executable" not in ln]
    assert problems == [], out.stderr


def test_systemd_unit_sandboxing() -> None:
    text = (DEPLOY / "ckpt.service").read_text()
    for option in (
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "StateDirectory=ckpt",
        "User=ckpt",
        "KillSignal=SIGTERM",
    ):
        assert option in text


def test_compose_config_declares_the_cold_tier() -> None:
    from checkpoint_vault.api.settings import effective_config, load_settings

    settings = load_settings(DEPLOY / "ckpt.compose.toml", environ={})
    assert settings.tiers["cold"]["url"].startswith("s3://")
    shown = effective_config(settings)
    assert shown["tiers.cold"]["secret_access_key"] == "<redacted>"
    services = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    assert {"vault", "seaweedfs"} <= set(services)


def compose_cluster_state() -> dict[str, object]:
    """deploy/cluster/compose.yaml's processes as `GET /v1/cluster` would list them."""
    from checkpoint_vault.api.settings import load_settings

    compose = yaml.safe_load((DEPLOY / "cluster" / "compose.yaml").read_text())
    members = []
    for service in compose["services"].values():
        env = service.get("environment") or {}
        if "CKPT_CLUSTER_NODE" not in env:
            continue
        config = next(v for v in service["volumes"] if v.endswith(":/etc/ckpt/ckpt.toml:ro"))
        shard = int(config.split("shard-")[1].split(".toml")[0])
        standby = "CKPT_STANDBY_FOLLOW" in env
        own = load_settings(DEPLOY / "cluster" / f"shard-{shard}.toml", environ=env).cluster
        assert own is not None
        members.append(
            {
                "node": env["CKPT_CLUSTER_NODE"],
                "shard": shard,
                "url": env["CKPT_CLUSTER_URL"],
                "s3_url": own.s3_url,  # the URL's host on [s3] port, as its beat says
                "role": "standby" if standby else "primary",
            }
        )
    return {"shards": 3, "members": members}


@pytest.mark.slow
def test_cluster_compose_proxy_config_is_the_generators() -> None:
    """haproxy.cfg beside the compose file is `ckpt cluster proxy-config`'s output for
    its six processes, and HAProxy accepts it when it is installed."""
    from checkpoint_vault.cluster.proxy import haproxy_config

    path = DEPLOY / "cluster" / "haproxy.cfg"
    assert path.read_text() == haproxy_config(compose_cluster_state(), "*:8080")
    for k in range(3):  # each shard's processes: its primary and its standby's config
        from checkpoint_vault.api.settings import load_settings

        settings = load_settings(
            DEPLOY / "cluster" / f"shard-{k}.toml",
            environ={"CKPT_CLUSTER_NODE": "n", "CKPT_CLUSTER_URL": "http://n:8470"},
        )
        assert settings.cluster is not None
        assert settings.cluster.shard == k
    haproxy = HAProxy.binary()  # installed from Debian's package if missing
    out = subprocess.run(
        [haproxy, "-c", "-f", str(path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.slow
def test_k8s_cluster_manifests_and_proxy_config(tmp_path: Path) -> None:
    """deploy/k8s/cluster.yaml: a StatefulSet of primaries and one of standbys, each pod's
    config a valid shard's once its ordinal is in, and HAProxy's config the generator's
    (`--dns`) for those six pods."""
    from checkpoint_vault.api.settings import load_settings
    from checkpoint_vault.cluster.proxy import haproxy_config

    docs = list(yaml.safe_load_all((DEPLOY / "k8s" / "cluster.yaml").read_text()))
    sets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "StatefulSet"}
    assert set(sets) == {"ckpt-shard", "ckpt-standby"}
    assert {s["spec"]["replicas"] for s in sets.values()} == {3}
    config = next(d for d in docs if d["kind"] == "ConfigMap")["data"]
    for k in range(3):
        path = tmp_path / f"shard-{k}.toml"
        path.write_text(config["ckpt.toml.in"].replace("@SHARD@", str(k)))
        env = {"CKPT_CLUSTER_NODE": f"ckpt-shard-{k}", "CKPT_CLUSTER_URL": "http://x:8470"}
        settings = load_settings(path, environ=env)
        assert settings.cluster is not None
        assert (settings.cluster.shard, settings.cluster.shards) == (k, 3)
        assert settings.cluster.s3_url == "http://x:9000"  # what the members below say
    members = [
        {
            "node": f"ckpt-{kind}-{k}",
            "shard": k,
            "url": f"http://ckpt-{kind}-{k}.ckpt-{kind}s:8470",
            "s3_url": f"http://ckpt-{kind}-{k}.ckpt-{kind}s:9000",  # [s3] port = 9000
        }
        for kind in ("shard", "standby")
        for k in range(3)
    ]
    expected = haproxy_config({"shards": 3, "members": members}, "*:8080", dns=True)
    assert config["haproxy.cfg"] == expected
    haproxy = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin")
    if haproxy is None:
        pytest.skip("haproxy not installed: its config compared with the generator's only")
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(expected)
    out = subprocess.run([haproxy, "-c", "-f", str(cfg)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
