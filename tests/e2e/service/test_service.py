"""The service end to end: real receiver, Redis, PostgreSQL, two Celery workers and beat.

Failures arrive the three ways the product takes them (``flaketriage notify``, a GitHub check run
naming a bundle, a Sentry alert tagged with one), reach a verdict and a report; a quarantine the
service decided is enforced by the pytest plugin; and nothing is lost when a worker is killed
mid-replay, the broker restarts with its queues empty, or the database goes away.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

from flaketriage.events import FailureEvent, StoreLocation
from flaketriage.signing import signed_headers
from flaketriage.store import LocalStore

from .conftest import GITHUB_SECRET, SENTRY_SECRET, WEBHOOK_SECRET, Stack, wait_for

pytestmark = pytest.mark.slow

# Each test's failure is its own: the tag names the function, and frames are part of the fingerprint
# (a message that differs only in ids and numbers is the same failure).
DETERMINISTIC = "def fails_{tag}():\n    raise ZeroDivisionError('boom')\n\nfails_{tag}()\n"
SLOW = "import time\n\ndef slow_{tag}():\n    time.sleep(1.5)\n    raise KeyError('slow')\n\nslow_{tag}()\n"


def tag() -> str:
    return "".join(chr(ord("a") + int(c, 16) % 26) for c in uuid.uuid4().hex[:12])


def _event_body(stack: Stack, bundle: str) -> bytes:
    from flaketriage.bundle.io import load_manifest

    manifest = load_manifest(LocalStore(stack.store), bundle)
    return FailureEvent.for_manifest(manifest, StoreLocation.parse(stack.store)).body()


def _post_event(stack: Stack, body: bytes) -> httpx.Response:
    headers = {"Content-Type": "application/json", **signed_headers(WEBHOOK_SECRET.encode(), body)}
    return httpx.post(f"{stack.url}/v1/events", content=body, headers=headers, timeout=30)


def test_a_captured_failure_sent_with_notify_is_triaged_minimized_and_reported(stack: Stack) -> None:
    bundle = stack.capture(DETERMINISTIC.format(tag=tag()))
    sent = stack.cli("notify", bundle, "--json", "--strict")
    assert sent.returncode == 0, sent.stderr
    case = stack.wait_case(bundle)
    assert case["verdict"] == "deterministic"
    assert case["report_kind"] == "markdown" and Path(case["report_url"]).is_file()
    detail = stack.get(f"/v1/cases/{case['id']}")
    steps = {run["step"]: run["status"] for run in detail["triage_runs"]}
    assert steps == {"triage": "done", "minimize": "done", "report": "done"}
    triage = next(run for run in detail["triage_runs"] if run["step"] == "triage")
    workers = {r["worker"] for r in triage["replays"]}
    assert len(triage["replays"]) >= 5 and all(r["outcome"] == "reproduced" for r in triage["replays"])
    assert len(workers) == 2, "the replays of one case ran on both workers"
    assert len({r["runner"] for r in triage["replays"]}) == 1  # one machine: one runner id
    metrics = httpx.get(f"{stack.url}/metrics", timeout=10).text
    assert 'flaketriage_cases{status="reported"}' in metrics
    assert "flaketriage_replay_duration_seconds_count" in metrics


def test_a_github_check_run_naming_a_bundle_starts_its_triage(stack: Stack) -> None:
    bundle = stack.capture(DETERMINISTIC.format(tag=tag()))
    payload = {
        "action": "completed",
        "check_run": {
            "id": 4242,
            "name": "train",
            "head_sha": "ce587453ced02b1526dfb4cb910479d431683101",
            "status": "completed",
            "conclusion": "failure",
            "html_url": "https://github.com/acme/models/runs/4242",
            "output": {
                "title": "1 failure",
                "summary": f"loss diverged\nflaketriage-bundle: {bundle}\n",
                "text": None,
            },
        },
        "repository": {"id": 1, "name": "models", "full_name": "acme/models"},
        "sender": {"login": "octocat", "id": 1},
    }
    body = json.dumps(payload).encode()
    signature = "sha256=" + hmac.new(GITHUB_SECRET.encode(), body, hashlib.sha256).hexdigest()
    response = httpx.post(
        f"{stack.url}/webhooks/github",
        content=body,
        headers={
            "X-GitHub-Event": "check_run",
            "X-GitHub-Delivery": str(uuid.uuid4()),
            "X-Hub-Signature-256": signature,
        },
        timeout=30,
    )
    assert response.status_code == 202, response.text
    assert stack.wait_case(bundle)["verdict"] == "deterministic"


def test_a_sentry_alert_tagged_with_a_bundle_starts_its_triage(stack: Stack) -> None:
    bundle = stack.capture(DETERMINISTIC.format(tag=tag()))
    payload = {
        "action": "triggered",
        "actor": {"id": "sentry", "name": "Sentry", "type": "application"},
        "data": {
            "event": {
                "event_id": uuid.uuid4().hex,
                "title": "ZeroDivisionError",
                "release": "ce587453",
                "environment": "production",
                "web_url": "https://sentry.io/organizations/acme/issues/1/events/2/",
                "exception": {"values": [{"type": "ZeroDivisionError", "value": "x", "module": "builtins"}]},
                "tags": [["environment", "production"], ["flaketriage.bundle", bundle]],
            },
            "triggered_rule": "flaketriage",
        },
    }
    body = json.dumps(payload).encode()
    signature = hmac.new(SENTRY_SECRET.encode(), body, hashlib.sha256).hexdigest()
    response = httpx.post(
        f"{stack.url}/webhooks/sentry",
        content=body,
        headers={
            "Sentry-Hook-Resource": "event_alert",
            "Sentry-Hook-Signature": signature,
            "Request-ID": str(uuid.uuid4()),
        },
        timeout=30,
    )
    assert response.status_code == 202, response.text
    assert stack.wait_case(bundle)["verdict"] == "deterministic"


def test_the_pytest_plugin_enforces_a_quarantine_the_service_decided(stack: Stack) -> None:
    project = stack.root / "tests-project"
    project.mkdir()
    (project / "test_flaky.py").write_text(
        "import os, random\n\n"
        "def test_sometimes():\n"
        "    if os.environ.get('ALWAYS_FAIL') or random.random() < 0.5:\n"
        "        raise AssertionError('flaky')\n"
    )
    env = {"FLAKETRIAGE_PYTEST": "1", "FLAKETRIAGE_STORE": str(stack.store)}
    for _ in range(30):  # until a run fails and the plugin captures and sends it
        run = _pytest(stack, project, env)
        if run.returncode == 1:
            break
    assert run.returncode == 1, run.stdout
    bundle = re.search(r"captured 1 failure\(s\): ([0-9a-f]+)", run.stdout).group(1)  # type: ignore[union-attr]
    assert "sent: yes" in run.stdout, run.stdout
    case = wait_for(lambda: _bundle_case(stack, bundle), 180, "the flaky verdict")
    assert case["verdict"] == "flaky"
    document = stack.get("/v1/quarantine")
    assert case["fingerprint"] in document["entries"]
    # The service's list, fetched with the API token: the failing test is quarantined, the run passes.
    enforced = _pytest(
        stack,
        project,
        {
            **env,
            "ALWAYS_FAIL": "1",
            "FLAKETRIAGE_QUARANTINE_URL": f"{stack.url}/v1/quarantine",
            "FLAKETRIAGE_NOTIFY_URL": "",
        },
    )
    assert enforced.returncode == 0, enforced.stdout
    assert "QUARANTINED" in enforced.stdout or "quarantined" in enforced.stdout


def _bundle_case(stack: Stack, prefix: str) -> dict[str, object] | None:
    for case in stack.get("/v1/cases"):
        if any(b.startswith(prefix) for b in case["bundles"]) and case["status"] in ("reported", "failed"):
            return dict(case)
    return None


def _pytest(stack: Stack, project: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # flaketriage's plugin alone (by its entry point): the other plugins installed here take
    # seconds to load, in this run and in each of the service's replays of the bundle it captures.
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "flaketriage",
            "-p",
            "no:cacheprovider",
            "test_flaky.py",
        ],
        cwd=project,
        env={**stack.env, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_a_duplicated_delivery_gives_one_case_and_one_triage(stack: Stack) -> None:
    bundle = stack.capture(DETERMINISTIC.format(tag=tag()))
    body = _event_body(stack, bundle)
    codes: list[int] = []
    threads = [
        threading.Thread(target=lambda: codes.append(_post_event(stack, body).status_code)) for _ in range(6)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(codes) == [200] * 5 + [202], codes
    case = stack.wait_case(bundle)
    detail = stack.get(f"/v1/cases/{case['id']}")
    assert case["occurrences"] == 1
    assert [r["step"] for r in detail["triage_runs"]].count("triage") == 1


def test_a_worker_killed_mid_replay_loses_nothing(stack: Stack) -> None:
    bundle = stack.capture(SLOW.format(tag=tag()))
    assert _post_event(stack, _event_body(stack, bundle)).status_code == 202

    def replaying() -> bool:
        case = stack.case_for(bundle)
        if case is None:
            return False
        runs = stack.get(f"/v1/cases/{case['id']}")["triage_runs"]
        return any(r["replays"] for r in runs)

    wait_for(replaying, 60, "the first replays to be sent")
    time.sleep(0.5)  # both workers are inside a 1.5 s replay now
    stack.kill_worker(0)
    try:
        case = stack.wait_case(bundle, timeout=180)
    finally:
        stack.start_worker(0)
    assert case["verdict"] == "deterministic"
    detail = stack.get(f"/v1/cases/{case['id']}")
    assert [r["step"] for r in detail["triage_runs"]].count("report") == 1
    issues = list((stack.root / "issues").glob(f"{case['fingerprint'][:16]}*.md"))
    assert len(issues) == 1


def test_a_broker_restart_with_empty_queues_loses_nothing(stack: Stack) -> None:
    bundle = stack.capture(DETERMINISTIC.format(tag=tag()))
    with stack.workers_down():  # the task is in the broker alone ...
        assert _post_event(stack, _event_body(stack, bundle)).status_code == 202
        stack.redis.restart()  # ... and the broker forgets it
    case = stack.wait_case(bundle, timeout=180)  # the sweep sends it again
    assert case["verdict"] == "deterministic"


def test_the_database_down_gives_503_and_records_nothing(stack: Stack) -> None:
    bundle = stack.capture(DETERMINISTIC.format(tag=tag()))
    body = _event_body(stack, bundle)
    stack.proxy.cut()
    try:
        response = _post_event(stack, body)
        assert response.status_code == 503, response.text
        assert httpx.get(f"{stack.url}/readyz", timeout=30).status_code == 503
    finally:
        stack.proxy.restore()
    assert stack.case_for(bundle) is None  # nothing half-recorded
    retried = wait_for(lambda: _post_event(stack, body), 60, "the database to be back")
    assert retried.status_code == 202, retried.text  # the sender's retry is new work, not a duplicate
    assert stack.wait_case(bundle)["verdict"] == "deterministic"
