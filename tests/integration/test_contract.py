"""The HTTP contract as a fuzzer sees it (issue 16): schemathesis on the service's own
OpenAPI document, authenticated as admin, every check, all phases including the stateful
one (it follows the document's links from opening an upload to its routes, and from a
commit to the checkpoint's). Bounded (5 examples per operation, fixed seed: ~10 s) and
expected to find nothing: no 5xx, answers matching their schemas, 405 with `Allow`, and
parameters patterned so that what the schema allows the service accepts and vice versa.
Every operation is fuzzed, the raw-body routes too (chunk PUT, chunk batch, bundle save):
their bodies must hash to their ids or be well framed, which no schema states, so
tests/schemathesis.toml takes the 400 the OpenAPI document gives them as the acceptance
check's answer; every other check applies to them as to the rest.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from ..fault.conftest import crash_server  # noqa: F401 - the fixture: a fresh `ckpt serve`
from ..serverproc import ServerProcess

CONFIG = Path(__file__).parent.parent / "schemathesis.toml"


@pytest.mark.slow
def test_schemathesis_finds_nothing(crash_server: ServerProcess, tmp_path: Path) -> None:  # noqa: F811
    server = crash_server
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "schemathesis.cli",
            "--config-file",
            str(CONFIG),
            "run",
            f"{server.url}/v1/openapi.json",
            "-H",
            f"Authorization: Bearer {server.token}",
            "--checks",
            "all",
            "--max-examples",
            "5",
            "--seed",
            "1",
            "--generation-database",
            "none",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert "Stateful" in result.stdout
    selected = re.search(r"Selected: (\d+)/(\d+)", result.stdout)
    assert selected is not None
    assert selected[1] == selected[2], "an operation is left out of the run"
    assert f"Tested: {selected[1]}" in result.stdout
