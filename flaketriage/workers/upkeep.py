"""The service's scheduled upkeep (celery beat): isolation reruns of quarantined failures, telemetry
runs (`flaketriage.workers.telemetry`, on a GPU runner for a failure captured on GPUs) of failures
that did not reproduce, and garbage collection of the store.

Each schedules work through the same `Dispatcher` as everything else, keyed by period, so a beat
that fires twice (or two beats) schedules each rerun once.
"""

from __future__ import annotations

import time
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from flaketriage.bundle.io import load_manifest
from flaketriage.errors import FlaketriageError
from flaketriage.quarantine import QuarantineEntry
from flaketriage.records import Case, CaseStatus, Occurrence, QuarantineRow, Work
from flaketriage.records.failure_days import roll_up_failures
from flaketriage.records.history import roll_up
from flaketriage.records.models import utc_now
from flaketriage.store import open_store
from flaketriage.store.gc import collect
from flaketriage.store.retention import retained_bundles
from flaketriage.work.dispatch import Outgoing
from flaketriage.work.messages import Queue, Step
from flaketriage.workers.runtime import WorkerEnv, replay_queue
from flaketriage.workers.verdict import Verdict


class Upkeep:
    def __init__(self, env: WorkerEnv) -> None:
        self.env = env
        self.db = env.database

    def schedule_reruns(self) -> int:
        """One isolation rerun per quarantined failure per `rerun_every_s` period (an entry made by
        hand has no bundle to rerun)."""
        period = int(time.time() // self.env.settings.rerun_every_s)
        outgoing: list[Outgoing | None] = []
        with self.db.session() as session:
            for row in session.scalars(select(QuarantineRow)).all():
                entry = QuarantineEntry.model_validate(row.entry)
                if entry.by_hand:
                    continue  # no bundle to rerun: a person lifts it, or its expiry ends it
                options: dict[str, object] = {"fingerprint": row.fingerprint}
                if entry.evidence.verdict == Verdict.ORDER_DEPENDENT:
                    order = self._order_of(session, row.case_id)
                    if order is None:
                        continue  # no triage says which order fails: a rerun alone could lift it wrongly
                    options.update(order)
                store_url = self._store_of(session, entry.bundle_id)
                _, sent = self.env.dispatcher.request(
                    session,
                    key=f"rerun:{row.fingerprint}:{period}",
                    step=Step.RERUN,
                    queue=Queue.CPU,
                    case_id=row.case_id,
                    bundle_id=entry.bundle_id,
                    store_url=store_url,
                    options=options,
                )
                outgoing.append(sent)
        self.env.dispatcher.send(outgoing)
        return sum(1 for o in outgoing if o is not None)

    @staticmethod
    def _order_of(session: Session, case_id: int | None) -> dict[str, object] | None:
        """How the rerun of an order-dependent test asks whether it is fixed, from its latest
        triage's search: a victim (or a test that fails run twice) is replayed after its polluters,
        as it failed, since alone it passes fixed or not; a brittle test is replayed alone, as it
        failed (its state-setters are what it passes after). None when no triage recorded one."""
        if case_id is None:
            return None
        works = session.scalars(
            select(Work)
            .where(Work.case_id == case_id, Work.step == Step.TRIAGE.value, Work.result.is_not(None))
            .order_by(Work.id.desc())
            .limit(5)
        ).all()
        for work in works:
            search = (work.result or {}).get("polluter_search")
            if isinstance(search, dict) and search.get("polluters"):
                if search.get("kind") == "setters":
                    return {"order": "alone"}
                return {"order": "after", "polluters": [str(t) for t in search["polluters"]]}
        return None

    def schedule_telemetry(self) -> int:
        """One telemetry run per `not_reproduced` case and triage generation."""
        outgoing: list[Outgoing | None] = []
        with self.db.session() as session:
            cases = session.scalars(
                select(Case).where(
                    Case.verdict == Verdict.NOT_REPRODUCED.value,
                    Case.status.in_([CaseStatus.DECIDED.value, CaseStatus.REPORTED.value]),
                )
            ).all()
            for case in cases:
                last = session.scalars(
                    select(Work)
                    .where(
                        Work.case_id == case.id, Work.step == Step.TRIAGE.value, Work.bundle_id.is_not(None)
                    )
                    .order_by(Work.id.desc())
                    .limit(1)
                ).first()
                if last is None:
                    continue
                _, sent = self.env.dispatcher.request(
                    session,
                    key=f"telemetry:{case.id}:g{case.generation}",
                    step=Step.TELEMETRY,
                    queue=self._queue_of(str(last.store_url), str(last.bundle_id)),
                    case_id=case.id,
                    bundle_id=last.bundle_id,
                    store_url=last.store_url,
                )
                outgoing.append(sent)
        self.env.dispatcher.send(outgoing)
        return sum(1 for o in outgoing if o is not None)

    def collect_garbage(self) -> dict[str, int]:
        """Collect the default store: bundles an open case, a quarantine row or the quarantine file
        references are kept whatever their age (`flaketriage.store.retention`, as ``flaketriage gc``)."""
        settings = self.env.settings
        report = collect(
            open_store(settings.store, settings=settings),
            keep=retained_bundles(settings, self.db),
            older_than=timedelta(days=settings.gc_older_than_days),
            apply=True,
        )
        return {"bundles": len(report.bundles), "objects": len(report.objects)}

    def roll_up_results(self) -> int:
        """Fold CI results older than ``FLAKETRIAGE_RESULTS_KEEP_DAYS`` into daily totals per test, a
        batch per transaction (`flaketriage.records.history.roll_up`); how many were rolled up."""
        total = 0
        while True:
            with self.db.session() as session:
                done = roll_up(session, keep_days=self.env.settings.results_keep_days)
            total += done
            if done == 0:
                return total

    def roll_up_failures(self) -> int:
        """Count the failures of the last complete days by verdict again, for the dashboard's
        overview (`flaketriage.records.failure_days`); the rows written."""
        with self.db.session() as session:
            return roll_up_failures(session, now=utc_now())

    def _queue_of(self, store_url: str, bundle_id: str) -> Queue | str:
        """Where a bundle's telemetry runs: on a GPU runner when it was captured on one (its GPU
        samples are the point), else on any."""
        try:
            return replay_queue(load_manifest(self.env.store(store_url), bundle_id))
        except FlaketriageError:
            return Queue.CPU  # the run itself will say what is wrong with the bundle

    def _store_of(self, session: Session, bundle_id: str) -> str:
        found = session.scalars(
            select(Occurrence.store_url).where(
                Occurrence.bundle_id == bundle_id, Occurrence.store_url.is_not(None)
            )
        ).first()
        return found or self.env.settings.resolved_allowed_stores()[0]
