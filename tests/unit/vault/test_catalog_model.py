"""Model-based test: random sequences of saves, deletes, pins, marks, forks, GC and time,
checked against a plain-Python model of what must be visible and readable."""

from __future__ import annotations

import random
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from checkpoint_vault.vault import Conflict, FakeClock, NotFound, Vault, VaultConfig

from .helpers import client_save, read_file, stream_save

NAMESPACES = ("a", "b/c")


class CatalogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="ckpt-model-"))
        self.clock = FakeClock()
        self.vault = Vault(self.dir / "v", VaultConfig(map_size=1 << 20, gc_grace=10.0), self.clock)
        self.live: dict[str, tuple[str, dict[str, bytes], bool, str]] = {}
        # id -> (namespace, files, pinned, validity)
        self.rng = random.Random(0)
        self.pool = [self.rng.randbytes(30_000) for _ in range(4)]

    def teardown(self) -> None:
        self.vault.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _data(self, pick: int, cut: int) -> bytes:
        base = self.pool[pick % len(self.pool)]
        return base[: cut % len(base)] + self.pool[(pick + 1) % len(self.pool)][: cut % 5000]

    @rule(
        ns=st.sampled_from(NAMESPACES),
        pick=st.integers(0, 10),
        cut=st.integers(0, 10**6),
        how=st.sampled_from(["stream", "client", "direct"]),
    )
    def save(self, ns: str, pick: int, cut: int, how: str) -> None:
        files = {"f": self._data(pick, cut), "g": self.pool[pick % 4][:1000]}
        if how == "stream":
            rec = stream_save(self.vault, ns, files)
        elif how == "client":
            rec = client_save(self.vault, ns, files)
        else:
            rec, _ = self.vault.save(ns, files)
        self.live[rec.id] = (ns, files, False, "unverified")

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        cid = data.draw(st.sampled_from(sorted(self.live)))
        ns, files, pinned, validity = self.live[cid]
        if pinned:
            with pytest.raises(Conflict):
                self.vault.lifecycle.delete(ns, cid)
        else:
            self.vault.lifecycle.delete(ns, cid)
            del self.live[cid]

    @precondition(lambda self: self.live)
    @rule(data=st.data(), pinned=st.booleans())
    def pin(self, data: st.DataObject, pinned: bool) -> None:
        cid = data.draw(st.sampled_from(sorted(self.live)))
        ns, files, _, validity = self.live[cid]
        self.vault.lifecycle.patch(ns, cid, pinned=pinned)
        self.live[cid] = (ns, files, pinned, validity)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), state=st.sampled_from(["valid", "invalid", "unverified"]))
    def mark(self, data: st.DataObject, state: str) -> None:
        cid = data.draw(st.sampled_from(sorted(self.live)))
        ns, files, pinned, _ = self.live[cid]
        self.vault.lifecycle.patch(ns, cid, validity={"state": state})
        self.live[cid] = (ns, files, pinned, state)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), dest=st.sampled_from(NAMESPACES))
    def fork(self, data: st.DataObject, dest: str) -> None:
        cid = data.draw(st.sampled_from(sorted(self.live)))
        ns, files, _, _ = self.live[cid]
        rec = self.vault.lifecycle.fork(ns, cid, dest)
        self.live[rec.id] = (dest, files, False, "unverified")

    @rule(seconds=st.sampled_from([1.0, 20.0, 7 * 3600.0]))
    def gc(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.vault.gc()

    @invariant()
    def everything_live_reads_back_and_nothing_else_is_listed(self) -> None:
        for ns in NAMESPACES:
            try:
                listed = {r.id for r in self.vault.checkpoints(ns, limit=1000)[0]}
            except NotFound:
                listed = set()
            expected = {cid for cid, v in self.live.items() if v[0] == ns}
            assert listed == expected
            valid = [
                cid for cid in sorted(expected, reverse=True) if self.live[cid][3] != "invalid"
            ]
            if valid:
                assert self.vault.get(ns, "latest-valid").id == valid[0]
        for cid, (ns, files, _, _) in self.live.items():
            for name, data in files.items():
                assert read_file(self.vault, ns, cid, name) == data

    @invariant()
    def reference_counts_match_manifests(self) -> None:
        assert self.vault.check().ok


CatalogMachine.TestCase.settings = settings(
    max_examples=15,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCatalogModel = CatalogMachine.TestCase
