"""A real framework through the S3 endpoint: Ray Train (TorchTrainer, `storage_path` on
the endpoint through PyArrow's S3 filesystem, the AWS C++ SDK). Each reported checkpoint
becomes one vault checkpoint with lineage (Ray's `checkpoint_manager_snapshot.json`,
written after each report, is a default completion marker); the run started again under
the same name resumes from the newest one through the endpoint, its counter going on."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from checkpoint_vault.client.sync import VaultClient
from tests.s3endpoint import REGION, S3Server, start

pytestmark = [
    pytest.mark.slow,  # a Ray cluster starts (~10 s) and runs two trainings (~35 s)
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]
REPORTS = 5


# Ray Train's controller polls its workers every 2 s by default, and a report waits for the
# poll that takes it: 10 reports were ~20 s of waiting. Polled every 0.1 s (Ray passes this
# variable on to the controller), the same reports and checkpoints, sooner.
CONTROLLER_POLL = "0.1"


@pytest.fixture
def s3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Server]:
    # Ray imported here, not at collection, where it cost every xdist worker ~7 s (the
    # one that never runs this file too)
    ray = pytest.importorskip("ray")
    pytest.importorskip("pyarrow.fs")
    monkeypatch.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", CONTROLLER_POLL)
    srv = start(tmp_path, commit_after="600s")  # only markers commit here
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield srv
    finally:
        ray.shutdown()
        srv.server.stop()


def _count(config: dict[str, Any]) -> None:
    """A training loop whose state is a counter, resumed from Ray's checkpoint."""
    from ray import train

    counter = 0
    restored = train.get_checkpoint()
    if restored is not None:
        with restored.as_directory() as d:
            counter = json.loads(Path(d, "state.json").read_text())["counter"]
    for _ in range(config["reports"]):
        counter += 1
        with tempfile.TemporaryDirectory() as d:
            Path(d, "state.json").write_text(json.dumps({"counter": counter}))
            train.report({"counter": counter}, checkpoint=train.Checkpoint.from_directory(d))


def _fit(s3: S3Server) -> Any:
    import pyarrow.fs as pafs
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    key, secret = s3.credentials()
    fs = pafs.S3FileSystem(
        endpoint_override=s3.endpoint.removeprefix("http://"),
        scheme="http",
        region=REGION,
        access_key=key,
        secret_key=secret,
    )
    trainer = TorchTrainer(
        _count,
        train_loop_config={"reports": REPORTS},
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(storage_path="raytrain/exp", storage_filesystem=fs, name="run1"),
    )
    return trainer.fit()


@pytest.mark.slow
def test_ray_train_checkpoints_into_the_vault_and_resumes(s3: S3Server) -> None:
    first = _fit(s3)
    assert first.metrics["counter"] == REPORTS
    with VaultClient(s3.server.url, s3.server.token) as vault:
        live = list(reversed(vault.list("raytrain")))
        assert len(live) == REPORTS
        assert live[0].parent is None
        assert [c.parent for c in live[1:]] == [c.id for c in live[:-1]]
        newest = [n for n in live[-1].files if n.endswith("/state.json")]
        assert len(newest) == REPORTS  # the bucket as it stood: every checkpoint dir so far
    again = _fit(s3)  # same name and storage: Ray restores from the newest checkpoint
    assert again.metrics["counter"] == 2 * REPORTS
    with VaultClient(s3.server.url, s3.server.token) as vault:
        assert len(vault.list("raytrain")) == 2 * REPORTS
