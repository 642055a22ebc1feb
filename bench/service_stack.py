"""The service's moving parts for the benchmarks: a private Redis, a fresh PostgreSQL database, and
flaketriage processes started with the environment that points them there."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

ADMIN = os.environ.get("FLAKETRIAGE_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def require_tools(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        raise SystemExit(f"this benchmark needs {', '.join(missing)} (apt-get install {' '.join(missing)})")


@contextmanager
def postgres_database() -> Iterator[str]:
    """A fresh database on the PostgreSQL server at ``FLAKETRIAGE_TEST_POSTGRES``, dropped after."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    name = f"ft_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    info = conninfo_to_dict(ADMIN)
    host, port = str(info.get("host") or "127.0.0.1"), info.get("port") or 5432
    user = info.get("user") or os.environ.get("USER", "postgres")
    url = (
        f"postgresql://{user}@/{name}?host={host}&port={port}"
        if host.startswith("/")
        else f"postgresql://{user}@{host}:{port}/{name}"
    )
    del make_conninfo
    try:
        yield url
    finally:
        with psycopg.connect(ADMIN, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')


@contextmanager
def redis_server() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait()


@dataclass
class Processes:
    """flaketriage processes sharing one environment; each in its own session, ended together."""

    env: dict[str, str]
    cwd: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, *args: str, log: Path | None = None) -> subprocess.Popen[bytes]:
        """``python -m flaketriage ARGS``."""
        return self.launch([sys.executable, "-m", "flaketriage", *args], log=log)

    def launch(self, argv: list[str], log: Path | None = None) -> subprocess.Popen[bytes]:
        """Any command (a benchmark's own app, say), ended with the others."""
        out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - handed to the child
        proc = subprocess.Popen(
            argv,
            cwd=self.cwd,
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if log:
            out.close()  # type: ignore[union-attr]
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs.clear()


def service_env(store: Path, database_url: str, broker_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLAKETRIAGE_")}
    env.update(
        FLAKETRIAGE_STORE=str(store),
        FLAKETRIAGE_DATABASE_URL=database_url,
        FLAKETRIAGE_BROKER_URL=broker_url,
        PYTHONPATH=str(Path(__file__).resolve().parents[1]),
        **extra,
    )
    return env
