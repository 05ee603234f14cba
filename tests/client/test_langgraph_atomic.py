"""A LangGraph system saved through the commit across namespaces: a graph with a subgraph
on one thread and a second agent on another, inside `VaultSaver.atomic()`. Nothing is
visible until the block ends; then every checkpoint of both threads (the subgraph's
checkpoint_ns too) is, or, when the commit is refused, none is."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph

from checkpoint_vault.client import AsyncVaultClient, Forbidden, VaultClient
from checkpoint_vault.client.langgraph import AsyncVaultSaver, VaultSaver

from ..serverproc import ServerProcess


class State(TypedDict, total=False):
    steps: list[str]


def _step(name: str) -> Any:
    return lambda state: {"steps": [*state.get("steps", []), name]}


def system(saver: AsyncVaultSaver) -> Any:
    """plan -> inner (a subgraph: check -> fix) -> done."""
    inner = StateGraph(State)
    inner.add_node("check", _step("check"))
    inner.add_node("fix", _step("fix"))
    inner.add_edge(START, "check")
    inner.add_edge("check", "fix")
    inner.add_edge("fix", END)
    outer = StateGraph(State)
    outer.add_node("plan", _step("plan"))
    outer.add_node("inner", inner.compile(checkpointer=True))
    outer.add_node("done", _step("done"))
    outer.add_edge(START, "plan")
    outer.add_edge("plan", "inner")
    outer.add_edge("inner", "done")
    outer.add_edge("done", END)
    return outer.compile(checkpointer=saver)


def _config(thread_id: str) -> Any:
    return {"configurable": {"thread_id": thread_id}}


def _records(vault: VaultClient, namespace: str) -> list[Any]:
    """Every record of `namespace` (none while it does not exist)."""
    if namespace not in {n.name for n in vault.namespaces()}:
        return []
    return vault.list(namespace, limit=1000)


@pytest.fixture
def saver(server: ServerProcess) -> Iterator[VaultSaver]:
    with VaultSaver(server.url, server.token) as s:
        yield s


def test_a_graph_its_subgraph_and_another_thread_commit_together(
    saver: VaultSaver, vault: VaultClient
) -> None:
    graph = system(saver)
    coder, reviewer = f"coder-{uuid.uuid4().hex[:8]}", f"reviewer-{uuid.uuid4().hex[:8]}"
    with saver.atomic():
        assert graph.invoke({"steps": []}, _config(coder))["steps"] == [
            "plan", "check", "fix", "done"
        ]  # fmt: skip
        graph.invoke({"steps": ["x"]}, _config(reviewer))
        for thread_id in (coder, reviewer):  # held: nothing of either is in the vault yet
            assert _records(vault, saver.layout.namespace(thread_id)) == []
    for thread_id in (coder, reviewer):
        records = _records(vault, saver.layout.namespace(thread_id))
        spaces = {r.metadata["checkpoint_ns"] for r in records}
        assert "" in spaces, spaces
        assert any(ns.split(":")[0] == "inner" for ns in spaces), spaces
        # read back through LangGraph: the run's last state, and the subgraph's history
        state = graph.get_state(_config(thread_id), subgraphs=True)
        assert state.values["steps"][-1] == "done"
        assert len(list(saver.list(_config(thread_id)))) == len(
            [r for r in records if r.metadata["langgraph"] == "checkpoint"]
        )


def test_a_refused_commit_leaves_nothing_of_any_thread(server: ServerProcess) -> None:
    with VaultClient(server.url, server.token, progress=False) as admin:
        token = admin.create_token(
            f"agents-{uuid.uuid4().hex[:6]}", ["read:langgraph/ok-*", "write:langgraph/ok-*"]
        ).token
        ok, other = f"ok-{uuid.uuid4().hex[:8]}", f"no-{uuid.uuid4().hex[:8]}"
        with VaultSaver(server.url, token) as saver:
            graph = system(saver)

            def both() -> None:
                with saver.atomic():
                    graph.invoke({"steps": []}, _config(ok))
                    graph.invoke({"steps": []}, _config(other))

            with pytest.raises(Forbidden):
                both()
            for thread_id in (ok, other):
                assert _records(admin, saver.layout.namespace(thread_id)) == []


async def test_the_async_saver_commits_an_atomic_block(server: ServerProcess) -> None:
    async with AsyncVaultClient(server.url, server.token, progress=False) as client:
        saver = AsyncVaultSaver(client)
        graph = system(saver)
        first, second = f"a-{uuid.uuid4().hex[:8]}", f"b-{uuid.uuid4().hex[:8]}"
        async with saver.aatomic():
            await graph.ainvoke({"steps": []}, _config(first))
            await graph.ainvoke({"steps": []}, _config(second))
            assert await saver.aget_tuple(_config(first)) is None  # held until the end
        for thread_id in (first, second):
            found = await saver.aget_tuple(_config(thread_id))
            assert found is not None
            assert found.checkpoint["channel_values"]["steps"][-1] == "done"
