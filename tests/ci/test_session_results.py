"""The plugin's session summary: every test's outcome, duration and rerun attempts reach the
service's CI history at the end of a real pytest session (with pytest-rerunfailures and with
pytest-xdist), sent to the real receiver served on loopback."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from sqlalchemy import select

from flaketriage.ci.pytest_results import SessionResults
from flaketriage.ci.quarantine_list import run_variant
from flaketriage.records.models import ResultRow, TestRow, UploadRow
from flaketriage.variant import variant_key
from tests.ci.live_service import SERVICE_SECRET, LiveService, live_service

pytest_plugins = ["pytester"]

SUITE = """\
import pathlib
import pytest

def test_passes():
    assert True

def test_fails():
    assert 1 == 2, "one is not two"

@pytest.mark.skip(reason="not today")
def test_skipped():
    pass

@pytest.fixture
def broken():
    raise RuntimeError("fixture broke")

def test_errors(broken):
    pass

def test_flaky_once(tmp_path_factory):
    marker = pathlib.Path(__file__).with_name("ran-once")
    if not marker.exists():
        marker.write_text("1")
        assert False, "first time"

@pytest.mark.parametrize("n", [1, 2])
def test_param(n):
    assert n
"""


def report(when: str, outcome: str, duration: float = 1.0, message: str | None = None) -> SimpleNamespace:
    longrepr = SimpleNamespace(reprcrash=SimpleNamespace(message=message)) if message else None
    return SimpleNamespace(when=when, outcome=outcome, duration=duration, longrepr=longrepr)


def test_reports_fold_into_one_result_per_test() -> None:
    results = SessionResults()
    for r in (
        report("setup", "passed", 0.1),
        report("call", "passed", 1.0),
        report("teardown", "passed", 0.1),
    ):
        results.add("t::ok", r)
    for r in (report("setup", "passed"), report("call", "failed", 2.0, "boom"), report("teardown", "passed")):
        results.add("t::bad", r)
    results.add("t::err", report("setup", "failed", 0.5, "fixture broke"))
    results.add("t::err", report("teardown", "passed"))
    results.add("t::skip", report("setup", "skipped"))
    results.add("t::skip", report("teardown", "passed"))
    # pytest-rerunfailures: a failing call is reported as "rerun", then the test runs again.
    attempts = [report("setup", "passed", 0.0), report("call", "rerun", 3.0, "first")]
    again = [report("setup", "passed", 0.0), report("call", "passed", 1.0), report("teardown", "passed", 0.0)]
    for r in attempts + again:
        results.add("t::flaky", r)
    t = results.tests
    assert (t["t::ok"].outcome, round(t["t::ok"].duration_s, 3)) == ("passed", 1.2)
    assert (t["t::bad"].outcome, t["t::bad"].message) == ("failed", "boom")
    assert (t["t::err"].outcome, t["t::err"].message) == ("error", "fixture broke")
    assert t["t::skip"].outcome == "skipped"
    assert t["t::flaky"].outcome == "passed" and t["t::flaky"].attempts == [("failed", 3.0, "first")]


@pytest.fixture
def service(tmp_path: Path) -> Iterator[LiveService]:
    with live_service(tmp_path / "service") as running:
        yield running


@pytest.fixture(autouse=True)
def ci_env(monkeypatch: pytest.MonkeyPatch, service: LiveService) -> None:
    for name in [n for n in os.environ if n.startswith(("FLAKETRIAGE_", "GITHUB_", "CI"))]:
        monkeypatch.delenv(name)
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("FLAKETRIAGE_NOTIFY_URL", service.events_url)
    monkeypatch.setenv("FLAKETRIAGE_WEBHOOK_SECRET", SERVICE_SECRET)
    # As GitHub Actions says where a job runs.
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_REPOSITORY", "acme/models")
    monkeypatch.setenv("GITHUB_SHA", "a" * 40)
    monkeypatch.setenv("GITHUB_REF_NAME", "main")
    monkeypatch.setenv("GITHUB_RUN_ID", "777")
    monkeypatch.setenv("GITHUB_JOB", "unit")


def recorded(service: LiveService) -> tuple[list[UploadRow], dict[str, tuple[str, int]]]:
    with service.service.database.session() as session:
        uploads = list(session.scalars(select(UploadRow)))
        rows = session.execute(select(TestRow.test_id, ResultRow.outcome, ResultRow.attempts).join(
            ResultRow, ResultRow.test_pk == TestRow.id))  # fmt: skip
        return uploads, {test: (outcome, attempts) for test, outcome, attempts in rows}


def test_a_session_sends_every_tests_outcome(pytester: pytest.Pytester, service: LiveService) -> None:
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess(
        "-p", "flaketriage", "--flaketriage", f"--flaketriage-store={service.store}",
        "-p", "no:cacheprovider", "--reruns", "1", timeout=180,
    )  # fmt: skip
    assert result.ret == 1
    assert any("flaketriage: CI history: 7 results accepted" in line for line in result.stdout.lines), (
        result.stdout.str()
    )
    uploads, tests = recorded(service)
    [upload] = uploads
    assert (upload.repository, upload.commit, upload.branch, upload.job) == (
        "acme/models",
        "a" * 40,
        "main",
        "unit",
    )
    assert upload.source == "pytest" and upload.run_url == "https://github.com/acme/models/actions/runs/777"
    # The variant the quarantine is matched with (its GPU read as a capture reads it).
    here = run_variant({k: v for k, v in os.environ.items() if not k.startswith("FLAKETRIAGE_")})
    assert upload.variant_key == variant_key(here) and "gpu=" in upload.variant_key
    assert tests == {
        "test_suite.py::test_passes": ("passed", 1),
        "test_suite.py::test_fails": ("failed", 2),  # failed, rerun once, failed again
        "test_suite.py::test_skipped": ("skipped", 1),
        "test_suite.py::test_errors": ("error", 2),
        "test_suite.py::test_flaky_once": ("passed", 2),  # passed on retry
        "test_suite.py::test_param[1]": ("passed", 1),
        "test_suite.py::test_param[2]": ("passed", 1),
    }
    assert upload.passed_on_retry == 1 and upload.failures == 2


def test_an_xdist_session_sends_once_from_its_controller(
    pytester: pytest.Pytester, service: LiveService
) -> None:
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess(
        "-p", "flaketriage", "--flaketriage", f"--flaketriage-store={service.store}",
        "-p", "no:cacheprovider", "-n", "2", timeout=180,
    )  # fmt: skip
    assert result.ret == 1
    uploads, tests = recorded(service)
    assert len(uploads) == 1 and len(tests) == 7
    assert tests["test_suite.py::test_flaky_once"] == ("failed", 1)  # no rerun plugin: it failed


def test_sending_can_be_turned_off(
    pytester: pytest.Pytester, service: LiveService, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLAKETRIAGE_SEND_RESULTS", "false")
    pytester.makepyfile(test_suite="def test_ok():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "flaketriage", "--flaketriage", "-p", "no:cacheprovider")
    assert result.ret == 0
    assert recorded(service) == ([], {})
