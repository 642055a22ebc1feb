"""``flaketriage results upload`` run for real (``python -m flaketriage`` in a subprocess) on the
JUnit files the real tools wrote (tests/results/fixtures): what it counts, where it says the
results come from (GitHub Actions with a pull request, GitLab, git), what it refuses, and what
the real receiver served on loopback records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from flaketriage.records.models import ResultRow, TestRow, UploadRow
from tests.ci.live_service import SERVICE_SECRET, LiveService, live_service
from tests.conftest import free_port

FIXTURES = Path(__file__).parents[1] / "results" / "fixtures"
HEAD_SHA = "0123456789abcdef0123456789abcdef01234567"
MERGE_SHA = "fedcba9876543210fedcba9876543210fedcba98"
_CI_PREFIXES = ("FLAKETRIAGE_", "GITHUB_", "GITLAB_", "CI_", "BUILDKITE", "CIRCLE", "JENKINS_", "GIT_")


def run_upload(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real CLI, outside any CI (the machine's CI and FLAKETRIAGE_ variables removed), `env` added."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(_CI_PREFIXES) and k != "CI"}
    return subprocess.run(
        [sys.executable, "-m", "flaketriage", "results", "upload", *args],
        cwd=cwd,
        env=clean | {"NO_PROXY": "127.0.0.1,localhost"} | (env or {}),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def summary(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return found


COUNTS = {
    "pytest.xml": (15, 6, 4, 2, 3, 0),
    "pytest-reruns.xml": (15, 7, 3, 2, 3, 1),
    "pytest-xunit1.xml": (15, 6, 4, 2, 3, 0),
    "jest-junit.xml": (7, 4, 1, 1, 1, 0),
    "jest-junit-invocations.xml": (7, 4, 1, 1, 1, 1),
    "gotestsum.xml": (9, 5, 3, 0, 1, 1),
    "go-junit-report.xml": (11, 4, 5, 1, 1, 0),
    "go-junit-report-rerun.xml": (9, 5, 3, 0, 1, 1),
    "surefire-flaky.xml": (6, 3, 1, 1, 1, 2),
    "surefire.xml": (10, 6, 2, 1, 1, 2),
}
"""tests, passed, failed, error, skipped, passed_on_retry of each fixture."""


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_dry_run_counts_each_fixture(name: str, tmp_path: Path) -> None:
    found = summary(
        run_upload(str(FIXTURES / name), "--repo", "acme/models", "--dry-run", "--json", cwd=tmp_path)
    )
    keys = ("tests", "passed", "failed", "error", "skipped", "passed_on_retry")
    assert tuple(found[k] for k in keys) == COUNTS[name]
    assert found["repository"] == "acme/models" and found["answer"] is None
    assert (found["branch"], found["commit"], found["pull_request"]) == (None, None, None)


def test_several_files_are_one_upload(tmp_path: Path) -> None:
    files = [str(FIXTURES / "pytest-reruns.xml"), str(FIXTURES / "gotestsum.xml")]
    found = summary(run_upload(*files, "--repo", "acme/models", "--dry-run", "--json", cwd=tmp_path))
    assert (found["tests"], found["passed_on_retry"]) == (24, 2)


def test_github_pull_request_gives_its_head_and_number(tmp_path: Path) -> None:
    event = tmp_path / "event.json"
    pull_request = {"number": 42, "head": {"sha": HEAD_SHA, "ref": "fix-io"}}
    event.write_text(json.dumps({"action": "synchronize", "number": 42, "pull_request": pull_request}))
    github = {
        "GITHUB_ACTIONS": "true",
        "GITHUB_REPOSITORY": "acme/models",
        "GITHUB_SHA": MERGE_SHA,  # the merge commit Actions checks out, not what the PR's checks are on
        "GITHUB_REF": "refs/pull/42/merge",
        "GITHUB_REF_NAME": "42/merge",
        "GITHUB_HEAD_REF": "fix-io",
        "GITHUB_EVENT_NAME": "pull_request",
        "GITHUB_EVENT_PATH": str(event),
        "GITHUB_RUN_ID": "9001",
        "GITHUB_RUN_ATTEMPT": "2",
        "GITHUB_JOB": "unit",
    }
    done = run_upload(str(FIXTURES / "pytest.xml"), "--dry-run", "--json", cwd=tmp_path, env=github)
    found = summary(done)
    assert (found["repository"], found["branch"], found["commit"], found["pull_request"]) == (
        "acme/models", "fix-io", HEAD_SHA, 42,
    )  # fmt: skip
    # The run is part of the upload's key: the same file from another attempt is another upload.
    again = summary(run_upload(str(FIXTURES / "pytest.xml"), "--dry-run", "--json", cwd=tmp_path,
                               env=github | {"GITHUB_RUN_ATTEMPT": "3"}))  # fmt: skip
    assert again["upload_id"] != found["upload_id"]


def test_gitlab_merge_request(tmp_path: Path) -> None:
    gitlab = {
        "GITLAB_CI": "true",
        "CI_PROJECT_PATH": "acme/models",
        "CI_COMMIT_SHA": HEAD_SHA,
        "CI_COMMIT_REF_NAME": "fix-io",
        "CI_MERGE_REQUEST_IID": "7",
        "CI_MERGE_REQUEST_SOURCE_BRANCH_NAME": "fix-io",
        "CI_PIPELINE_ID": "555",
        "CI_JOB_NAME": "go-test",
    }
    found = summary(
        run_upload(str(FIXTURES / "gotestsum.xml"), "--dry-run", "--json", cwd=tmp_path, env=gitlab)
    )
    assert (found["repository"], found["branch"], found["commit"], found["pull_request"]) == (
        "acme/models", "fix-io", HEAD_SHA, 7,
    )  # fmt: skip


def test_outside_ci_git_says_where(tmp_path: Path) -> None:
    repo = tmp_path / "checkout"
    repo.mkdir()
    ident = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
             "GIT_COMMITTER_EMAIL": "t@example.com", "HOME": str(tmp_path)}  # fmt: skip

    def git(*args: str) -> str:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")} | ident
        return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True,
                              text=True).stdout.strip()  # fmt: skip

    git("init", "-q", "-b", "topic")
    git("remote", "add", "origin", "git@github.com:acme/models.git")
    (repo / "junit.xml").write_bytes((FIXTURES / "jest-junit.xml").read_bytes())
    git("add", "junit.xml")
    git("commit", "-q", "-m", "results")
    found = summary(run_upload("junit.xml", "--dry-run", "--json", cwd=repo, env={"HOME": str(tmp_path)}))
    assert (found["repository"], found["branch"], found["commit"], found["pull_request"]) == (
        "acme/models", "topic", git("rev-parse", "HEAD"), None,
    )  # fmt: skip
    assert found["tests"] == 7


def test_no_repository_is_one_error(tmp_path: Path) -> None:
    done = run_upload(str(FIXTURES / "pytest.xml"), "--dry-run", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: which repository") and "--repo OWNER/NAME" in done.stderr


# -- against the real receiver ------------------------------------------------------------------
@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveService]:
    with live_service(tmp_path_factory.mktemp("results-service")) as running:
        yield running


def sending(service: LiveService, secret: str = SERVICE_SECRET) -> dict[str, str]:
    return {"FLAKETRIAGE_NOTIFY_URL": service.events_url, "FLAKETRIAGE_WEBHOOK_SECRET": secret}


def uploads(service: LiveService, repository: str) -> list[UploadRow]:
    with service.service.database.session() as session:
        return list(session.scalars(select(UploadRow).where(UploadRow.repository == repository)))


def results(service: LiveService, upload: UploadRow) -> dict[str, tuple[str, int, int]]:
    with service.service.database.session() as session:
        rows = session.execute(
            select(TestRow.test_id, ResultRow.outcome, ResultRow.attempts, ResultRow.failed_attempts)
            .join(ResultRow, ResultRow.test_pk == TestRow.id)
            .where(ResultRow.upload_pk == upload.id)
        )
        return {test: (outcome, attempts, failed) for test, outcome, attempts, failed in rows}


def test_an_upload_is_recorded_and_the_same_upload_again_is_a_duplicate(
    service: LiveService, tmp_path: Path
) -> None:
    args = (str(FIXTURES / "pytest-reruns.xml"), "--repo", "acme/recorded", "--run-id", "31", "--json")
    first = summary(run_upload(*args, cwd=tmp_path, env=sending(service)))
    assert first["answer"]["outcome"] == "accepted"
    assert (first["answer"]["tests"], first["answer"]["passed_on_retry"]) == (15, 1)
    [upload] = uploads(service, "acme/recorded")
    assert (upload.upload_id, upload.source, upload.run_id, upload.tests) == (
        first["upload_id"],
        "junit",
        "31",
        15,
    )
    assert upload.passed_on_retry == 1
    recorded = results(service, upload)
    assert recorded["test_top.py::test_flaky"] == ("passed", 2, 1)
    assert recorded["test_top.py::test_fails"] == ("failed", 3, 3)
    assert recorded["pkg/test_things.py::TestC::test_y[1]"] == ("passed", 1, 0)
    assert len(recorded) == 15

    again = summary(run_upload(*args, cwd=tmp_path, env=sending(service)))
    assert again["answer"]["outcome"] == "duplicate" and again["upload_id"] == first["upload_id"]
    assert len(uploads(service, "acme/recorded")) == 1


def test_a_wrong_secret_is_an_error_line_and_nothing_recorded(service: LiveService, tmp_path: Path) -> None:
    args = (str(FIXTURES / "gotestsum.xml"), "--repo", "acme/wrong-secret")
    done = run_upload(*args, cwd=tmp_path, env=sending(service, secret="not-the-secret"))
    assert done.returncode == 0 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("error: the results were not sent:") and "401" in line
    strict = run_upload(*args, "--strict", cwd=tmp_path, env=sending(service, secret="not-the-secret"))
    assert strict.returncode == 1 and strict.stderr.startswith("error: the results were not sent:")
    assert uploads(service, "acme/wrong-secret") == []


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (
            b'<!DOCTYPE t [<!ENTITY x SYSTEM "file:///etc/passwd">]><testsuite>&x;</testsuite>',
            "declares a DTD",
        ),
        (b'{"tests": []}', "is not XML"),
        (b"", "is empty"),
        (b"<html><body>report</body></html>", "root element is <html>"),
    ],
    ids=["xxe", "json", "empty", "html"],
)
def test_a_hostile_file_is_one_error_line_and_nothing_sent(
    content: bytes, said: str, service: LiveService, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.xml"
    bad.write_bytes(content)
    # A good file beside it is not sent either: an upload is every file or none.
    done = run_upload(str(FIXTURES / "pytest.xml"), str(bad), "--repo", "acme/hostile", cwd=tmp_path,
                      env=sending(service))  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith(f"error: {bad} ") and said in line
    assert "Traceback" not in done.stderr
    assert uploads(service, "acme/hostile") == []


def test_a_file_over_the_limit_is_refused_unread(service: LiveService, tmp_path: Path) -> None:
    big = tmp_path / "huge.xml"
    subprocess.run(["truncate", "-s", "120M", str(big)], check=True)
    done = run_upload(str(big), "--repo", "acme/hostile", cwd=tmp_path, env=sending(service))
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert line == (
        f"error: {big} is 120 MiB, larger than the 64 MiB a results file may be "
        "(FLAKETRIAGE_MAX_RESULTS_MB); it was not read: split the suite into shards"
    )


def test_the_service_down_is_an_error_line_exit_0_or_1_with_strict(tmp_path: Path) -> None:
    down = {"FLAKETRIAGE_NOTIFY_URL": f"http://127.0.0.1:{free_port()}/v1/events",
            "FLAKETRIAGE_WEBHOOK_SECRET": SERVICE_SECRET}  # fmt: skip
    clean = {k: v for k, v in os.environ.items() if not k.startswith(_CI_PREFIXES) and k != "CI"}
    command = [sys.executable, "-m", "flaketriage", "results", "upload", str(FIXTURES / "gotestsum.xml"),
               "--repo", "acme/models"]  # fmt: skip
    # Both at once: each waits out the sender's retries (a few seconds, asleep).
    plain, strict = (
        subprocess.Popen(
            command + extra,
            cwd=tmp_path,
            env=clean | down,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for extra in ([], ["--strict"])
    )
    for proc, code in ((plain, 0), (strict, 1)):
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == code, err
        [line] = err.splitlines()
        assert line.startswith("error: the results were not sent: could not reach http://127.0.0.1:")
        assert out == ""
