"""What one worker process works with (`WorkerEnv`), built once per process: the settings, the
records, the dispatcher, the sandbox, where reports and replies go, the machine it replays on, and
the bundles it keeps materialized between replays.
"""

from __future__ import annotations

import os
import socket
from collections import OrderedDict
from dataclasses import dataclass, field

from flaketriage.bundle.manifest import Manifest
from flaketriage.records import Database
from flaketriage.settings import Settings
from flaketriage.store import Store, open_store
from flaketriage.work.dispatch import Dispatcher
from flaketriage.work.messages import Queue
from flaketriage.workers.attribution import RunnerIdentity
from flaketriage.workers.comments import Commenter
from flaketriage.workers.replay import ReplayContext, Replayer
from flaketriage.workers.report import IssueSink
from flaketriage.workers.report.checks import CheckSink
from flaketriage.workers.sandbox import Sandbox
from flaketriage.workers.verdict import VerdictPolicy

REPLAYERS_KEPT = 4
"""Materialized bundles a worker process keeps, most recently used first: the replays of one
triage reuse one workspace instead of materializing it for every run."""


@dataclass
class WorkerEnv:
    """What one worker process works with, built once per process."""

    settings: Settings
    database: Database
    dispatcher: Dispatcher
    sandbox: Sandbox
    sink: IssueSink | None
    commenter: Commenter | None
    context: ReplayContext
    identity: RunnerIdentity = field(default_factory=RunnerIdentity.local)
    """The machine this worker replays on: its host and GPUs (`flaketriage.workers.attribution`)."""
    worker: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    """This worker process, as replay rows name it beside the runner."""
    check_sink: CheckSink | None = None
    """Where pull request check runs go (`checks`): built at first use."""
    _replayers: OrderedDict[tuple[str, str], Replayer] = field(default_factory=OrderedDict)

    def checks(self) -> CheckSink:
        """The check run sink: GitHub's Checks API when GitHub is configured, else Markdown files in
        ``FLAKETRIAGE_CHECKS_DIR``."""
        if self.check_sink is None:
            from flaketriage.workers.report.backend import open_check_sink

            self.check_sink = open_check_sink(self.settings)
        return self.check_sink

    @property
    def runner(self) -> str:
        """The runner id replays record: the host name plus a digest of its GPUs' UUIDs."""
        return self.identity.id

    def policy(self, *, max_replays: int | None = None) -> VerdictPolicy:
        s = self.settings
        return VerdictPolicy(
            min_rate=s.min_flaky_rate,
            max_rate=s.max_flaky_rate,
            alpha=s.alpha,
            max_replays=max_replays or s.max_replays,
            flaky_rate_replays=s.flaky_rate_replays,
        )

    def store(self, url: str, *, writable: bool = False) -> Store:
        return open_store(url, readonly=not writable, settings=self.settings)

    def replayer(self, store_url: str, manifest: Manifest) -> Replayer:
        """A materialized replayer of the bundle, kept for the next replay of it in this process."""
        key = (store_url, manifest.bundle_id)
        found = self._replayers.get(key)
        if found is not None:
            self._replayers.move_to_end(key)
            return found
        replayer = self.fresh_replayer(store_url, manifest)
        self._replayers[key] = replayer
        while len(self._replayers) > REPLAYERS_KEPT:
            _, old = self._replayers.popitem(last=False)
            old.close()
        return replayer

    def fresh_replayer(
        self, store_url: str, manifest: Manifest, *, latest: bool = False, timeout_s: float | None = None
    ) -> Replayer:
        """A new replayer (the caller closes it); with `latest`, at its branch's newest commit;
        `timeout_s`, when given, is every replay's limit."""
        return Replayer(
            self.store(store_url),
            manifest,
            self.sandbox,
            context=self.context,
            timeout_s=timeout_s,
            default_timeout_s=self.settings.replay_timeout_s,
            memory_mb=self.settings.replay_memory_mb,
            latest=latest,
        )

    def close(self) -> None:
        while self._replayers:
            self._replayers.popitem()[1].close()


def replay_queue(manifest: Manifest) -> Queue:
    """Where a bundle's replays run: a failure captured on a GPU needs a GPU runner."""
    return Queue.GPU if manifest.hardware.gpus else Queue.CPU
