"""The LangGraph databases an import reads and an export writes: a SqliteSaver file or a
PostgresSaver database, each as its own saver plus the two things its API does not give:
the threads it holds, and each pending write's `task_path` (a saver hands writes back as
(task_id, channel, value), sorted by task_path; putting them again without it would
reorder the writes of a step with several tasks).

The schema is checked before the saver is made, since making one runs its `setup`, which
would create tables in a database of another kind: SQLite by the columns of its two
tables, PostgreSQL by the migration version PostgresSaver records (a newer or older
version than the installed langgraph-checkpoint-postgres knows is refused).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver

from ._series import BadSource

POSTGRES_SCHEMES = ("postgresql://", "postgres://")
SQLITE_CHECKPOINT_COLUMNS = frozenset(
    {"thread_id", "checkpoint_ns", "checkpoint_id", "parent_checkpoint_id", "type", "checkpoint"}
)
SQLITE_WRITES_COLUMNS = frozenset(
    {"thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx", "channel", "type", "value"}
)

# (thread_id, checkpoint_ns, checkpoint_id) -> {task_id: task_path}
TaskPaths = Callable[[str, str, str], dict[str, str]]


@dataclass
class GraphDatabase:
    """A saver over the database, its threads, and the task paths of a checkpoint's writes."""

    saver: BaseCheckpointSaver[Any]
    threads: Callable[[], list[str]]
    task_paths: TaskPaths


@contextmanager
def open_database(target: str, *, create: bool) -> Iterator[GraphDatabase]:
    """`target` is a postgresql:// URL or a SQLite file path. `create`: an export's
    destination, whose tables the saver makes if missing; else the schema must be there."""
    if target.startswith(POSTGRES_SCHEMES):
        with _postgres(target, create) as db:
            yield db
    else:
        with _sqlite(Path(target), create) as db:
            yield db


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}  # noqa: S608 - fixed names


@contextmanager
def _sqlite(path: Path, create: bool) -> Iterator[GraphDatabase]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    if not create and not path.is_file():
        raise BadSource(f"{path}: no such SQLite file")
    conn = sqlite3.connect(path, check_same_thread=False)
    try:
        checkpoints, writes = _columns(conn, "checkpoints"), _columns(conn, "writes")
        fresh = not checkpoints and not writes
        if not (create and fresh) and not (
            checkpoints >= SQLITE_CHECKPOINT_COLUMNS and writes >= SQLITE_WRITES_COLUMNS
        ):
            raise BadSource(f"{path}: not a SqliteSaver database of a known schema")
        has_path = "task_path" in writes

        def threads() -> list[str]:
            rows = conn.execute("SELECT DISTINCT thread_id FROM checkpoints ORDER BY thread_id")
            return [str(r[0]) for r in rows]

        def task_paths(thread_id: str, ns: str, cid: str) -> dict[str, str]:
            if not has_path:
                return {}
            rows = conn.execute(
                "SELECT DISTINCT task_id, task_path FROM writes "
                "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?",
                (thread_id, ns, cid),
            )
            return {str(t): str(p) for t, p in rows}

        yield GraphDatabase(SqliteSaver(conn), threads, task_paths)
    finally:
        conn.close()


@contextmanager
def _postgres(url: str, create: bool) -> Iterator[GraphDatabase]:
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    known = len(PostgresSaver.MIGRATIONS) - 1
    with psycopg.connect(url, autocommit=True, prepare_threshold=0, row_factory=dict_row) as conn:
        version = _migration(conn)
        if create and version is None:
            PostgresSaver(conn).setup()
            version = _migration(conn)
        if version != known:
            found = "no PostgresSaver tables" if version is None else f"schema version {version}"
            raise BadSource(f"PostgreSQL database: {found}; this importer reads version {known}")

        def threads() -> list[str]:
            rows = conn.execute("SELECT DISTINCT thread_id FROM checkpoints ORDER BY thread_id")
            return [str(r["thread_id"]) for r in rows.fetchall()]

        def task_paths(thread_id: str, ns: str, cid: str) -> dict[str, str]:
            rows = conn.execute(
                "SELECT DISTINCT task_id, task_path FROM checkpoint_writes "
                "WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s",
                (thread_id, ns, cid),
            )
            return {str(r["task_id"]): str(r["task_path"]) for r in rows.fetchall()}

        yield GraphDatabase(PostgresSaver(conn), threads, task_paths)


def _migration(conn: Any) -> int | None:
    """The newest PostgresSaver migration applied, None without its table."""
    found = conn.execute("SELECT to_regclass('checkpoint_migrations') AS t").fetchone()
    if found is None or found["t"] is None:
        return None
    row = conn.execute("SELECT max(v) AS v FROM checkpoint_migrations").fetchone()
    return None if row is None or row["v"] is None else int(row["v"])
