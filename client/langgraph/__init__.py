"""LangGraph checkpointers backed by Checkpoint Vault (`pip install '.[langgraph]'`).

    from checkpoint_vault.client.langgraph import VaultSaver
    graph = builder.compile(checkpointer=VaultSaver())          # CKPT_URL / CKPT_TOKEN

`VaultSaver` for sync programs, `AsyncVaultSaver(async_client)` for async ones. Each thread
is a vault namespace `<prefix>/<thread>`; docs/integrations/langgraph.md says what is
stored where and what it costs. Imports langgraph-checkpoint only (no torch, no fsspec).
"""

from ._blocking import VaultSaver
from ._saver import AsyncVaultSaver

__all__ = ["AsyncVaultSaver", "VaultSaver"]
