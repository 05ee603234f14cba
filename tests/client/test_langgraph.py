"""The LangGraph savers against a real server, driven by real LangGraph graphs.

The reference for "what LangGraph expects" is langgraph-checkpoint's own InMemorySaver:
the same calls replayed into a VaultSaver must read back exactly the same tuples. The server
runs two processes (`ckpt serve --workers 2`): the savers' saves and reads land on either.
"""

from __future__ import annotations

import asyncio
import copy
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    empty_checkpoint,
)
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Command, interrupt

from checkpoint_vault.client import AsyncVaultClient, VaultClient
from checkpoint_vault.client.langgraph import AsyncVaultSaver, VaultSaver
from checkpoint_vault.client.langgraph._layout import Layout, thread_segment
from checkpoint_vault.client.langgraph._retention import plan_prune
from checkpoint_vault.client.models import Checkpoint as Record

from ..serverproc import ServerProcess
from .forkscript import run_fork_script

FILLER = "lorem ipsum dolor sit amet, consectetur adipiscing elit " * 16  # ~0.9 kB a turn

WORKERS = 2  # the server's processes (tests/client/conftest.py)


class Chat(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    turns: int
    approved: bool


def plan(state: Chat) -> Chat:
    return {"turns": state.get("turns", 0) + 1}


def agent(state: Chat) -> Chat:
    return {"messages": [AIMessage(content=f"answer {state.get('turns', 0)}: {FILLER}")]}


def review(state: Chat) -> Chat:
    answer = interrupt({"question": "ship it?", "turn": state.get("turns", 0)})
    return {"approved": answer == "yes"}


def chat_graph(saver: BaseCheckpointSaver[Any], *, with_review: bool = False) -> Any:
    """plan -> agent -> tool (three nodes), or plan -> agent -> review (interrupts) -> inner
    subgraph that interrupts too, so checkpoints land in a non-root checkpoint_ns."""
    b = StateGraph(Chat)
    b.add_node("plan", plan)
    b.add_node("agent", agent)
    b.add_edge(START, "plan")
    b.add_edge("plan", "agent")
    if with_review:
        inner = StateGraph(Chat)
        inner.add_node("check", review)
        inner.add_edge(START, "check")
        inner.add_edge("check", END)
        b.add_node("review", review)
        b.add_node("inner", inner.compile())
        b.add_edge("agent", "review")
        b.add_edge("review", "inner")
        b.add_edge("inner", END)
    else:
        b.add_node("tool", lambda state: {})
        b.add_edge("agent", "tool")
        b.add_edge("tool", END)
    return b.compile(checkpointer=saver)


def ask(i: int) -> dict[str, Any]:
    return {"messages": [HumanMessage(content=f"question {i}: {FILLER}")]}


def thread() -> RunnableConfig:
    return {"configurable": {"thread_id": f"t-{uuid.uuid4().hex[:12]}"}}


@pytest.fixture
def saver(server: ServerProcess) -> Iterator[VaultSaver]:
    with VaultSaver(server.url, server.token) as s:
        yield s


class Recorder(InMemorySaver):
    """The reference saver, keeping every call so it can be replayed elsewhere."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, Any]] = []
        self._lock = threading.Lock()

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        # The reference stores the very copy that is recorded: LangGraph's loop goes on
        # while a background thread runs this put, and its add_messages reducer gives the
        # input's messages their ids in place, so the checkpoint object may change between
        # a copy and a later serialization (the flaky first tuple, under load). Recorded
        # and applied under one lock, so the replayed order is the order applied.
        with self._lock:
            args = (plain(config), *copy.deepcopy((checkpoint, metadata, new_versions)))
            self.calls.append(("put", args))
            return super().put(config, *args[1:])

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        with self._lock:
            args = (plain(config), copy.deepcopy(writes), task_id, task_path)
            self.calls.append(("put_writes", args))
            super().put_writes(config, args[1], task_id, task_path)


def plain(config: RunnableConfig) -> RunnableConfig:
    """The parts of a config a saver reads (LangGraph's own config also holds callbacks and
    locks, which cannot be copied)."""
    out: dict[str, Any] = {}
    for part in ("configurable", "metadata"):
        values = {}
        given: dict[str, Any] = dict(config.get(part) or {})  # type: ignore[call-overload]
        for k, v in given.items():
            try:
                values[k] = copy.deepcopy(v)
            except TypeError:
                continue
        out[part] = values
    return out  # type: ignore[return-value]


def replay(calls: list[tuple[str, Any]], target: BaseCheckpointSaver[Any]) -> None:
    for name, args in calls:
        getattr(target, name)(*args)


def by_id(t: Any) -> str:
    return str(t.config["configurable"]["checkpoint_id"])


def record_reference_run(cfg: RunnableConfig) -> Recorder:
    """Two turns, each interrupted twice (in the graph and in its subgraph), resumed."""
    ref = Recorder()
    graph = chat_graph(ref, with_review=True)
    for turn in range(2):
        graph.invoke(ask(turn), cfg)
        graph.invoke(Command(resume="yes"), cfg)
        graph.invoke(Command(resume="no"), cfg)
    return ref


@pytest.mark.slow
@pytest.mark.parametrize("reader", ["same saver", "cold saver"])
def test_replayed_calls_read_back_exactly_as_the_in_memory_saver(
    server: ServerProcess, reader: str
) -> None:
    """Read back by the saver that wrote (mostly from its cache of what it sent) and by a
    fresh one with no cache (every file from the server)."""
    cfg = thread()
    ref = record_reference_run(cfg)
    with VaultSaver(server.url, server.token) as writer:
        replay(ref.calls, writer)  # in call order: some writes come before their put
        if reader == "same saver":
            check_reads_match(writer, ref, cfg)
            return
    with VaultSaver(server.url, server.token, cache_bytes=0) as cold:
        check_reads_match(cold, ref, cfg)


def check_reads_match(saver: VaultSaver, ref: Recorder, cfg: RunnableConfig) -> None:
    # Across checkpoint_ns the order is the saver's own (the in-memory saver goes namespace
    # by namespace, SQLite's by id, ours by commit); within one it is newest first.
    everything = sorted(ref.list(cfg), key=by_id)
    assert sorted(saver.list(cfg), key=by_id) == everything
    assert {t.config["configurable"]["checkpoint_ns"] for t in everything} != {""}
    assert any(t.pending_writes for t in everything)
    for t in everything:
        assert saver.get_tuple(t.config) == t
    for ns in {t.config["configurable"]["checkpoint_ns"] for t in everything}:
        latest: RunnableConfig = {"configurable": {**cfg["configurable"], "checkpoint_ns": ns}}
        assert saver.get_tuple(latest) == ref.get_tuple(latest)
        assert list(saver.list(latest)) == list(ref.list(latest))
    root: RunnableConfig = {"configurable": {**cfg["configurable"], "checkpoint_ns": ""}}
    middle = everything[len(everything) // 2].config
    for kwargs in (
        {"filter": {"source": "loop"}},
        {"filter": {"step": 2, "source": "loop"}},
        {"before": middle},
        {"before": middle, "limit": 2},
        {"limit": 3},
        {"limit": 0},
    ):
        assert list(saver.list(root, **kwargs)) == list(ref.list(root, **kwargs)), kwargs
    tid = cfg["configurable"]["thread_id"]
    mine = [t for t in saver.list(None) if t.config["configurable"]["thread_id"] == tid]
    assert sorted(mine, key=by_id) == everything


def test_interrupts_resume_and_time_travel_through_a_real_graph(saver: VaultSaver) -> None:
    graph = chat_graph(saver, with_review=True)
    cfg = thread()
    graph.invoke(ask(0), cfg)
    state = graph.get_state(cfg)
    assert state.next == ("review",)
    assert state.tasks[0].interrupts[0].value == {"question": "ship it?", "turn": 1}
    graph.invoke(Command(resume="yes"), cfg)
    state = graph.get_state(cfg, subgraphs=True)
    assert state.next == ("inner",)
    inner = state.tasks[0].state
    assert inner is not None
    assert not isinstance(inner, dict)
    assert inner.next == ("check",)
    assert inner.values["approved"] is True
    graph.invoke(Command(resume="no"), cfg)
    done = graph.get_state(cfg)
    assert done.next == ()
    assert done.values["approved"] is False
    assert [m.type for m in done.values["messages"]] == ["human", "ai"]

    history = list(graph.get_state_history(cfg))
    for newer, older in zip(history, history[1:], strict=False):
        assert newer.parent_config == older.config
    assert history[-1].parent_config is None

    # Replay from before the agent ran: a new branch whose first parent is that checkpoint.
    past = next(h for h in history if h.next == ("agent",))
    graph.invoke(None, past.config)
    branch = graph.get_state(cfg)
    assert branch.next == ("review",)
    chain = list(graph.get_state_history(cfg))
    assert past.config in [h.parent_config for h in chain]
    # A forked edit of the past, then resuming the edited branch to its end.
    edited = graph.update_state(past.config, {"turns": 41})
    assert graph.get_state(edited).values["turns"] == 41
    assert graph.get_state(edited).parent_config == past.config
    graph.invoke(None, edited)
    graph.invoke(Command(resume="yes"), cfg)
    graph.invoke(Command(resume="yes"), cfg)
    final = graph.get_state(cfg)
    assert final.values["turns"] == 41
    assert final.values["approved"] is True
    assert graph.get_state(history[0].config).values == done.values  # the old end is intact


async def test_async_saver_runs_interrupts_history_and_deletes(server: ServerProcess) -> None:
    async with AsyncVaultClient(server.url, server.token, progress=False) as client:
        saver = AsyncVaultSaver(client)
        graph = chat_graph(saver, with_review=True)
        cfg = thread()
        await graph.ainvoke(ask(0), cfg)
        assert (await graph.aget_state(cfg)).next == ("review",)
        await graph.ainvoke(Command(resume="yes"), cfg)
        await graph.ainvoke(Command(resume="yes"), cfg)
        done = await graph.aget_state(cfg)
        assert done.next == ()
        assert done.values["approved"] is True
        history = [h async for h in graph.aget_state_history(cfg)]
        past = next(h for h in history if h.next == ("agent",))
        await graph.ainvoke(None, past.config)
        assert (await graph.aget_state(cfg)).next == ("review",)

        # Sync calls from another thread run on the client's loop.
        latest = await asyncio.to_thread(saver.get_tuple, cfg)
        assert latest == await saver.aget_tuple(cfg)
        with pytest.raises(RuntimeError, match="a\\* methods"):
            saver.get_tuple(cfg)  # from the loop itself it would deadlock

        loops = [t async for t in saver.alist(cfg, filter={"source": "loop"}, limit=3)]
        assert len(loops) == 3
        assert all(t.metadata["source"] == "loop" for t in loops)
        await saver.adelete_thread(cfg["configurable"]["thread_id"])
        assert await saver.aget_tuple(cfg) is None
        assert [t async for t in saver.alist(cfg)] == []

    # VaultSaver's async methods hop from this loop to the saver's own.
    with VaultSaver(server.url, server.token) as own_loop:
        graph = chat_graph(own_loop)
        await graph.ainvoke(ask(0), cfg)
        await graph.ainvoke(ask(1), cfg)
        assert (await graph.aget_state(cfg)).values["turns"] == 2
        assert len([t async for t in own_loop.alist(cfg, limit=7)]) == 7


def first_put(
    saver: VaultSaver,
) -> tuple[RunnableConfig, Checkpoint, CheckpointMetadata, ChannelVersions]:
    """The arguments of a new thread's first put: one message."""
    cfg = thread()
    base: RunnableConfig = {"configurable": {**cfg["configurable"], "checkpoint_ns": ""}}
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"messages": [HumanMessage(content="hi", id="m1")]}
    versions: ChannelVersions = {"messages": saver.get_next_version(None, None)}
    checkpoint["channel_versions"] = versions
    meta: CheckpointMetadata = {"source": "input", "step": -1, "parents": {}}
    return base, checkpoint, meta, versions


def test_writes_racing_their_checkpoint_are_all_kept(saver: VaultSaver) -> None:
    """LangGraph sends a checkpoint's writes while its put may not have started, be on its
    way, or be done: every write must read back, with the reference saver's merge rules."""
    base, checkpoint, meta, versions = first_put(saver)
    at: RunnableConfig = {
        "configurable": {**base["configurable"], "checkpoint_id": checkpoint["id"]}
    }
    ref = InMemorySaver()
    calls: list[tuple[str, Any]] = [
        ("put_writes", (at, [("a", 1), ("b", 2)], "task-1", "~path1")),  # before the put
        ("put_writes", (at, [("__interrupt__", "first")], "task-2", "~path2")),
    ]
    calls += [("put_writes", (at, [(f"c{i}", i)], f"task-{i + 3}", "")) for i in range(12)]
    calls += [
        ("put_writes", (at, [("a", 99)], "task-1", "~path1")),  # a regular write: first wins
        ("put_writes", (at, [("__interrupt__", "second")], "task-2", "~path2")),  # last wins
    ]
    replay(calls[:2] + [("put", (base, checkpoint, meta, versions))] + calls[2:], ref)

    with ThreadPoolExecutor(8) as pool:
        for name, args in calls[:2]:
            getattr(saver, name)(*args)
        racing = [pool.submit(saver.put_writes, *args) for _, args in calls[2:14]]
        saver.put(base, checkpoint, meta, versions)
        for f in racing:
            f.result()
    for name, args in calls[14:]:
        getattr(saver, name)(*args)
    mine, theirs = saver.get_tuple(at), ref.get_tuple(at)
    assert mine is not None
    assert theirs is not None
    assert mine.pending_writes == theirs.pending_writes
    assert ("task-1", "a", 1) in (mine.pending_writes or [])
    assert ("task-2", "__interrupt__", "second") in (mine.pending_writes or [])
    assert saver.get_tuple(base) == ref.get_tuple(base)


def test_puts_and_writes_need_nothing_of_the_clients_loop_thread(saver: VaultSaver) -> None:
    """A sync program's put and put_writes are sent from its own threads: with the client's
    loop thread held busy, a whole turn's puts and writes still complete."""
    base, checkpoint, meta, versions = first_put(saver)
    held, release = threading.Event(), threading.Event()
    released: list[bool] = []  # False: the hold timed out (a call waited for the loop)

    def hold() -> None:
        held.set()
        released.append(release.wait(5))

    saver._vault._loop.call_soon_threadsafe(hold)
    assert held.wait(10)
    try:
        at = saver.put(base, checkpoint, meta, versions)
        saver.put_writes(at, [("a", 1)], "task-1", "")
    finally:
        release.set()
    found = saver.get_tuple(at)  # on the loop: the hold has ended
    assert released == [True]
    assert found is not None
    assert found.checkpoint["channel_values"] == checkpoint["channel_values"]
    assert found.pending_writes == [("task-1", "a", 1)]


def test_a_read_of_what_this_process_saved_needs_nothing_of_the_loop_thread(
    saver: VaultSaver,
) -> None:
    """get_tuple is a listing (sent from the caller's thread) and files this process holds
    (its checkpoints' and its writes'): with the client's loop thread held busy, it
    completes, as LangGraph's first call of every run does."""
    base, checkpoint, meta, versions = first_put(saver)
    at = saver.put(base, checkpoint, meta, versions)
    saver.put_writes(at, [("a", 1)], "task-1", "")
    held, release, ended = threading.Event(), threading.Event(), threading.Event()
    released: list[bool] = []  # False: the hold timed out (the read waited for the loop)

    def hold() -> None:
        held.set()
        released.append(release.wait(5))
        ended.set()

    saver._vault._loop.call_soon_threadsafe(hold)
    assert held.wait(10)
    try:
        latest = saver.get_tuple(base)
        by_id = saver.get_tuple(at)
        nothing = saver.get_tuple(thread())
    finally:
        release.set()
    assert ended.wait(10)
    assert released == [True]
    assert latest is not None
    assert by_id is not None
    assert nothing is None
    assert latest.checkpoint["channel_values"] == checkpoint["channel_values"]
    assert latest.pending_writes == by_id.pending_writes == [("task-1", "a", 1)]


def test_saver_calls_go_around_http_client(saver: VaultSaver) -> None:
    """A put, a put_writes and a get_tuple are whole small requests written and framed by
    client/http1.py: `http.client`'s per-header checks and `email` parsing cost ~0.1 ms of
    client CPU per request, a third of PostgresSaver's whole put."""
    base, checkpoint, meta, versions = first_put(saver)
    assert saver.get_tuple(base) is None  # a kept-alive connection (opening one is http.client's)
    entered: set[str] = set()

    def note(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            entered.add(f"{frame.f_globals.get('__name__')}.{frame.f_code.co_name}")

    sys.setprofile(note)
    try:
        at = saver.put(base, checkpoint, meta, versions)
        saver.put_writes(at, [("a", 1)], "task-1", "")
        found = saver.get_tuple(base)
    finally:
        sys.setprofile(None)
    assert found is not None
    assert found.pending_writes == [("task-1", "a", 1)]
    assert "checkpoint_vault.client.http1.exchange" in entered
    assert not {m for m in entered if m.startswith(("http.", "email."))}


def test_a_turn_costs_one_request_per_saver_call_and_no_downloads(saver: VaultSaver) -> None:
    """One invoke of the 3-node graph: 1 get_tuple, 5 puts, 4 put_writes, each one request;
    the latest checkpoint's files are in the cache, nothing is downloaded."""
    graph = chat_graph(saver)
    cfg = thread()
    graph.invoke(ask(0), cfg)
    transfer = saver.client.transfer
    requests, received = transfer.requests, transfer.bytes_received
    graph.invoke(ask(1), cfg)
    assert transfer.requests - requests == 1 + 5 + 4
    assert transfer.bytes_received - received < 64_000  # listings and records only
    assert graph.get_state(cfg).values["turns"] == 2


class Fan(TypedDict, total=False):
    log: Annotated[list[str], lambda a, b: a + b]


def test_finished_branches_do_not_rerun_after_an_interrupt(saver: VaultSaver) -> None:
    """Three branches in one super-step, their writes sent from pool threads at once; one
    interrupts. On resume only that one runs again: the others' pending writes were kept."""
    runs: list[str] = []
    lock = threading.Lock()

    def branch(name: str) -> Any:
        def node(state: Fan) -> Fan:
            with lock:
                runs.append(name)
            if name == "c":
                interrupt("c waits")
            return {"log": [name]}

        return node

    b = StateGraph(Fan)
    for name in "abc":
        b.add_node(name, branch(name))
        b.add_edge(START, name)
    b.add_node("join", lambda state: {"log": ["join"]})
    b.add_edge(["a", "b", "c"], "join")
    graph = b.compile(checkpointer=saver)
    cfg = thread()
    graph.invoke({"log": []}, cfg)
    assert sorted(runs) == ["a", "b", "c"]
    state = graph.get_state(cfg)
    assert state.next == ("c",)
    interrupted = saver.get_tuple(cfg)
    assert interrupted is not None
    assert {w[1] for w in interrupted.pending_writes or []} >= {"log", "__interrupt__"}
    graph.invoke(Command(resume="go"), cfg)
    assert sorted(runs) == ["a", "b", "c", "c"]
    assert sorted(graph.get_state(cfg).values["log"]) == ["a", "b", "c", "join"]


def test_many_threads_of_a_sync_program_share_one_saver(saver: VaultSaver) -> None:
    graph = chat_graph(saver)
    configs = [thread() for _ in range(6)]
    for turn in range(3):
        graph.batch([ask(turn)] * len(configs), configs)  # runs the six in parallel threads
    for cfg in configs:
        state = graph.get_state(cfg)
        assert state.values["turns"] == 3
        assert len(state.values["messages"]) == 6


def test_a_saver_can_share_a_clients_connections(vault: VaultClient) -> None:
    threads_before = {t.name for t in threading.enumerate()}
    with VaultSaver.sharing(vault, keep_last=5) as shared:
        assert {t.name for t in threading.enumerate()} == threads_before  # no loop of its own
        graph = chat_graph(shared)
        cfg = thread()
        for turn in range(2):
            graph.invoke(ask(turn), cfg)
        assert graph.get_state(cfg).values["turns"] == 2
    assert vault.health().status == "ok"  # the saver's close left the client open


def test_copy_prune_and_delete_threads(saver: VaultSaver, vault: VaultClient) -> None:
    graph = chat_graph(saver)
    a, b = thread(), thread()
    for turn in range(3):
        graph.invoke(ask(turn), {**a, "metadata": {"run_id": f"run-{turn}"}})
    stored = vault.stats().stored_bytes
    saver.copy_thread(a["configurable"]["thread_id"], b["configurable"]["thread_id"])
    assert vault.stats().stored_bytes == stored  # forks share chunks: nothing copied
    copied = [t.checkpoint for t in saver.list(b)]
    assert copied == [t.checkpoint for t in saver.list(a)]
    assert len(copied) == 15
    graph.invoke(ask(3), b)
    assert graph.get_state(b).values["turns"] == 4
    assert graph.get_state(a).values["turns"] == 3

    saver.delete_for_runs(["run-1"])
    assert {t.metadata.get("run_id") for t in saver.list(a)} == {"run-0", "run-2"}
    saver.prune([a["configurable"]["thread_id"]], strategy="keep_latest")
    assert len(list(saver.list(a))) == 1
    graph.invoke(ask(3), a)  # the pruned thread carries on from its latest checkpoint
    assert graph.get_state(a).values["turns"] == 4

    saver.prune([b["configurable"]["thread_id"]], strategy="delete")
    requests = saver.client.transfer.requests
    saver.delete_thread(a["configurable"]["thread_id"])
    assert saver.client.transfer.requests - requests == 1  # one bulk delete
    assert saver.get_tuple(a) is None
    assert saver.get_tuple(b) is None
    assert vault.list(Layout().namespace(a["configurable"]["thread_id"])) == []
    emptied = {Layout().namespace(t["configurable"]["thread_id"]) for t in (a, b)}
    assert not emptied & {n.name for n in vault.namespaces()}  # nor listed as threads


def test_keep_last_bounds_a_thread_and_it_still_resumes(
    server: ServerProcess, vault: VaultClient
) -> None:
    cfg = thread()
    with VaultSaver(server.url, server.token, keep_last=4) as saver:
        graph = chat_graph(saver, with_review=True)
        for turn in range(4):
            graph.invoke(ask(turn), cfg)
            graph.invoke(Command(resume="yes"), cfg)
            graph.invoke(Command(resume="no"), cfg)
        records = vault.list(Layout().namespace(cfg["configurable"]["thread_id"]), limit=1000)
        checkpoints = [r for r in records if "lg:checkpoint" in r.tags]
        assert len(checkpoints) <= 2 * 5  # two checkpoint_ns, up to keep + keep // 4 each
        assert len(records) <= 3 * len(checkpoints)  # no writes left behind without theirs
        graph.invoke(ask(9), cfg)
        assert graph.get_state(cfg).next == ("review",)
        assert graph.get_state(cfg).values["turns"] == 5


@pytest.mark.slow
def test_a_hundred_chat_turns_dedup_to_under_two_megabytes(
    saver: VaultSaver, vault: VaultClient
) -> None:
    graph = chat_graph(saver)
    cfg = thread()
    before = vault.stats()
    for turn in range(100):
        graph.invoke(ask(turn), cfg)
    after = vault.stats()
    assert len(graph.get_state(cfg).values["messages"]) == 200
    logical = after.logical_bytes - before.logical_bytes
    stored = after.stored_bytes - before.stored_bytes
    assert logical > 20_000_000  # the history is re-serialized whole at every step
    assert stored < 2_000_000, (stored, logical)


@pytest.mark.parametrize(
    "thread_id",
    ["plain-id_1.2", "with space/and:colon", "ünïcode ✓", "x" * 300, "", "-leading"],
)
def test_any_thread_id_gets_its_own_valid_namespace(saver: VaultSaver, thread_id: str) -> None:
    segment = thread_segment(thread_id)
    assert len(segment) <= 128
    assert (segment == thread_id) == (":" not in segment)
    cfg: RunnableConfig = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    saver.delete_thread(thread_id)  # parametrized ids repeat across runs of one server
    chat_graph(saver).invoke(ask(0), cfg)
    latest = saver.get_tuple(cfg)
    assert latest is not None
    assert latest.config["configurable"]["thread_id"] == thread_id
    assert thread_segment(thread_id + "x") != segment
    with pytest.raises(ValueError, match="prefix"):
        Layout("bad prefix")


def test_retention_plan_keeps_delta_ancestors_and_early_writes() -> None:
    def rec(i: int, kind: str, cid: str, parent: str | None = None, **md: Any) -> Record:
        meta = {"langgraph": kind, "thread_id": "t", "checkpoint_ns": "", "checkpoint_id": cid}
        return Record(
            id=f"{i:026d}",
            namespace="langgraph/t",
            parent=None,
            created_at="",
            metadata={**meta, "parent_checkpoint_id": parent, "metadata": md},
        )

    delta = {"counters_since_delta_snapshot": {"log": [2, 2]}}
    newest_first = [
        rec(9, "writes", "c5"),  # its checkpoint is still on its way
        rec(8, "checkpoint", "c4", "c3", **delta),
        rec(7, "writes", "c4"),
        rec(6, "checkpoint", "c3", "c2", **delta),
        rec(5, "writes", "c2"),
        rec(4, "checkpoint", "c2", "c1"),  # the snapshot c4 rebuilds from
        rec(3, "checkpoint", "c1", None),
        rec(2, "writes", "c1"),
    ]
    doomed = plan_prune(newest_first, keep=1)
    assert [r.metadata["checkpoint_id"] for r in doomed] == ["c1", "c1"]


def test_the_integration_imports_without_torch_or_fsspec() -> None:
    code = (
        "import sys, client.langgraph; "
        "bad = {'torch', 'fsspec', 'vault', 'api', 'lmdb'} & set(sys.modules); "
        "print(sorted(bad)); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_versions_increase_as_strings(saver: VaultSaver) -> None:
    versions = [saver.get_next_version(None, None)]
    for _ in range(12):
        versions.append(saver.get_next_version(versions[-1], None))
    assert versions == sorted(versions)
    assert len(set(versions)) == len(versions)
    assert saver.get_next_version(7, None).startswith(f"{8:032}.")  # type: ignore[arg-type]


SAVER_FORK_SCRIPT = """
import gc, multiprocessing, sys
from checkpoint_vault.client import ClientError
from checkpoint_vault.client.langgraph import VaultSaver

held = [VaultSaver(keep_last=None)]
config = {"configurable": {"thread_id": "fork-thread", "checkpoint_ns": ""}}
held[0].get_tuple(config)  # the parent's pool now holds a connection


def child():
    copy = held.pop()
    try:
        copy.get_tuple(config)
        sys.exit(4)  # the copy must refuse: its connections and loop are the parent's
    except ClientError:
        pass
    copy.close()  # a no-op in the child
    del copy
    gc.collect()
    sys.exit(0)


proc = multiprocessing.get_context("fork").Process(target=child)
proc.start()
proc.join()
assert proc.exitcode == 0, proc.exitcode
assert held[0].get_tuple(config) is None  # hangs if the child broke the parent's loop
held[0].close()
print("parent saver works after the child exited")
"""


def test_a_forked_child_leaves_the_parent_saver_working(server: ServerProcess) -> None:
    out = run_fork_script(server, SAVER_FORK_SCRIPT)
    assert out == "parent saver works after the child exited\n"
