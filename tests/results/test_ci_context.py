"""Where a CI job's results come from, as each CI provider's variables say it (and git, outside CI)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from flaketriage.results.ci_context import RunContext, detect, from_environment, repository_of_url

SHA = "3f2c9d41e0aa" + "0" * 28
HEAD = "ab" * 20


@pytest.mark.parametrize(
    ("url", "repository"),
    [
        ("https://github.com/acme/models.git", "acme/models"),
        ("git@github.com:acme/models.git", "acme/models"),
        ("https://gitlab.example.com/acme/models", "acme/models"),
        ("ssh://git@host:7999/acme/models.git/", "acme/models"),
        ("", None),
        ("not a url", None),
    ],
)
def test_a_remote_url_names_its_repository(url: str, repository: str | None) -> None:
    assert repository_of_url(url) == repository


def test_github_actions_on_a_push() -> None:
    context = from_environment(
        {
            "GITHUB_ACTIONS": "true",
            "GITHUB_REPOSITORY": "acme/models",
            "GITHUB_SHA": SHA.upper(),
            "GITHUB_REF": "refs/heads/main",
            "GITHUB_REF_NAME": "main",
            "GITHUB_RUN_ID": "42",
            "GITHUB_RUN_ATTEMPT": "3",
            "GITHUB_JOB": "tests",
        }
    )
    assert context == RunContext(
        repository="acme/models", branch="main", commit=SHA, pull_request=None, run_id="42",
        run_url="https://github.com/acme/models/actions/runs/42", job="tests", attempt=3,
    )  # fmt: skip


def test_a_github_pull_request_is_its_head_commit_and_number(tmp_path: Path) -> None:
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"pull_request": {"number": 7, "head": {"sha": HEAD}}}))
    context = from_environment(
        {
            "GITHUB_ACTIONS": "true",
            "GITHUB_REPOSITORY": "acme/models",
            "GITHUB_SHA": SHA,  # the merge commit Actions checks out: not what the check run is on
            "GITHUB_REF": "refs/pull/7/merge",
            "GITHUB_HEAD_REF": "fix-parse",
            "GITHUB_EVENT_PATH": str(event),
        }
    )
    assert (context.commit, context.pull_request, context.branch) == (HEAD, 7, "fix-parse")


def test_an_unreadable_github_event_falls_back_to_the_variables(tmp_path: Path) -> None:
    event = tmp_path / "event.json"
    event.write_text("{not json")
    context = from_environment(
        {
            "GITHUB_ACTIONS": "true",
            "GITHUB_SHA": SHA,
            "GITHUB_REF": "refs/pull/9/merge",
            "GITHUB_EVENT_PATH": str(event),
        }
    )
    assert (context.commit, context.pull_request) == (SHA, 9)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {
                "BUILDKITE": "true",
                "BUILDKITE_REPO": "git@github.com:acme/models.git",
                "BUILDKITE_BRANCH": "main",
                "BUILDKITE_COMMIT": SHA,
                "BUILDKITE_PULL_REQUEST": "false",
                "BUILDKITE_BUILD_ID": "b-1",
                "BUILDKITE_BUILD_URL": "https://buildkite.com/acme/models/builds/1",
                "BUILDKITE_LABEL": ":pytest:",
                "BUILDKITE_RETRY_COUNT": "1",
            },
            RunContext(
                "acme/models",
                "main",
                SHA,
                None,
                "b-1",
                "https://buildkite.com/acme/models/builds/1",
                ":pytest:",
                2,
            ),
        ),
        (
            {
                "CIRCLECI": "true",
                "CIRCLE_PROJECT_USERNAME": "acme",
                "CIRCLE_PROJECT_REPONAME": "models",
                "CIRCLE_BRANCH": "fix",
                "CIRCLE_SHA1": SHA,
                "CIRCLE_PULL_REQUEST": "https://github.com/acme/models/pull/12",
                "CIRCLE_WORKFLOW_ID": "wf",
                "CIRCLE_BUILD_URL": "https://circleci.com/x/1",
                "CIRCLE_JOB": "test",
            },
            RunContext("acme/models", "fix", SHA, 12, "wf", "https://circleci.com/x/1", "test", 1),
        ),
        (
            {
                "JENKINS_URL": "https://ci",
                "GIT_URL": "https://github.com/acme/models.git",
                "GIT_BRANCH": "origin/main",
                "GIT_COMMIT": SHA,
                "BUILD_ID": "17",
                "BUILD_URL": "https://ci/job/models/17/",
                "JOB_NAME": "models",
            },
            RunContext("acme/models", "main", SHA, None, "17", "https://ci/job/models/17/", "models", 1),
        ),
        ({"GITLAB_CI": "true", "CI_COMMIT_SHA": "not-a-sha"}, RunContext()),
        ({}, RunContext()),
    ],
)
def test_each_ci_provider(env: dict[str, str], expected: RunContext) -> None:
    assert from_environment(env) == expected


def test_the_command_line_wins_then_the_ci_then_git(tmp_path: Path) -> None:
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q", "-b", "work"], cwd=tmp_path, check=True)
    subprocess.run(
        [*git, "remote", "add", "origin", "https://github.com/acme/from-git.git"], cwd=tmp_path, check=True
    )
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], cwd=tmp_path, check=True)
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True
    ).stdout.strip()
    ci = {"GITLAB_CI": "true", "CI_PROJECT_PATH": "acme/from-ci", "CI_JOB_NAME": "unit"}
    found = detect(ci, tmp_path, overrides=RunContext(job="override"))
    assert (found.repository, found.branch, found.commit, found.job) == (
        "acme/from-ci",
        "work",
        head,
        "override",
    )
    assert detect({}, tmp_path).repository == "acme/from-git"
