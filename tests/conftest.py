"""Shared fixtures: stores of every backend (S3 on a real moto server), and small builders for
real manifests."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from hypothesis import HealthCheck, settings

from flaketriage.bundle.manifest import Command, Environment, Failure, Manifest
from flaketriage.store import LocalStore, MemoryStore, Store

if TYPE_CHECKING:
    from flaketriage.records import Database

POSTGRES_ADMIN = os.environ.get("FLAKETRIAGE_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")
"""An admin URL of the PostgreSQL the tests make their databases on (tests/run.sh finds or starts it)."""


@contextlib.contextmanager
def new_postgres_database(prefix: str) -> Iterator[str]:
    """A database of its own on the test PostgreSQL, named `prefix` and random hex: its URL. Dropped
    afterwards, connections and all."""
    import psycopg
    from sqlalchemy.engine import make_url

    from flaketriage.records.database import database_url

    name = f"{prefix}_{secrets.token_hex(6)}"
    with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(database_url(POSTGRES_ADMIN)).set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# -- databases: SQLite and PostgreSQL, migrated and empty (tests/records, tests/orchestrator, ...) --
@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A database of this session's own on the local PostgreSQL, migrated once, dropped at the end."""
    from flaketriage.records import Database

    with new_postgres_database("ft_test") as url:
        database = Database(url)
        try:
            database.upgrade()
            database.dispose()
            yield url
        finally:
            database.dispose()


def emptied_database(url: str) -> Database:
    """The migrated database at `url`, every table emptied."""
    from sqlalchemy import text

    from flaketriage.records import Base, Database

    database = Database(url)
    tables = ", ".join(table.name for table in Base.metadata.sorted_tables)
    with database.engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))
    return database


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    """An empty, migrated database of each backend."""
    from flaketriage.records import Database

    if request.param == "sqlite":
        database = Database(f"sqlite:///{tmp_path / 'service.db'}")
        database.upgrade()
    else:
        database = emptied_database(request.getfixturevalue("postgres_url"))
    yield database
    database.dispose()


@pytest.fixture
def postgres_database(postgres_url: str) -> Iterator[Database]:
    """An empty PostgreSQL database, for what only PostgreSQL can do (drop a connection mid-transaction)."""
    database = emptied_database(postgres_url)
    yield database
    database.dispose()


# Timing-based checks fail on a loaded 2-core CI runner without saying anything about the code.
settings.register_profile("flaketriage", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("flaketriage")


@pytest.fixture(params=["local", "memory", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    if request.param == "s3":
        from flaketriage.store.s3 import S3Store

        url: str = request.getfixturevalue("s3_url")
        from flaketriage.settings import load_settings

        return S3Store.from_url(url, settings=load_settings())
    return MemoryStore()


# -- S3: a real S3-compatible server (moto's server mode) -----------------------------------------
S3_BUCKET = "flaketriage-tests"
S3_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclass(frozen=True)
class S3Server:
    """A moto server process: its endpoint, and the environment that points boto3 and flaketriage at it."""

    endpoint: str

    @property
    def env(self) -> dict[str, str]:
        return {
            **S3_CREDENTIALS,
            "FLAKETRIAGE_S3_ENDPOINT_URL": self.endpoint,
            "NO_PROXY": "127.0.0.1,localhost",
        }

    def client(self) -> Any:
        import boto3

        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """``moto_server`` on a free port for the session, with the bucket `S3_BUCKET`."""
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "server.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "FLAKETRIAGE_"))}
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
        )
    server = S3Server(f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(server.endpoint + "/moto-api/", timeout=2, trust_env=False)
                break
            except httpx.HTTPError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start: {log.read_text()[-2000:]}") from None
                time.sleep(0.1)
        server.client().create_bucket(Bucket=S3_BUCKET)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """This process's environment pointed at the moto server (credentials, endpoint)."""
    for name in list(os.environ):
        if name.startswith("AWS_") or name in ("FLAKETRIAGE_S3_ENDPOINT_URL",):
            monkeypatch.delenv(name)
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    return s3_server


@pytest.fixture
def s3_url(s3_env: S3Server) -> str:
    """An empty store in the test bucket: ``s3://flaketriage-tests/<unique prefix>``."""
    return f"s3://{S3_BUCKET}/t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def make_manifest() -> Callable[..., Manifest]:
    def build(**overrides: Any) -> Manifest:
        fields: dict[str, Any] = {
            "command": Command(argv=("python", "train.py"), cwd="/work/project"),
            "failure": Failure(
                kind="exception",
                exception_type="ZeroDivisionError",
                message="division by zero",
                fingerprint="ab" * 32,
                signature="python|ZeroDivisionError|division by zero|train.py:main",
            ),
            "environment": Environment(
                python="3.11.7", implementation="CPython", platform="Linux-6.1-x86_64", machine="x86_64"
            ),
        }
        fields.update(overrides)
        return Manifest(**fields)

    return build


def wait_for(check: Callable[[], Any], timeout: float, what: str, every: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except Exception as exc:  # a service still starting
            last = exc
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


# -- Redis ---------------------------------------------------------------------------------------
@dataclass
class Redis:
    port: int
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(self._ping, 20, "redis-server")

    def _ping(self) -> bool:
        with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def restart(self) -> None:
        """Kill and start again: it keeps nothing on disk, so every queued message is gone."""
        self.stop()
        self.start()


@pytest.fixture(scope="session")
def redis() -> Iterator[Redis]:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed: run the tests through tests/run.sh, which installs it")
    server = Redis(free_port())
    server.start()
    yield server
    server.stop()
