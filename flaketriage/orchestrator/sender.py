"""How the receiver hands work to the broker: `receiver_sender`, over the shared Celery app."""

from __future__ import annotations

from typing import Protocol

from flaketriage.settings import Settings
from flaketriage.work.celery import build_celery
from flaketriage.work.dispatch import CelerySender, TaskSender
from flaketriage.work.messages import Queue


class PingingSender(TaskSender, Protocol):
    def ping(self) -> None: ...


def receiver_sender(settings: Settings) -> CelerySender:
    """How the receiver hands work to the broker: the work of a batch of deliveries goes as one
    message, which a worker consuming the report queue (the light one, which the sweep runs on too)
    sends on task by task. Its app only sends (by task name)."""
    return CelerySender(build_celery(settings), fan_out_queue=Queue.REPORT.value)
