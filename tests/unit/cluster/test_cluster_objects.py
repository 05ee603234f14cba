"""The cluster's objects in a store (an in-memory tier): leases, the members' view, the
token mirror between two primaries, and the shard map HAProxy reproduces."""

from __future__ import annotations

import time
import zlib
from dataclasses import replace

import pytest

from checkpoint_vault.cluster import (
    ClusterConfig,
    ClusterConflict,
    Member,
    Roster,
    shard_of,
    upload_shard,
)
from checkpoint_vault.cluster.lease import Lease, check, claim, newest_epoch
from checkpoint_vault.cluster.proxy import haproxy_config
from checkpoint_vault.cluster.tokens import TokenMirror
from checkpoint_vault.tiering.backends.memory import MemoryTier
from checkpoint_vault.vault.tokens import Token


def test_a_lease_is_claimed_once_per_epoch() -> None:
    tier = MemoryTier("c")
    mine = Lease(0, 0, "a", "http://a")
    claim(tier, mine)
    claim(tier, mine)  # a restart finds it its own
    with pytest.raises(ClusterConflict):
        claim(tier, Lease(0, 0, "b", "http://b"))  # a second primary configured
    claim(tier, Lease(0, 1, "b", "http://b"))  # a takeover's epoch
    assert newest_epoch(tier, 0) == 1
    with pytest.raises(ClusterConflict):
        check(tier, mine)  # the old holder learns it lost the shard
    assert newest_epoch(tier, 1) is None


def test_the_owner_is_the_live_primary_of_the_highest_epoch() -> None:
    tier = MemoryTier("c")
    at = time.time()
    for m in (
        Member("a", 0, "http://a", "fenced", 0, 1, at),
        Member("b", 0, "http://b", "primary", 1, 1, at),
        Member("c", 0, "http://c", "standby", None, 1, at),
        Member("c", 1, "http://c1", "released", 0, 1, at),
    ):
        tier.put(m.key, m.encode())
    roster = Roster(ttl=60)
    roster.refresh(tier)
    owner = roster.owner(0)
    assert owner is not None
    assert owner.node == "b"
    assert roster.owner(1) is None  # released for a move: nobody's until the standby claims
    assert [m.node for m, live, _ in roster.members() if live] == ["a", "b", "c", "c"]


class Table:
    """A token table as a primary's catalog holds it."""

    def __init__(self) -> None:
        self.tokens: dict[str, Token] = {}

    def all(self) -> list[Token]:
        return list(self.tokens.values())

    def adopt(self, token: Token) -> None:
        self.tokens[token.key_id] = token

    def forget(self, key_id: str) -> None:
        self.tokens.pop(key_id, None)


def test_tokens_reach_every_primary_and_revocations_stay() -> None:
    store = MemoryTier("c")
    a, b = Table(), Table()
    ma, mb = TokenMirror(store, a), TokenMirror(store, b)
    token = Token("producer", "k1", "h" * 64, ("write:*",), 1.0)
    a.adopt(token)
    ma.sync()
    assert mb.sync() is True
    assert b.tokens == {"k1": token}
    rotated = replace(token, expires_at=100.0)  # a rotation on b shortens the old secret
    b.adopt(rotated)
    mb.sync()
    ma.sync()
    assert a.tokens["k1"].expires_at == 100.0
    b.forget("k1")  # revoked on b
    mb.sync()
    assert ma.sync() is True
    assert a.tokens == {}
    c = Table()  # a primary that was down all along, still holding the token
    c.adopt(token)
    TokenMirror(store, c).sync()
    assert c.tokens == {}  # the tombstone wins: never published again
    ma.sync()
    assert a.tokens == {}


def test_shards_are_zlib_crc32_and_uploads_name_theirs() -> None:
    assert shard_of("langgraph/thread-1", 7) == zlib.crc32(b"langgraph/thread-1") % 7 == 5
    assert shard_of("solo", 7) == 6  # as HAProxy 2.6 computed it (tests/integration)
    assert upload_shard("3-abcdef") == 3
    assert upload_shard("abcdef") is None  # a single node's id


def test_the_proxy_config_routes_each_shard_to_its_processes() -> None:
    members = [
        {"node": "a", "shard": 0, "url": "http://10.0.0.1:8470"},
        {"node": "b", "shard": 1, "url": "http://10.0.0.2:8470"},
        {"node": "b", "shard": 0, "url": "http://10.0.0.2:8471"},
    ]
    text = haproxy_config({"shards": 2, "members": members}, "127.0.0.1:8080")
    assert "bind 127.0.0.1:8080" in text
    assert "crc32,mod(2)] if namespaced" in text
    shard0 = text.split("backend shard0")[1].split("backend shard1")[0]
    assert "server a-s0 10.0.0.1:8470 check inter" in shard0
    assert "server b-s0 10.0.0.2:8471 check inter" in shard0
    assert "server b-s1 10.0.0.2:8470 check backup" in shard0
    assert "uri /v1/cluster/primary" in shard0
    assert "frontend s3" not in text  # no process runs the S3 endpoint


def test_the_proxy_config_routes_each_bucket_to_its_shards_s3_ports() -> None:
    members = [
        {"node": "a", "shard": 0, "url": "http://10.0.0.1:8470", "s3_url": "http://10.0.0.1:9000"},
        {"node": "b", "shard": 1, "url": "http://10.0.0.2:8470", "s3_url": "http://10.0.0.2:9000"},
        {"node": "b", "shard": 0, "url": "http://10.0.0.2:8471", "s3_url": "http://s3.b:9001"},
    ]
    text = haproxy_config({"shards": 2, "members": members}, "127.0.0.1:8080", s3_bind=":9100")
    front = _section(text, "frontend s3")
    assert "bind :9100" in front
    assert "use_backend s3any if buckets" in front  # `GET /`: ListBuckets, any process
    assert "s3shard%[path,field(2,/),url_dec,crc32,mod(2)]" in front
    shard0 = _section(text, "backend s3shard0")
    assert "server a-s0 10.0.0.1:9000 check port 8470 inter" in shard0  # checked on JSON
    assert "server b-s0 s3.b:9001 check port 8471 addr 10.0.0.2 inter" in shard0
    assert "server b-s1 10.0.0.2:9000 check port 8470 backup inter" in shard0
    assert "uri /v1/cluster/primary" in shard0
    without = [{**m, "s3_url": None} for m in members]
    json_only = haproxy_config({"shards": 2, "members": without}, "127.0.0.1:8080")
    assert text.startswith(json_only)  # the JSON frontend and backends as they were


def _section(text: str, head: str) -> str:
    return text.split(head)[1].split("\n\n")[0]


def test_the_s3_url_is_the_cluster_url_on_the_s3_port() -> None:
    config = ClusterConfig(node="a", url="https://a.example:8470", store="s3://b/c")
    assert config.with_s3(9000).s3_url == "https://a.example:9000"
    assert config.with_s3(None).s3_url == ""
    given = replace(config, s3_url="https://s3.a.example")
    assert given.with_s3(9000).s3_url == "https://s3.a.example"
    with pytest.raises(ValueError, match="s3_url needs"):
        given.with_s3(None)
