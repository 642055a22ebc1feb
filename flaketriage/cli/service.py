"""``flaketriage serve``, ``flaketriage worker`` and ``flaketriage beat``: the service's processes."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from flaketriage.cli.console import StoreOption, err, labelled, settings_for
from flaketriage.dependencies import require
from flaketriage.errors import ConfigError
from flaketriage.settings import Settings
from flaketriage.work.messages import Queue


def _server_parts() -> None:
    for module in ("fastapi", "uvicorn", "sqlalchemy", "alembic", "celery", "prometheus_client"):
        require(module, "server", "the flaketriage service")


def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8080,
    embedded: Annotated[
        bool,
        typer.Option(
            help="Also run a worker and the beat scheduler here (one machine, nothing else to start)."
        ),
    ] = False,
    concurrency: Annotated[int, typer.Option(min=1, help="Embedded worker processes.")] = 2,
    store: StoreOption = None,
) -> None:
    """Run the receiver: POST /v1/events, /webhooks/github, /webhooks/sentry; GET /v1/cases, ..."""
    _server_parts()
    from flaketriage.orchestrator import server
    from flaketriage.orchestrator.app import create_app
    from flaketriage.orchestrator.service import build_service

    settings = settings_for(store)
    service = build_service(settings, _waiting)
    children: list[subprocess.Popen[bytes]] = []
    if embedded:
        env = {**os.environ, "FLAKETRIAGE_STORE": settings.store}
        base = [sys.executable, "-m", "flaketriage"]
        children.append(subprocess.Popen([*base, "worker", "--concurrency", str(concurrency)], env=env))
        children.append(subprocess.Popen([*base, "beat"], env=env))
        err.print(
            labelled(
                "flaketriage:",
                "bold",
                f"embedded: a worker ({concurrency} processes) and the beat scheduler on "
                f"{settings.resolved_broker_url()}",
            )
        )
    try:
        server.run(create_app(service), host=host, port=port, header_timeout_s=settings.header_timeout_s)
    finally:
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
        service.close()


def worker_queues(requested: str | None, gpus: list[str]) -> list[str]:
    """The queues to consume: `requested` (comma-separated) or cpu and report, plus gpu on a GPU
    runner. A runner without a GPU never takes gpu work."""
    if requested:
        queues = [q.strip() for q in requested.split(",") if q.strip()]
        known = {q.value for q in Queue}
        unknown = [q for q in queues if q not in known]
        if unknown:
            raise ConfigError(f"--queues {','.join(unknown)}: choose among {', '.join(sorted(known))}")
    else:
        queues = [Queue.CPU.value, Queue.REPORT.value]
        if gpus:
            queues.append(Queue.GPU.value)
    if Queue.GPU.value in queues and not gpus:
        err.print(labelled("flaketriage: warning:", "yellow", "no GPU on this runner; not taking gpu work"))
        queues.remove(Queue.GPU.value)
    if not queues:
        raise ConfigError("no queue left to consume: pass --queues cpu,report")
    return queues


def worker(
    queues: Annotated[
        str | None,
        typer.Option(help="Comma-separated: cpu, gpu, report (default: cpu,report, and gpu with GPUs)."),
    ] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Worker processes.")] = 2,
    store: StoreOption = None,
) -> None:
    """Run a Celery worker: replays, minimization, reports."""
    _server_parts()
    from flaketriage.records import Database
    from flaketriage.workers.celery_app import create_celery
    from flaketriage.workers.gpus import gpu_names

    settings = settings_for(store)
    Database(settings.resolved_database_url()).upgrade_when_up(settings.database_wait_s, _waiting)
    gpus = gpu_names()
    chosen = worker_queues(queues, gpus)
    err.print(
        labelled(
            "flaketriage:",
            "bold",
            f"worker on {', '.join(chosen)}; GPUs: {', '.join(gpus) if gpus else 'none'}",
        )
    )
    app = create_celery(settings)
    app.worker_main(
        [
            "worker",
            "--queues",
            ",".join(chosen),
            "--concurrency",
            str(concurrency),
            "--loglevel",
            "INFO",
            "--hostname",
            f"flaketriage-{os.getpid()}@{socket.gethostname()}",
            "--without-mingle",
            "--without-gossip",
        ]
    )


def beat(
    store: StoreOption = None,
    schedule_file: Annotated[
        Path | None,
        typer.Option(
            help="Where beat keeps its last run times (default: <store>/beat-schedule; for an s3:// "
            "store, a file of that store's in the temporary directory)."
        ),
    ] = None,
) -> None:
    """Run the scheduler: sweeps of lost work, isolation reruns, telemetry runs, store GC."""
    _server_parts()
    from flaketriage.workers.celery_app import create_celery

    settings = settings_for(store)
    app = create_celery(settings)
    path = schedule_file or _beside_store(settings, "beat-schedule")
    # Celery's schedule is a shelve whose files take the umask's mode; this process writes nothing
    # else, so its umask makes them the store's: its owner's, or its group's too when shared.
    os.umask(0o007 if settings.store_shared else 0o077)
    app.Beat(schedule=str(path), loglevel="INFO").run()


def _waiting(text: str) -> None:
    err.print(labelled("flaketriage: warning:", "yellow", text))


def _beside_store(settings: Settings, name: str) -> Path:
    from flaketriage.files.modes import FileModes

    root = settings.local_store()
    if root is None:
        # A store that is no directory (s3://): one file per store and user, so two beats of other
        # stores on one machine never share a schedule.
        key = hashlib.sha256(f"{os.getuid()}|{settings.store}".encode()).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / f"flaketriage-{name}-{key}"
    FileModes.of(settings.store_shared).make_dirs(root)  # beat may be the first to make the store
    return root / name
