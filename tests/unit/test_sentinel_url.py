"""Sentinel store URLs (issue 37): `redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER[/DB]` parses into the
sentinels, the master's name, the database and what each write waits for; a wrong one is a configuration error
naming `store` and saying what is wrong, never with the password in it."""

from __future__ import annotations

import pytest

from slicex.config import ConfigError, parse_config
from slicex.errors import Busy, Unavailable
from slicex.store import is_shared, open_store
from slicex.store.guard import DEPLOYMENT_TABLE, RECORD_KEY, GuardedStore
from slicex.store.redis_store import redact
from slicex.store.sqlite_store import SqliteStore
from slicex.store.urls import DEFAULT_SENTINEL_PORT, SentinelUrl, hide_password, parse_sentinel_url


def test_three_sentinels_a_master_and_a_database():
    url = parse_sentinel_url("redis+sentinel://10.0.0.1:26379,10.0.0.2:26380,[fd00::3]:26381/slicex/2")
    assert url == SentinelUrl((("10.0.0.1", 26379), ("10.0.0.2", 26380), ("fd00::3", 26381)), "slicex", 2)
    assert url.replicas == 1 and url.wait_ms == 1000  # a write waits for one replica by default


def test_the_database_defaults_to_0_a_bare_host_to_the_sentinel_port_and_options_are_read():
    url = parse_sentinel_url("redis+sentinel://:s3cret@sentinel.example/mymaster/?replicas=2&wait_ms=250")
    assert url.sentinels == (("sentinel.example", DEFAULT_SENTINEL_PORT),)
    assert (url.master, url.db, url.password, url.replicas, url.wait_ms) == ("mymaster", 0, "s3cret", 2, 250)
    assert "s3cret" not in url.shown() and "s3cret" not in redact("redis+sentinel://:s3cret@h:1/m")


@pytest.mark.parametrize(("url", "says"), [
    ("redis+sentinel:///slicex/0", "no sentinel"),
    ("redis+sentinel://h:26379", "no master name"),
    ("redis+sentinel://h:26379/", "no master name"),
    ("redis+sentinel://h:26379//0", "no master name"),
    ("redis+sentinel://h:26379/slicex/zero", "database 'zero'"),
    ("redis+sentinel://h:26379/slicex/0/extra", "too many path parts"),
    ("redis+sentinel://h:port/slicex", "port must be a number"),
    ("redis+sentinel://h:70000/slicex", "port must be a number"),
    ("redis+sentinel://h:1,,h:2/slicex", "has no host"),
    ("redis+sentinel://h:1,h:1/slicex", "named twice"),
    ("redis+sentinel://fd00::1:26379/slicex", "[ADDRESS]:PORT"),
    ("redis+sentinel://h:1/slicex?replicas=-1", "replicas"),
    ("redis+sentinel://h:1/slicex?wait_ms=0", "wait_ms"),
    ("redis+sentinel://h:1/slicex?acks=1", "unknown option 'acks'"),
])
def test_a_wrong_url_says_what_is_wrong(url: str, says: str):
    with pytest.raises(ValueError) as caught:
        parse_sentinel_url(url)
    assert says in str(caught.value)


def test_slicex_yaml_with_a_wrong_sentinel_url_is_a_config_error_naming_store_without_the_password():
    with pytest.raises(ConfigError) as caught:
        parse_config({"store": "redis+sentinel://:hunter2@h:26379"})
    assert "'store'" in caught.value.message and "no master name" in caught.value.message
    assert "hunter2" not in caught.value.message
    assert parse_config({"store": "redis+sentinel://h:1,h:2/slicex/0"}).store == "redis+sentinel://h:1,h:2/slicex/0"
    assert parse_config({"store": "redis://h:6379/0"}).store == "redis://h:6379/0"  # plain Redis: unchanged


def test_open_store_refuses_a_wrong_sentinel_url_before_connecting_and_knows_it_is_shared():
    from slicex.errors import DbError

    with pytest.raises(DbError, match="no master name"):
        open_store("redis+sentinel://127.0.0.1:1")
    assert is_shared("redis+sentinel://h:1/m") and is_shared("redis://h/0") and not is_shared("sqlite:///x.db")
    assert hide_password("redis+sentinel://u:pw@h:1/m") == "redis+sentinel://u:***@h:1/m"


class _FailingOver(SqliteStore):
    """A store whose primary is away (what the Redis store answers while the sentinels fail it over)."""

    away = False

    def get(self, table, key):
        if self.away:
            raise Busy("the store's primary is failing over")
        return super().get(table, key)


def test_the_guard_refuses_writes_as_busy_while_the_store_fails_over_then_serves_again():
    inner = _FailingOver(":memory:")
    inner.put(DEPLOYMENT_TABLE, RECORD_KEY, {"id": "dep-1", "home": "/h"})
    guard = GuardedStore(inner, "dep-1", "redis+sentinel://h:1/m/0")
    inner.away = True
    guard.check("am:x", report=False)
    with pytest.raises(Busy, match="failing over"):
        guard.put("t", "k", {"v": 1})
    inner.away = False
    assert guard.check("am:x", report=False) == {"store": "ok"}
    guard.put("t", "k", {"v": 1})
    inner.delete(DEPLOYMENT_TABLE, RECORD_KEY)  # a store that lost the record is still UNAVAILABLE, not BUSY
    guard.check("am:x", report=False)
    with pytest.raises(Unavailable) as lost:
        guard.put("t", "k", {"v": 2})
    assert not isinstance(lost.value, Busy)


@pytest.mark.parametrize("said", ["NOREPLICAS Not enough good replicas to write.", "READONLY You can't write"])
def test_a_refusal_of_a_primary_changing_role_is_busy_even_inside_a_pipeline(said: str):
    import redis

    from slicex.store.redis_store import redis_call

    for text in (said, f"Command # 1 (EVALSHA abc 3 k) of pipeline caused error: {said}"):
        def refused(text=text):
            raise redis.exceptions.ResponseError(text)
        with pytest.raises(Busy, match=said.split()[0]):
            redis_call("redis+sentinel://h:1/m/0", refused, sentinel=True)


def test_a_fenced_write_is_busy_whether_alone_or_in_a_pipeline():
    import redis

    from slicex.store.redis_store import Fenced, redis_call

    for text in ("FENCED the lease was taken over", "Command # 1 (EVALSHA abc) of pipeline caused error: FENCED x"):
        def refused(text=text):
            raise redis.exceptions.ResponseError(text)
        with pytest.raises(Fenced):
            redis_call("redis://h:1/0", refused)
