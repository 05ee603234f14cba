"""Headless Chromium for the browser tests: Debian's `chromium`, installed when missing (as
tests/seaweed.py finds SeaweedFS), driven by Playwright's Python API with
`executable_path`, so no browser download is needed.

The flags keep Chromium off the network (this is a closed machine: its background
connections would be refused and slow it down) and out of any profile but a new, empty one
Playwright makes per launch.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from ..aptlock import apt_lock

CANDIDATES = ("chromium", "chromium-browser")
FLAGS = (
    "--no-sandbox",  # CI runs as root, where Chromium's sandbox refuses to start
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",  # containers often have a tiny /dev/shm
)
APT_TIMEOUT = 480.0  # seconds per apt-get: the install pulls ~100 MB on a fresh machine


def find_chromium() -> str | None:
    for name in CANDIDATES:
        found = shutil.which(name)
        if found is not None:
            return found
    return None


def ensure_chromium() -> str:
    """The path of a Chromium binary, installing Debian's package when there is none (as
    root: CI runs the suite as root on a fresh machine)."""
    found = find_chromium()
    if found is not None:
        return found
    if os.geteuid() != 0:
        raise RuntimeError("chromium is not installed: apt-get install chromium (needs root)")
    with apt_lock():  # another xdist worker may be installing it (tests/aptlock.py)
        found = find_chromium()
        if found is not None:
            return found
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for cmd in (
            ["apt-get", "update"],
            ["apt-get", "install", "-y", "--no-install-recommends", "chromium"],
        ):
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=APT_TIMEOUT)
            if done.returncode != 0:
                raise RuntimeError(
                    f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
                )
        found = find_chromium()
    if found is None:
        raise RuntimeError("apt-get installed chromium, but no chromium is on PATH")
    return found
