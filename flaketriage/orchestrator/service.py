"""`Service`: the receiver's parts, built once from the settings and handed to `create_app`.

Nothing is built at import: `build_service` opens the database (upgrading its schema), the Celery
sending side and the intake, so tests build theirs with their own database and sender.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from flaketriage.dispatch import CelerySender, Dispatcher, TaskSender
from flaketriage.orchestrator.intake import Intake
from flaketriage.orchestrator.intake_queue import IntakeQueue
from flaketriage.orchestrator.metrics import ServiceMetrics
from flaketriage.orchestrator.sightings import StorePolicy
from flaketriage.records import Database
from flaketriage.settings import Settings
from flaketriage.work import Queue


class PingingSender(TaskSender, Protocol):
    def ping(self) -> None: ...


@dataclass
class Service:
    settings: Settings
    database: Database
    sender: PingingSender
    dispatcher: Dispatcher
    intake: Intake
    policy: StorePolicy
    metrics: ServiceMetrics
    intake_queue: IntakeQueue

    def close(self) -> None:
        self.intake_queue.close()
        self.database.dispose()

    @classmethod
    def assemble(cls, settings: Settings, database: Database, sender: PingingSender) -> Service:
        dispatcher = Dispatcher(
            database,
            sender,
            sweep_after_s=settings.sweep_after_s,
            replay_grace_s=settings.replay_timeout_s + settings.sweep_after_s,
        )
        intake = Intake(
            database,
            dispatcher,
            retriage_after_s=settings.retriage_after_h * 3600,
            storm_window_s=settings.storm_window_s,
        )
        return cls(
            settings=settings,
            database=database,
            sender=sender,
            dispatcher=dispatcher,
            intake=intake,
            policy=StorePolicy(settings.resolved_allowed_stores()),
            metrics=ServiceMetrics(database),
            intake_queue=IntakeQueue(intake),
        )


def sending_app(settings: Settings) -> Any:
    """A Celery app that only sends (by task name) with the shared configuration."""
    from celery import Celery

    from flaketriage.broker import celery_config

    app = Celery("flaketriage", set_as_current=False)
    app.conf.update(
        celery_config(
            settings.resolved_broker_url(), visibility_timeout_s=settings.broker_visibility_timeout_s
        )
    )
    return app


def build_service(settings: Settings) -> Service:
    database = Database(settings.resolved_database_url())
    database.upgrade()
    # The work of a batch of deliveries goes to the broker as one message, which a worker consuming
    # the report queue (the light one, which the sweep runs on too) sends on task by task.
    sender = CelerySender(sending_app(settings), fan_out_queue=Queue.REPORT.value)
    return Service.assemble(settings, database, sender)
