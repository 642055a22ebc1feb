"""`flaketriage serve --embedded`: one command, SQLite, the local broker file, the local store, and
the same Celery tasks; a restart in the middle of a triage loses nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from flaketriage.bundle.io import load_manifest
from flaketriage.events import FailureEvent, StoreLocation
from flaketriage.signing import signed_headers
from flaketriage.store import LocalStore

from .conftest import free_port, wait_for

pytestmark = pytest.mark.slow
SECRET = "embedded-secret"


def _serve(root: Path, port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(root / "serve.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "flaketriage", "serve", "--embedded", "--port", str(port)],
            cwd=root,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def test_embedded_service_survives_a_hard_restart_mid_triage(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "job.py").write_text(
        "import time\n\n"
        "def slow_embedded():\n    time.sleep(1)\n    raise OSError('disk gone')\n\n"
        "slow_embedded()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLAKETRIAGE_")}
    env.update(
        FLAKETRIAGE_STORE=str(tmp_path / "store"),
        FLAKETRIAGE_WEBHOOK_SECRET=SECRET,
        FLAKETRIAGE_SWEEP_AFTER_S="3",
        FLAKETRIAGE_REPLAY_TIMEOUT_S="20",
    )
    captured = subprocess.run(
        [sys.executable, "-m", "flaketriage", "capture", "--json", "--", sys.executable, "job.py"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    bundle = captured.stdout.strip().splitlines()[-1].split('"bundle": "')[1].split('"')[0]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = _serve(tmp_path, port, env)
    try:
        wait_for(lambda: httpx.get(f"{url}/readyz", timeout=2).status_code == 200, 60, "the embedded service")
        store = LocalStore(tmp_path / "store")
        body = FailureEvent.for_manifest(load_manifest(store, bundle), StoreLocation.parse(store.root)).body()
        response = httpx.post(f"{url}/v1/events", content=body, headers=signed_headers(SECRET.encode(), body))
        assert response.status_code == 202, response.text
        case_id = response.json()["cases"][0]

        def replaying() -> bool:
            runs = httpx.get(f"{url}/v1/cases/{case_id}", timeout=5).json()["triage_runs"]
            return any(r["replays"] for r in runs)

        wait_for(replaying, 60, "the first replays")
        os.killpg(server.pid, signal.SIGKILL)  # receiver, worker and beat, all at once
        server.wait(timeout=10)
        time.sleep(1)
        server = _serve(tmp_path, port, env)
        wait_for(lambda: httpx.get(f"{url}/readyz", timeout=2).status_code == 200, 60, "the restart")

        def reported() -> dict[str, object] | None:
            case = httpx.get(f"{url}/v1/cases/{case_id}", timeout=5).json()
            assert case["status"] != "failed", case["error"]
            return case if case["status"] == "reported" else None

        case = wait_for(reported, 180, "the case to be reported after the restart")
        assert case["verdict"] == "deterministic"
        assert [r["step"] for r in case["triage_runs"]].count("report") == 1
    finally:
        try:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=10)
