"""The parts every engine operation needs, opened together and closed together."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .blocks import Blocks
from .catalog import Catalog
from .clock import Clock
from .config import VaultConfig
from .env import Env
from .ids import IdGenerator
from .writer import Writer


@dataclass
class Store:
    env: Env
    writer: Writer
    blocks: Blocks
    catalog: Catalog
    clock: Clock
    config: VaultConfig
    ids: IdGenerator

    @classmethod
    def open(cls, path: Path, clock: Clock, config: VaultConfig) -> Store:
        env = Env(path, config.map_size)
        blocks = Blocks(env)
        with env.read() as txn:
            cur = txn.cursor(db=env.db["checkpoints"])
            newest = bytes(cur.key()).decode() if cur.last() else None
        return cls(
            env=env,
            writer=Writer(env),
            blocks=blocks,
            catalog=Catalog(env, blocks),
            clock=clock,
            config=config,
            ids=IdGenerator(newest),
        )

    def now_ms(self) -> int:
        return int(self.clock.now() * 1000)

    def close(self) -> None:
        self.writer.close()
        self.env.close()
