"""The Celery configuration both sides share: broker, serialization, delivery guarantees, queues.

The orchestrator sends tasks by name and the workers run them; both build their Celery app with
`flaketriage.work.celery.build_celery`, which applies `celery_config`, so they agree on the broker,
the JSON serializer and the queues without importing each other. With no broker configured the
broker is a SQLite file beside the store, read through kombu's SQLAlchemy transport
(`LocalTransport` polls it ten times a second): durable across restarts, for one machine. Redis
(``redis://``) is the broker for more than one.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

from flaketriage.work.messages import Queue

DEFAULT_VISIBILITY_TIMEOUT_S = 3600.0
"""Redis hands a task that was taken but never acknowledged (its worker died) to another worker
after this long. A long task handed out twice still runs once: its step is held by a lease."""


def celery_config(
    broker_url: str, *, visibility_timeout_s: float = DEFAULT_VISIBILITY_TIMEOUT_S
) -> dict[str, Any]:
    """Settings for ``Celery.conf``: the same on the sending and the working side."""
    config: dict[str, Any] = {
        "broker_url": broker_url,
        "broker_connection_retry_on_startup": True,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_backend": None,
        "task_ignore_result": True,
        # At-least-once: a task is acknowledged when it finished, and a worker that died under it
        # gives it back; tasks are idempotent, so a second delivery does no work twice.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "task_default_queue": Queue.CPU.value,
        "task_create_missing_queues": True,
        "worker_hijack_root_logger": False,
        "worker_send_task_events": False,
        "enable_utc": True,
    }
    if broker_url.startswith(("redis://", "rediss://")):
        config["broker_transport_options"] = {
            "visibility_timeout": visibility_timeout_s,
            "unacked_restore_interval": 2,
            "unacked_restore_throttle": 1,
            "socket_connect_timeout": 5,
            "socket_timeout": 10,
        }
        if broker_url.startswith("redis://"):  # TLS (rediss) stays with kombu's as it is
            config["broker_transport"] = "flaketriage.work.broker:RedisTransport"
    elif broker_url.startswith("sqla+"):
        config["broker_url"] = broker_url[len("sqla+") :]
        config["broker_transport"] = "flaketriage.work.broker:LocalTransport"
    return config


BROKER_MARK = "flaketriage:broker-mark"
"""A key the sweep keeps in a Redis broker: missing, the broker lost its data (it restarted empty)."""


def broker_was_emptied(connection: Any) -> bool:
    """Whether the broker behind a kombu `connection` lost its messages since the last call.

    Redis keeps nothing on disk here: a restart empties its queues. The first call on a broker sets
    a mark; a later call that finds no mark knows the data, and the messages with it, are gone.
    (The very first call on a new broker reads as emptied too: its sweep sends queued work once more,
    which runs once.) Other brokers keep their messages: False.
    """
    if getattr(connection.transport, "driver_type", None) != "redis":
        return False
    return bool(connection.default_channel.client.set(BROKER_MARK, "1", nx=True))


@functools.cache
def local_transport() -> type:
    """kombu's SQLAlchemy transport polling ten times a second instead of once; a SQLite database it
    creates is its owner's alone, like the store it sits beside (messages name bundles and stores)."""
    from kombu.transport.sqlalchemy import Channel, Transport

    from flaketriage.records.database import create_sqlite_file

    class _Channel(Channel):
        def _engine_from_config(self) -> Any:
            create_sqlite_file(self.connection.client.hostname)
            return super()._engine_from_config()  # type: ignore[no-untyped-call]

    class _LocalTransport(Transport):
        Channel = _Channel
        polling_interval = 0.1

    return _LocalTransport


@functools.cache
def redis_transport() -> type:
    """kombu's Redis transport, its channels sending every command through one kept client.

    kombu's channel builds a new ``redis.Redis`` (over the same connection pool) for each command it
    sends, which costs a publish a quarter of its time: the receiver publishes for every batch of
    deliveries. A client holds no state of its own but its pool, so one serves all commands, from
    any thread; a channel whose pool was replaced (after a lost connection) gets a new one."""
    from kombu.transport.redis import Channel, Transport

    class _Channel(Channel):
        _kept: Any = None

        @contextlib.contextmanager
        def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
            if client:
                yield client
                return
            kept = self._kept
            if kept is None or kept.connection_pool is not self.pool:
                kept = self._kept = self._create_client()  # type: ignore[no-untyped-call]
            yield kept

    class _RedisTransport(Transport):
        Channel = _Channel

    return _RedisTransport


def __getattr__(name: str) -> Any:
    # kombu resolves "flaketriage.work.broker:LocalTransport" by attribute: built on first use so that
    # importing this module never imports kombu.
    if name == "LocalTransport":
        return local_transport()
    if name == "RedisTransport":
        return redis_transport()
    raise AttributeError(name)
