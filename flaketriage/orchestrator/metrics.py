"""Prometheus metrics of one service: events by source and outcome, counted as they arrive; queue
depth, cases by status, verdicts, durations and suspect runners read from the records at each scrape
(the database is the record, and the workers that did the work are other processes)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select

from flaketriage.errors import RecordsError
from flaketriage.records import Case, Database, ReplayRow, RunnerRow, Work, WorkStatus

DURATION_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)


class ServiceMetrics:
    """The registry `/metrics` serves, and the counters the receiver increments."""

    def __init__(self, database: Database) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.events = Counter(
            "flaketriage_events",
            "Deliveries received, by source and outcome.",
            ["source", "outcome"],
            registry=self.registry,
        )
        self.registry.register(RecordsCollector(database))


class RecordsCollector(Collector):
    """Gauges and histograms computed from the records at scrape time."""

    def __init__(self, database: Database) -> None:
        self.database = database

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("flaketriage_records_up", "1 when the database answered this scrape.")
        try:
            families = list(self._families())
        except RecordsError:
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families

    def _families(self) -> Iterator[Metric]:
        with self.database.session() as s:
            by_status = s.execute(select(Case.status, func.count()).group_by(Case.status)).all()
            by_verdict = s.execute(
                select(Case.verdict, func.count()).where(Case.verdict.is_not(None)).group_by(Case.verdict)
            ).all()
            depth = s.execute(
                select(Work.queue, Work.status, func.count())
                .where(Work.status.in_([WorkStatus.QUEUED.value, WorkStatus.RUNNING.value]))
                .group_by(Work.queue, Work.status)
            ).all()
            pending_replays = s.scalar(
                select(func.count()).select_from(ReplayRow).where(ReplayRow.outcome.is_(None))
            )
            replay_durations = s.scalars(
                select(ReplayRow.duration_s).where(ReplayRow.duration_s.is_not(None))
            ).all()
            runners = s.execute(select(RunnerRow.id, RunnerRow.suspect, RunnerRow.environment_specific)).all()
            triage_spans = s.execute(
                select(Work.started_at, Work.finished_at).where(
                    Work.step == "triage", Work.finished_at.is_not(None), Work.started_at.is_not(None)
                )
            ).all()
        cases = GaugeMetricFamily("flaketriage_cases", "Cases by status.", labels=["status"])
        for status, count in by_status:
            cases.add_metric([status], count)
        yield cases
        verdicts = GaugeMetricFamily(
            "flaketriage_verdicts", "Cases by their last verdict.", labels=["verdict"]
        )
        for verdict, count in by_verdict:
            verdicts.add_metric([str(verdict)], count)
        yield verdicts
        queue = GaugeMetricFamily(
            "flaketriage_queue_depth",
            "Work waiting or running, by queue and status.",
            labels=["queue", "status"],
        )
        for name, status, count in depth:
            queue.add_metric([name, status], count)
        queue.add_metric(["replays", "queued"], pending_replays or 0)
        yield queue
        suspect = GaugeMetricFamily(
            "flaketriage_runner_suspect",
            "1 for a runner flagged as suspect (environment-specific failures reproduce on it): drain it.",
            labels=["runner"],
        )
        counted = GaugeMetricFamily(
            "flaketriage_runner_environment_specific",
            "Environment-specific verdicts that reproduced on each runner.",
            labels=["runner"],
        )
        for runner, flagged, count in runners:
            suspect.add_metric([runner], 1 if flagged else 0)
            counted.add_metric([runner], count)
        yield suspect
        yield counted
        yield _histogram(
            "flaketriage_replay_duration_seconds",
            "Duration of each replay.",
            [float(d) for d in replay_durations if d is not None],
        )
        yield _histogram(
            "flaketriage_triage_duration_seconds",
            "From the start of a triage to its verdict.",
            [_seconds(a, b) for a, b in triage_spans if a is not None and b is not None],
        )


def _seconds(start: datetime, end: datetime) -> float:
    return max(0.0, (end - start).total_seconds())


def _histogram(name: str, doc: str, values: list[float]) -> HistogramMetricFamily:
    buckets: list[tuple[str, float]] = []
    for bound in DURATION_BUCKETS:
        buckets.append((str(bound), float(sum(1 for v in values if v <= bound))))
    buckets.append(("+Inf", float(len(values))))
    family = HistogramMetricFamily(name, doc)
    family.add_metric([], buckets, sum_value=sum(values))
    return family
