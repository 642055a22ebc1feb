"""CI history through the production stack, as a team meets it: a pull request's CI run fails two
tests, the pull request's check run says so and hears the verdict in place, a rerun of the job
passes one of them (history suspects it), and the fix merged to main resolves the other's case by
the sequential test, closing its issue.

PostgreSQL, Redis, the receiver, two workers and beat run as real processes (the ``stack``
fixture); CI runs the real ``pytest --flaketriage`` (the plugin sends bundles, events and its session
summary) and the real ``flaketriage results upload`` of pytest's own JUnit XML. Every step is
asserted before the next one starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_for

from .conftest import API_TOKEN, WEBHOOK_SECRET, Stack

pytestmark = pytest.mark.slow

# A fixed failure is resolved after 11 passes in a row (0.75^11 < 0.05) instead of 59.
STACK_SETTINGS = {"FLAKETRIAGE_MIN_FLAKY_RATE": "0.25", "FLAKETRIAGE_FLAKY_RATE_REPLAYS": "8"}
REPO = "acme/models"
PARSE = "test_parse.py::test_parses_a_pair"
NETWORK = "test_network.py::test_fetches_the_index"

PARSE_PY = """\
def parse(text):
    return [int(part) for part in text.split(";")]  # the bug: the separator is ","


def test_parses_a_pair():
    assert parse("1,2") == [1, 2]
"""
FIXED_PARSE_PY = PARSE_PY.replace('split(";")', 'split(",")')


def network_py(outage: Path) -> str:
    return f"""\
import pathlib


def test_fetches_the_index():
    assert not pathlib.Path({str(outage)!r}).exists(), "the index server did not answer"
"""


def git(root: Path, *args: str) -> str:
    command = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args]
    return subprocess.run(command, cwd=root, check=True, capture_output=True, text=True).stdout.strip()


def github_env(
    stack: Stack, *, sha: str, run_id: str, attempt: int, pr: int | None, event: Path
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLAKETRIAGE_", "PYTEST_", "GITHUB_"))}
    env.pop("CI", None)
    payload: dict[str, Any] = {"pull_request": {"number": pr, "head": {"sha": sha}}} if pr else {"after": sha}
    event.write_text(json.dumps(payload))
    env.update(
        GITHUB_ACTIONS="true",
        GITHUB_SERVER_URL="https://github.com",
        GITHUB_REPOSITORY=REPO,
        GITHUB_RUN_ID=run_id,
        GITHUB_RUN_ATTEMPT=str(attempt),
        GITHUB_JOB="tests",
        GITHUB_SHA=sha,
        GITHUB_EVENT_PATH=str(event),
        GITHUB_REF=f"refs/pull/{pr}/merge" if pr else "refs/heads/main",
        GITHUB_REF_NAME=f"{pr}/merge" if pr else "main",
        GITHUB_HEAD_REF="fix-parse" if pr else "",
        FLAKETRIAGE_STORE=str(stack.store),
        FLAKETRIAGE_NOTIFY_URL=f"{stack.url}/v1/events",
        FLAKETRIAGE_WEBHOOK_SECRET=WEBHOOK_SECRET,
        FLAKETRIAGE_API_TOKEN=API_TOKEN,
        PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
        NO_PROXY="127.0.0.1,localhost",
    )
    return env


def pytest_run(root: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "flaketriage", "-p", "no:cacheprovider", *args],
        cwd=root, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_a_pull_request_hears_its_verdicts_and_main_resolves_the_fix(stack: Stack) -> None:
    root = stack.root / "project"
    outage = Path(tempfile.mkdtemp(prefix="ft-outage-", dir="/var/tmp")) / "down"
    (root / "test_parse.py").write_text(PARSE_PY)
    (root / "test_network.py").write_text(network_py(outage))
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "parse pairs")
    head = git(root, "rev-parse", "HEAD")
    event = stack.root / "event.json"

    # 1. CI on pull request 7, during an outage of the index server: both tests fail.
    outage.write_text("down")
    first = pytest_run(
        root, github_env(stack, sha=head, run_id="100", attempt=1, pr=7, event=event), "--flaketriage"
    )
    assert first.returncode == 1, first.stdout
    assert "flaketriage: CI history: 2 results accepted" in first.stdout, first.stdout
    check_file = stack.store / "checks" / "acme" / "models" / f"{head}.md"
    wait_for(lambda: check_file.exists(), 60, "the pull request's check run")
    first_text = check_file.read_text()
    assert PARSE in first_text and NETWORK in first_text

    # 2. The service replays both: the parse bug is deterministic and reported; the check run
    #    says so in place, with the issue.
    parse_case = wait_for(lambda: _case(stack, PARSE, "reported"), 180, "the parse bug's verdict")
    assert parse_case["verdict"] == "deterministic"
    issue = Path(parse_case["report_url"])
    assert issue.exists()
    wait_for(lambda: issue.name in check_file.read_text(), 60, "the check run to link the issue")
    assert sorted(p.name for p in check_file.parent.iterdir()) == [f"{head}.md"]  # one per commit

    # 3. The job is rerun once the outage is over: the network test passes on the same commit,
    #    so history suspects it, and its bundle is triaged again.
    outage.unlink()
    rerun = pytest_run(
        root, github_env(stack, sha=head, run_id="100", attempt=2, pr=7, event=event), "--flaketriage"
    )
    assert rerun.returncode == 1 and "1 passed" in rerun.stdout, rerun.stdout
    tests = stack.get(f"/v1/tests?repository={REPO}")
    network = next(t for t in tests if t["test_id"] == NETWORK)
    wait_for(lambda: stack.get(f"/v1/tests/{network['id']}")["suspected_flaky"], 60, "history to suspect it")
    detail = stack.get(f"/v1/tests/{network['id']}")
    assert detail["flaky_commits"] == 1 and [r["outcome"] for r in detail["recent"]] == ["passed", "failed"]

    # 4. The fix is merged to main; CI on main passes and uploads pytest's JUnit XML. After the
    #    sequential test's passes in a row, the parse bug's case is fixed and its issue closed.
    (root / "test_parse.py").write_text(FIXED_PARSE_PY)
    git(root, "commit", "-qam", "split pairs on commas")
    fixed = git(root, "rev-parse", "HEAD")
    main_env = github_env(stack, sha=fixed, run_id="200", attempt=1, pr=None, event=stack.root / "push.json")
    main_env["FLAKETRIAGE_SEND_RESULTS"] = "false"  # this job uploads its JUnit XML instead
    green = pytest_run(root, main_env, "--junitxml=junit.xml")
    assert green.returncode == 0, green.stdout
    for run in range(11):
        upload = ["results", "upload", "junit.xml", "--run-id", f"main-{run}", "--strict"]
        sent = subprocess.run(
            [sys.executable, "-m", "flaketriage", *upload],
            cwd=root, env=main_env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert sent.returncode == 0 and "accepted: 2 tests" in sent.stderr, sent.stderr
        if run < 9:
            assert stack.get(f"/v1/cases/{parse_case['id']}")["status"] == "reported"
    fixed_case = wait_for(lambda: _case(stack, PARSE, "fixed"), 60, "the fix to resolve the case")
    assert fixed_case["verdict"] == "deterministic"
    assert "state: closed" in issue.read_text() or '"state": "closed"' in issue.read_text()
    assert stack.get(f"/v1/cases/{parse_case['id']}")["impact"]["blocked_runs"] >= 2


def _case(stack: Stack, test_id: str, status: str) -> dict[str, Any] | None:
    found = [c for c in stack.get("/v1/cases") if c["test_id"] == test_id and c["kind"] == "bundle"]
    return found[0] if found and found[0]["status"] == status else None
