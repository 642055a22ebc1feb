"""`Service`: the receiver's parts, built once from the settings and handed to `create_app`.

Nothing is built at import: `build_service` opens the database (upgrading its schema), the Celery
sending side and the intake, so tests build theirs with their own database and sender.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from flaketriage.orchestrator.intake import Intake, IntakeResult, Sighting, build_intake
from flaketriage.orchestrator.intake_process import IntakeProcess
from flaketriage.orchestrator.intake_queue import IntakeQueue
from flaketriage.orchestrator.metrics import ServiceMetrics
from flaketriage.orchestrator.sender import PingingSender, receiver_sender
from flaketriage.orchestrator.sightings import StorePolicy
from flaketriage.records import Database
from flaketriage.records.history import TestIds
from flaketriage.settings import Settings
from flaketriage.work.dispatch import Dispatcher


class DeliveryRecorder(Protocol):
    """What records the receiver's deliveries, on its event loop (`IntakeQueue`, `IntakeProcess`)."""

    async def record(
        self, source: str, delivery_id: str, kind: str, sightings: Sequence[Sighting]
    ) -> IntakeResult: ...

    def close(self) -> None: ...


@dataclass
class Service:
    settings: Settings
    database: Database
    sender: PingingSender
    dispatcher: Dispatcher
    intake: Intake
    policy: StorePolicy
    metrics: ServiceMetrics
    intake_queue: DeliveryRecorder
    test_ids: TestIds = field(default_factory=TestIds)
    """The test ids results uploads have committed (`flaketriage.records.history.TestIds`)."""

    def close(self) -> None:
        self.intake_queue.close()
        self.database.dispose()

    @classmethod
    def assemble(
        cls,
        settings: Settings,
        database: Database,
        sender: PingingSender,
        intake_queue: DeliveryRecorder | None = None,
    ) -> Service:
        """The service's parts over `database` and `sender`; deliveries are recorded by
        `intake_queue`, by default writer threads of this process."""
        intake = build_intake(settings, database, sender)
        return cls(
            settings=settings,
            database=database,
            sender=sender,
            dispatcher=intake.dispatcher,
            intake=intake,
            policy=StorePolicy(
                settings.resolved_allowed_stores(),
                max_bundles=settings.max_bundles_per_delivery,
                settings=settings,
            ),
            metrics=ServiceMetrics(database),
            intake_queue=IntakeQueue(intake) if intake_queue is None else intake_queue,
        )


def build_service(settings: Settings, say: Callable[[str], None] = print) -> Service:
    """The service of `settings`, once its database answers (`say` is told while it waits)."""
    database = Database(settings.resolved_database_url())
    database.upgrade_when_up(settings.database_wait_s, say)
    recorder: DeliveryRecorder | None = None
    if database.engine.dialect.name == "postgresql":
        # A database that takes concurrent writers: deliveries are recorded in a process of their
        # own, beside the event loop's (`IntakeProcess`).
        recorder = IntakeProcess(settings)
        recorder.start()  # before the first request: an interpreter takes a second to start
    return Service.assemble(settings, database, receiver_sender(settings), recorder)
