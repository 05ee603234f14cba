"""What VaultSaver keeps of a committed checkpoint for the next put (`_memo.Held`), taken
from a put's answer as JSON: the answer is not checked as a whole record, so what is read
of it must fail loudly when it is not one."""

from __future__ import annotations

from typing import Any

import pytest

from checkpoint_vault.client import IntegrityError
from checkpoint_vault.client.langgraph._memo import Held
from checkpoint_vault.client.models import Checkpoint

ANSWER: dict[str, Any] = {
    "id": "01M8K68JK21Y3Y0R78RPW0JJ0Y",
    "namespace": "langgraph/t",
    "parent": None,
    "created_at": "2026-11-29T08:20:36.578Z",
    "metadata": {"langgraph": "checkpoint", "channels": {"messages": "msgpack"}},
    "tags": ["lg:checkpoint"],
    "files": {
        "checkpoint": {"size": 891, "hash": "58" * 32},
        "c/messages": {"size": 66194, "hash": "27" * 32},
    },
    "size": 67085,
    "tier": "hot",
}


def test_an_answer_and_its_record_give_the_same() -> None:
    held = Held.of(ANSWER)
    assert held == Held.of(Checkpoint.from_wire(ANSWER))
    assert held.id == ANSWER["id"]
    assert held.files["c/messages"] == ("27" * 32, 66194)
    assert held.channels == {"messages": "msgpack"}


@pytest.mark.parametrize(
    "broken",
    [
        {k: v for k, v in ANSWER.items() if k != "files"},
        {**ANSWER, "files": {"checkpoint": {"size": 891}}},
        {**ANSWER, "files": ["checkpoint"]},
        {**ANSWER, "metadata": None},
        None,
    ],
    ids=["no files", "no hash", "files a list", "metadata null", "null"],
)
def test_an_answer_that_is_no_record_is_an_integrity_error(broken: Any) -> None:
    with pytest.raises(IntegrityError, match="no checkpoint record"):
        Held.of(broken)
