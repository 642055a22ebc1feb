"""The Celery app both sides build: `build_celery` is the one place a Celery app is made.

The receiver's app only sends (by task name); the workers' app (`flaketriage.workers.celery_app`)
adds its tasks, their routes and the beat schedule. Both start here, from the settings, with the
shared configuration (`celery_config`: broker, serialization, delivery guarantees, queues,
transport), so they cannot drift apart. Celery is imported when an app is built, not with this
module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flaketriage.settings import Settings
from flaketriage.work.broker import celery_config

if TYPE_CHECKING:
    from celery import Celery


def build_celery(settings: Settings) -> Celery:
    """A Celery app with the shared configuration of `settings`' broker, and no tasks."""
    from celery import Celery

    app = Celery("flaketriage", set_as_current=False)
    app.conf.update(
        celery_config(
            settings.resolved_broker_url(), visibility_timeout_s=settings.broker_visibility_timeout_s
        )
    )
    return app
