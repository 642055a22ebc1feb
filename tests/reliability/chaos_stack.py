"""The service's parts for the chaos harness (`tests.reliability.chaos_harness`), each a process of
its own that a fault can stop: the e2e `Stack` (receiver, workers, beat) on a private ``redis-server``,
``moto_server`` holding the bundles (an ``s3://`` store), and a private PostgreSQL cluster (``initdb``
into a temporary directory; as the ``postgres`` user when this is root, which PostgreSQL refuses)
behind the e2e `TcpProxy`: the machine's server is shared, and is never restarted.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx

from tests.conftest import Redis as RedisServer
from tests.conftest import S3Server, wait_for
from tests.e2e.service.conftest import API_TOKEN, WEBHOOK_SECRET, Stack, TcpProxy, free_port

PG_BIN = Path(
    os.environ.get("FLAKETRIAGE_PG_BIN")
    or max(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name), default="")
    or "/usr/lib/postgresql/15/bin"
)
"""PostgreSQL's programs: ``FLAKETRIAGE_PG_BIN``, else Debian's newest."""
BUCKET = "flaketriage-chaos"


class PrivatePostgres:
    """A PostgreSQL cluster of its own, so that it can be restarted without touching the machine's."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.data = root / "data"

    def _pg(self, *args: str) -> None:
        as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []  # root may not run it
        subprocess.run([*as_postgres, *args], check=True, capture_output=True, timeout=120)

    def init(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
        self._pg(str(PG_BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        self.start()

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._pg(
            str(PG_BIN / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.root / "log"),
            "-o",
            options,
            "-w",
            "start",
        )

    def stop(self, mode: str = "immediate") -> None:
        self._pg(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"


@contextlib.contextmanager
def s3_server(root: Path) -> Iterator[S3Server]:
    """``moto_server`` on a free port with the bucket `BUCKET`."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "FLAKETRIAGE_"))}
    with (root / "moto.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    server = S3Server(f"http://127.0.0.1:{port}")
    try:
        wait_for(
            lambda: httpx.get(server.endpoint + "/moto-api/", timeout=2, trust_env=False), 60, "moto_server"
        )
        server.client().create_bucket(Bucket=BUCKET)
        yield server
    finally:
        proc.terminate()
        proc.wait(timeout=20)


class ChaosStack(Stack):
    """The e2e `Stack`, its beat keeping its schedule in the stack's directory: with an ``s3://``
    store beat's default is one file in the temporary directory, which every such beat shares."""

    def start(self) -> None:
        self.server = self._spawn("serve", "--port", str(self.port), name="server")
        wait_for(lambda: httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200, 60, "the receiver")
        for index in range(2):
            self.start_worker(index)
        self.beat = self._spawn("beat", "--schedule-file", str(self.root / "beat-schedule"), name="beat")


@contextlib.contextmanager
def chaos_stack(
    root: Path, *, workers: int, settings: dict[str, str]
) -> Iterator[tuple[Stack, PrivatePostgres, S3Server]]:
    """The service on private Redis, PostgreSQL and S3, with `workers` workers and beat, and
    `settings` (``FLAKETRIAGE_*``) on top of the stack's own."""
    pg = PrivatePostgres(Path(tempfile.mkdtemp(prefix="flaketriage-chaos-pg-")))
    redis = RedisServer(free_port())
    stack: Stack | None = None
    try:
        pg.init()
        proxy = TcpProxy(("127.0.0.1", pg.port))
        proxy.start()
        redis.start()
        with s3_server(root) as s3:
            port = free_port()
            env = {k: v for k, v in os.environ.items() if not k.startswith(("FLAKETRIAGE_", "AWS_"))}
            env.update(s3.env)
            env.update(
                FLAKETRIAGE_STORE=f"s3://{BUCKET}/chaos",
                FLAKETRIAGE_DATABASE_URL=f"postgresql://postgres@127.0.0.1:{proxy.port}/postgres",
                FLAKETRIAGE_BROKER_URL=redis.url,
                FLAKETRIAGE_WEBHOOK_SECRET=WEBHOOK_SECRET,
                FLAKETRIAGE_API_TOKEN=API_TOKEN,
                FLAKETRIAGE_NOTIFY_URL=f"http://127.0.0.1:{port}/v1/events",
                FLAKETRIAGE_ISSUES_DIR=str(root / "issues"),
                FLAKETRIAGE_OUTBOX_DIR=str(root / "outbox"),
                FLAKETRIAGE_QUARANTINE_FILE=str(root / "quarantine.json"),
                PYTHONUNBUFFERED="1",
                **settings,
            )
            (root / "project").mkdir(exist_ok=True)
            stack = ChaosStack(root=root, env=env, port=port, redis=redis, proxy=proxy)
            stack.start()
            for index in range(2, workers):
                stack.start_worker(index)
            yield stack, pg, s3
    finally:
        if stack is not None:
            stack.stop()
        redis.stop()
        with contextlib.suppress(subprocess.SubprocessError):
            pg.stop("fast")
        shutil.rmtree(pg.root, ignore_errors=True)
