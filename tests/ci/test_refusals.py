"""A misconfiguration is loud: a refusal that retrying cannot fix ends the pytest session with one
``flaketriage: error:`` line naming the setting to change, and leaves nothing in the outbox.
Sent to the real receiver, served on loopback."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from flaketriage.ci.notify import EVENT_REF
from flaketriage.ci.outbox import Outbox
from flaketriage.store import LocalStore
from tests.ci.live_service import SERVICE_SECRET, LiveService, live_service

pytest_plugins = ["pytester"]

FAILING = "def test_fails():\n    assert 1 == 2\n"


@pytest.fixture
def service(tmp_path: Path) -> Iterator[LiveService]:
    with live_service(tmp_path / "service") as running:
        yield running


@pytest.fixture(autouse=True)
def ci_env(monkeypatch: pytest.MonkeyPatch, service: LiveService) -> None:
    for name in ("CI", "PYTEST_ADDOPTS", "GITHUB_ACTIONS"):
        monkeypatch.delenv(name, raising=False)
    for name in [n for n in os.environ if n.startswith("FLAKETRIAGE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("FLAKETRIAGE_NOTIFY_URL", service.events_url)
    monkeypatch.setenv("FLAKETRIAGE_WEBHOOK_SECRET", SERVICE_SECRET)


def _session(pytester: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, list[str]]:
    """A CI session with the plugin's defaults (the store is ``./.flaketriage``); its output lines."""
    pytester.makepyfile(test_one=FAILING)
    result = pytester.runpytest_subprocess(
        "-p", "flaketriage", "--flaketriage", "-p", "no:cacheprovider", *args, timeout=120
    )
    return result, [line for line in result.stdout.lines if line.strip()]


def _outbox(pytester: pytest.Pytester) -> Outbox:
    return Outbox(pytester.path / ".flaketriage" / "outbox")


def test_a_store_the_service_does_not_read_is_the_sessions_last_line(
    pytester: pytest.Pytester, service: LiveService
) -> None:
    result, lines = _session(pytester)
    assert result.ret == 1  # the test's failure, nothing of flaketriage's
    assert any("(sent: refused)" in line for line in lines), lines
    last = lines[-1]
    assert last.startswith("flaketriage: error: 1 event(s) not sent"), lines
    assert "FLAKETRIAGE_STORE" in last and "FLAKETRIAGE_ALLOWED_STORES" in last
    assert str(pytester.path / ".flaketriage") in last  # the store it named
    assert "newer service" not in result.stdout.str()
    assert sum(line.startswith("flaketriage: error:") for line in lines) == 1
    assert _outbox(pytester).pending() == [] and service.deliveries() == 0
    # Not remembered as sent: `notify --new` finds the bundle once the setup is fixed.
    store = LocalStore(pytester.path / ".flaketriage")
    assert store.list_refs(EVENT_REF) == []


def test_the_store_the_service_reads_is_sent(pytester: pytest.Pytester, service: LiveService) -> None:
    _result, lines = _session(pytester, f"--flaketriage-store={service.store}")
    assert any("(sent: yes)" in line for line in lines), lines
    assert not any("flaketriage: error" in line for line in lines)
    assert service.deliveries() == 1


def test_a_wrong_secret_names_the_secret_and_queues_nothing(
    pytester: pytest.Pytester, service: LiveService, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLAKETRIAGE_WEBHOOK_SECRET", "not-the-services")
    _result, lines = _session(pytester, f"--flaketriage-store={service.store}")
    assert lines[-1].startswith("flaketriage: error:") and "FLAKETRIAGE_WEBHOOK_SECRET" in lines[-1], lines
    assert "HTTP 401" in lines[-1]
    assert Outbox(service.store / "outbox").pending() == [] and service.deliveries() == 0


def test_a_service_that_is_down_queues_and_warns_why(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from tests.conftest import free_port

    monkeypatch.setenv("FLAKETRIAGE_NOTIFY_URL", f"http://127.0.0.1:{free_port()}/v1/events")
    result, _lines = _session(pytester)
    text = result.stdout.str()
    assert "(sent: queued)" in text and "flaketriage: error" not in text
    assert "flaketriage: warning: 1 event(s) queued in" in text and "could not reach" in text
    assert len(_outbox(pytester).pending()) == 1


def test_notify_flush_drops_a_refused_event_with_one_error_line(
    pytester: pytest.Pytester, service: LiveService, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess
    import sys

    from tests.conftest import free_port

    # Queued while the service was down; then the service refuses its store for good.
    monkeypatch.setenv("FLAKETRIAGE_NOTIFY_URL", f"http://127.0.0.1:{free_port()}/v1/events")
    _session(pytester)
    (queued,) = _outbox(pytester).pending()
    flush = subprocess.run(
        [sys.executable, "-m", "flaketriage", "notify", "--flush", "--to", service.events_url, "--json"],
        cwd=pytester.path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert flush.returncode == 0, flush.stderr
    assert json.loads(flush.stdout)["flushed"]["refused"].keys() == {queued.event_id}
    errors = [line for line in flush.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "FLAKETRIAGE_STORE" in errors[0], flush.stderr
    assert flush.stderr.strip().splitlines()[-1] == errors[0]
    assert _outbox(pytester).pending() == []
