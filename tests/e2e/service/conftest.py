"""The service as it runs in production, on this machine: Redis, PostgreSQL, the receiver under
uvicorn, two Celery worker processes and beat, each a real process started here.

Redis is a private ``redis-server`` on a free port (so a test may restart it and empty its queues);
PostgreSQL is the machine's server (``FLAKETRIAGE_TEST_POSTGRES``, default 127.0.0.1:5432), with a
fresh database per stack (per test module), reached through a TCP proxy the tests can cut (the
database "down").
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Redis, wait_for

PG_ADMIN = os.environ.get("FLAKETRIAGE_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")
WEBHOOK_SECRET = "e2e-webhook-secret"
GITHUB_SECRET = "e2e-github-secret"
SENTRY_SECRET = "e2e-sentry-secret"
API_TOKEN = "e2e-api-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- PostgreSQL behind a proxy we can cut ----------------------------------------------------------
class TcpProxy:
    """Forwards 127.0.0.1:port to `target` (a host and port, or a unix socket path); `cut()` drops
    every connection and refuses new ones until `restore()`."""

    def __init__(self, target: tuple[str, int] | str) -> None:
        self.target = target
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                if isinstance(self.target, str):
                    upstream = socket.socket(socket.AF_UNIX)
                    upstream.connect(self.target)
                else:
                    upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(OSError):  # shutdown wakes the thread blocked in accept()
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def restore(self) -> None:
        self.start()


@dataclass
class Postgres:
    """The machine's PostgreSQL behind a proxy the tests can cut; each stack takes a fresh database."""

    proxy: TcpProxy
    user: str
    databases: list[str] = field(default_factory=list)

    def new_database(self) -> str:
        """A URL of a database of its own, so that no module sees another's cases or quarantine."""
        import psycopg

        name = f"ft_e2e_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        self.databases.append(name)
        return f"postgresql://{self.user}@127.0.0.1:{self.proxy.port}/{name}"

    def drop_all(self) -> None:
        import psycopg

        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            for name in self.databases:
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = %s AND pid <> pg_backend_pid()",
                    (name,),
                )
                conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        self.databases.clear()


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    from psycopg.conninfo import conninfo_to_dict

    info = conninfo_to_dict(PG_ADMIN)
    host, port = str(info.get("host") or "127.0.0.1"), int(info.get("port") or 5432)
    proxy = TcpProxy(f"{host}/.s.PGSQL.{port}" if host.startswith("/") else (host, port))
    proxy.start()
    server = Postgres(proxy=proxy, user=str(info.get("user") or getpass.getuser()))
    yield server
    proxy.cut()
    server.drop_all()


# -- the stack -------------------------------------------------------------------------------------
@dataclass
class Stack:
    root: Path
    env: dict[str, str]
    port: int
    redis: Redis
    proxy: TcpProxy
    server: subprocess.Popen[bytes] | None = None
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    beat: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def store(self) -> Path:
        return self.root / "store"

    def _spawn(self, *args: str, name: str) -> subprocess.Popen[bytes]:
        with open(self.root / f"{name}.log", "ab") as log:  # the child keeps its own copy
            return subprocess.Popen(
                [sys.executable, "-m", "flaketriage", *args],
                cwd=self.root,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a worker and its pool children die together
            )

    def start(self) -> None:
        self.server = self._spawn("serve", "--port", str(self.port), name="server")
        wait_for(lambda: httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200, 60, "the receiver")
        for i in range(2):
            self.start_worker(i)
        self.beat = self._spawn("beat", name="beat")

    def start_worker(self, index: int) -> None:
        """Start worker `index` and wait until it takes work: a test that cuts the database at once
        must not meet a worker still making the schema."""
        log = self.root / f"worker{index}.log"
        readies = self._readies(log)
        proc = self._spawn("worker", "--concurrency", "1", name=f"worker{index}")
        if index < len(self.workers):
            self.workers[index] = proc
        else:
            self.workers.append(proc)
        wait_for(lambda: self._readies(log) > readies, 120, f"worker {index} to be ready")

    @staticmethod
    def _readies(log: Path) -> int:
        """How many times Celery said the worker logging to `log` is ready."""
        return log.read_text(errors="replace").count(" ready.") if log.exists() else 0

    def kill_worker(self, index: int) -> None:
        """SIGKILL the worker and its pool: what a lost machine or the OOM killer does."""
        proc = self.workers[index]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    @contextlib.contextmanager
    def workers_down(self) -> Iterator[None]:
        """No worker for the block (SIGKILLed, started again after): a task sent meanwhile is in the
        broker alone. (A paused worker would not do: Redis hands a message to a waiting consumer's
        socket at once.)"""
        for index in range(len(self.workers)):
            self.kill_worker(index)
        try:
            yield
        finally:
            for index in range(len(self.workers)):
                self.start_worker(index)

    def stop(self) -> None:
        for proc in [p for p in (self.server, self.beat, *self.workers) if p is not None]:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        for proc in [p for p in (self.server, self.beat, *self.workers) if p is not None]:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)

    # -- talking to it --------------------------------------------------------------------------
    def get(self, path: str) -> Any:
        response = httpx.get(
            f"{self.url}{path}", headers={"Authorization": f"Bearer {API_TOKEN}"}, timeout=10
        )
        response.raise_for_status()
        return response.json()

    def case_for(self, bundle: str) -> dict[str, Any] | None:
        return next((c for c in self.get("/v1/cases") if bundle in c["bundles"]), None)

    def wait_case(self, bundle: str, status: str = "reported", timeout: float = 120) -> dict[str, Any]:
        def done() -> dict[str, Any] | None:
            case = self.case_for(bundle)
            if case and case["status"] == "failed":
                raise AssertionError(f"the case failed: {case['error']}")
            return case if case and case["status"] == status else None

        try:
            return dict(wait_for(done, timeout, f"the case of {bundle[:12]} to be {status}"))
        except AssertionError:
            for log in sorted(self.root.glob("*.log")):
                sys.stderr.write(f"--- {log.name}\n{log.read_text(errors='replace')[-4000:]}\n")
            raise

    def cli(
        self, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "flaketriage", *args],
            cwd=cwd or self.root / "project",
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    def capture(self, source: str, name: str = "job.py", *args: str) -> str:
        project = self.root / "project"
        project.mkdir(exist_ok=True)
        (project / name).write_text(source)
        done = self.cli("capture", "--json", "--", sys.executable, name, *args)
        assert done.returncode != 0, done.stderr
        bundle = json.loads(done.stdout.strip().splitlines()[-1])["bundle"]
        assert bundle, done.stderr
        return str(bundle)


@pytest.fixture(scope="module")
def stack(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    redis: Redis,
    postgres: Postgres,
) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("service")
    # Nothing of another module's day: a fresh database, and a broker emptied of its queued work.
    database_url, proxy = postgres.new_database(), postgres.proxy
    redis.restart()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLAKETRIAGE_")}
    env.update(
        FLAKETRIAGE_STORE=str(root / "store"),
        FLAKETRIAGE_DATABASE_URL=database_url,
        FLAKETRIAGE_BROKER_URL=redis.url,
        FLAKETRIAGE_WEBHOOK_SECRET=WEBHOOK_SECRET,
        FLAKETRIAGE_GITHUB_WEBHOOK_SECRET=GITHUB_SECRET,
        FLAKETRIAGE_SENTRY_CLIENT_SECRET=SENTRY_SECRET,
        FLAKETRIAGE_API_TOKEN=API_TOKEN,
        FLAKETRIAGE_NOTIFY_URL=f"http://127.0.0.1:{port}/v1/events",
        FLAKETRIAGE_ISSUES_DIR=str(root / "issues"),
        FLAKETRIAGE_REPLAY_TIMEOUT_S="20",
        FLAKETRIAGE_SWEEP_AFTER_S="4",
        FLAKETRIAGE_BROKER_VISIBILITY_TIMEOUT_S="10",
        FLAKETRIAGE_REPLAY_BATCH="4",
        PYTHONUNBUFFERED="1",
    )
    # A module may tune the service for its own programs (smaller policies: fewer replays).
    env.update(getattr(request.module, "STACK_SETTINGS", {}))
    (root / "project").mkdir()
    stack = Stack(root=root, env=env, port=port, redis=redis, proxy=proxy)
    stack.start()
    yield stack
    stack.stop()


def new_token() -> str:
    return secrets.token_hex(8)
