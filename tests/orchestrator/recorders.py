"""Deliveries for the recorders' tests (`IntakeQueue`, `IntakeProcess`): numbered sightings, each
of a failure of its own, sent all at once, and the rows they leave."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import func, select

from flaketriage.orchestrator.intake import IntakeResult, Sighting
from flaketriage.orchestrator.service import DeliveryRecorder
from flaketriage.records import Database


def numbered_sighting(n: int, **fields: Any) -> Sighting:
    """Sighting `n` of a failure of its own (its fingerprint and bundle); `fields` override."""
    values: dict[str, Any] = {
        "fingerprint": f"failure-{n:04d}",
        "kind": "bundle",
        "title": f"failure {n}",
        "bundle_id": f"{n:064x}",
        "store_url": "file:///store",
    }
    return Sighting(**{**values, **fields})


def count_rows(database: Database, model: type) -> int:
    with database.session() as session:
        return int(session.scalar(select(func.count()).select_from(model)) or 0)


def record_each_twice_at_once(recorder: DeliveryRecorder, deliveries: int) -> list[IntakeResult]:
    """Deliveries ``d-0`` ... each sent twice, all at once on one loop (the second of each is a
    duplicate, whichever batch it lands in); the recorder is closed after."""

    async def all_at_once() -> list[IntakeResult]:
        numbers = [n % deliveries for n in range(2 * deliveries)]
        calls = [
            recorder.record("events", f"d-{n}", "failure.captured", [numbered_sighting(n)]) for n in numbers
        ]
        return await asyncio.gather(*calls)

    try:
        return asyncio.run(all_at_once())
    finally:
        recorder.close()
