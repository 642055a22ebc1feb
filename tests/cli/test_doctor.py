"""``flaketriage doctor`` against the real receiver on loopback: exit 0 when all is well, and for each
misconfiguration exit 1 with the line that names it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ci.live_service import SERVICE_SECRET, LiveService, live_service
from tests.cli.conftest import Run
from tests.conftest import free_port

TOKEN = "api-token"


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveService]:
    with live_service(tmp_path_factory.mktemp("doctor-service"), api_token=TOKEN) as running:
        yield running


def _env(service: LiveService, **changes: str | None) -> dict[str, str]:
    env: dict[str, str | None] = {
        "NO_PROXY": "127.0.0.1,localhost",
        "FLAKETRIAGE_STORE": str(service.store),
        "FLAKETRIAGE_NOTIFY_URL": service.events_url,
        "FLAKETRIAGE_WEBHOOK_SECRET": SERVICE_SECRET,
        "FLAKETRIAGE_QUARANTINE_URL": service.quarantine_url,
        "FLAKETRIAGE_API_TOKEN": TOKEN,
    } | changes
    return {k: v for k, v in env.items() if v is not None}


def _doctor(cli: Run, env: dict[str, str]) -> tuple[int, dict[str, dict[str, object]]]:
    proc = cli("doctor", "--json", "--timeout", "3", env=env)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, {c["check"]: c for c in json.loads(proc.stdout)}


def test_a_healthy_setup_is_all_ok(cli: Run, service: LiveService) -> None:
    proc = cli("doctor", env=_env(service))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    names = ["settings", "store", "outbox", "service", "secret", "allowed stores", "quarantine"]
    assert [line[8:].split("  ")[0] for line in lines] == names, proc.stdout
    assert all(line.startswith("ok ") for line in lines), proc.stdout
    assert service.deliveries() == 0  # the ping records nothing


@pytest.mark.parametrize(
    ("changes", "check", "setting", "words"),
    [
        (
            {"FLAKETRIAGE_WEBHOOK_SECRET": "not-the-services"},
            "secret",
            "FLAKETRIAGE_WEBHOOK_SECRET",
            "refused",
        ),
        ({"FLAKETRIAGE_WEBHOOK_SECRET": None}, "secret", "FLAKETRIAGE_WEBHOOK_SECRET", "not set here"),
        ({"FLAKETRIAGE_STORE": None}, "allowed stores", "FLAKETRIAGE_STORE", "does not read"),
        ({"FLAKETRIAGE_QUARANTINE_URL": "QUARANTINE/v1/quarantin"}, "quarantine", None, "HTTP 404"),
        ({"FLAKETRIAGE_API_TOKEN": None}, "quarantine", "FLAKETRIAGE_API_TOKEN", "wants a token"),
        ({"FLAKETRIAGE_NOTIFY_URL": "BASE/api/v1/events"}, "service", "FLAKETRIAGE_NOTIFY_URL", "HTTP 404"),
        (
            {"FLAKETRIAGE_NOTIFY_URL": "BASE/events"},
            "service",
            "FLAKETRIAGE_NOTIFY_URL",
            "not an events endpoint",
        ),
        ({"FLAKETRIAGE_NOTIFY_URL": "DEAD"}, "service", "FLAKETRIAGE_NOTIFY_URL", "cannot reach"),
        ({"FLAKETRIAGE_NOTIFY_ULR": "x"}, "settings", "FLAKETRIAGE_NOTIFY_URL", "did you mean"),
    ],
)
def test_each_misconfiguration_is_named(
    cli: Run,
    service: LiveService,
    changes: dict[str, str | None],
    check: str,
    setting: str | None,
    words: str,
) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1/events"
    for name, value in changes.items():
        if value is not None:
            value = value.replace("QUARANTINE", service.base).replace("BASE", service.base)
            changes[name] = value.replace("DEAD", dead)
    code, checks = _doctor(cli, _env(service, **changes))
    assert code == 1
    problems = {name: c for name, c in checks.items() if c["status"] == "problem"}
    assert list(problems) == [check], checks
    assert words in str(problems[check]["detail"]), problems
    if setting is not None:
        assert problems[check]["setting"] == setting


def test_a_setting_that_cannot_work_is_exit_1_on_one_line(cli: Run, service: LiveService) -> None:
    proc = cli("doctor", env=_env(service, FLAKETRIAGE_STORE_SHARED="maybe"))
    assert proc.returncode == 1
    (line,) = proc.stdout.splitlines()
    assert line.startswith("problem") and "FLAKETRIAGE_STORE_SHARED=maybe" in line


def test_a_store_that_is_a_file_is_a_problem(cli: Run, service: LiveService, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    code, checks = _doctor(cli, _env(service, FLAKETRIAGE_STORE=str(tmp_path / "file")))
    assert code == 1 and checks["store"]["status"] == "problem"
    assert "not a directory" in str(checks["store"]["detail"])


def test_without_a_service_the_checks_are_off_not_problems(cli: Run, tmp_path: Path) -> None:
    proc = cli("doctor", env={})
    assert proc.returncode == 0, proc.stdout
    assert "FLAKETRIAGE_NOTIFY_URL is not set" in proc.stdout


def test_something_else_answering_200_is_not_taken_for_the_service(cli: Run, service: LiveService) -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Portal(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(b"<html>sign in</html>")

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Portal)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1/events"
        code, checks = _doctor(cli, _env(service, FLAKETRIAGE_NOTIFY_URL=url))
    finally:
        server.shutdown()
        server.server_close()
    assert code == 1 and checks["service"]["status"] == "problem"
    assert "not a flaketriage service" in str(checks["service"]["detail"])
