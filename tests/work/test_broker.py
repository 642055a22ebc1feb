"""`celery_config`'s Redis transport: one kept client per channel pool, against a real Redis,
through a real Celery app; a broker restart loses the client's connection and the next publish
works on a new one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery

from flaketriage.work.broker import BROKER_MARK, broker_was_emptied, celery_config, redis_transport
from tests.conftest import Redis


def test_redis_urls_use_the_kept_client_transport_and_tls_keeps_kombus() -> None:
    assert celery_config("redis://h:6379/0")["broker_transport"] == "flaketriage.work.broker:RedisTransport"
    assert "broker_transport" not in celery_config("rediss://h:6380/0")
    assert (
        celery_config("sqla+sqlite:///q.db")["broker_transport"] == "flaketriage.work.broker:LocalTransport"
    )


@pytest.fixture
def app(redis: Redis) -> Iterator[Celery]:
    app = Celery("ft-broker-test", set_as_current=False)
    app.conf.update(celery_config(redis.url))
    yield app
    app.close()


def _queued(redis: Redis, queue: str) -> int:
    import redis as redis_py

    with redis_py.Redis.from_url(redis.url) as client:
        return int(client.llen(queue))


def test_a_channel_sends_every_command_through_one_client_until_its_pool_is_replaced(app: Celery) -> None:
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        assert isinstance(conn.transport, redis_transport())
        with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
            assert first is second
            assert first.ping()
        given = object()
        with channel.conn_or_acquire(given) as client:
            assert client is given  # a caller's own client (a pipeline) is used as it is
        channel._pool = None  # what kombu does when it lost its connections
        with channel.conn_or_acquire() as third:
            assert third is not first and third.connection_pool is channel.pool
            assert third.ping()


def test_publishing_works_across_a_broker_restart(app: Celery, redis: Redis) -> None:
    queue = "ft-broker-restart"
    with app.producer_or_acquire() as producer:
        app.send_task("t", args=[1], queue=queue, producer=producer)
    assert _queued(redis, queue) == 1
    redis.restart()  # keeps nothing on disk: the message is gone, the kept client's socket too
    assert _queued(redis, queue) == 0
    with app.producer_or_acquire() as producer:
        app.send_task("t", args=[2], queue=queue, producer=producer, retry=True)
    assert _queued(redis, queue) == 1


def test_the_sweep_knows_a_redis_broker_restarted_empty(app: Celery, redis: Redis, tmp_path: Path) -> None:
    import redis as redis_py

    with redis_py.Redis.from_url(redis.url) as client:
        client.delete(BROKER_MARK)  # as on a broker never swept before
    with app.connection_for_write() as conn:
        assert broker_was_emptied(conn)  # first sweep on this broker: it sets the mark
        assert not broker_was_emptied(conn)
        assert not broker_was_emptied(conn)
    redis.restart()  # it keeps nothing on disk: the mark and every queued message are gone
    with app.connection_for_write() as conn:
        assert broker_was_emptied(conn)
        assert not broker_was_emptied(conn)
    # A local broker keeps its messages in its database: never emptied.
    local = Celery("ft-broker-local", set_as_current=False)
    local.conf.update(celery_config(f"sqla+sqlite:///{tmp_path / 'q.db'}"))
    try:
        with local.connection_for_write() as conn:
            assert not broker_was_emptied(conn)
    finally:
        local.close()
