"""Where a CI job's results come from: repository, branch, commit, pull request, run, job and
attempt, read from the CI provider's own variables and, where they say nothing, from git.

GitHub Actions, GitLab CI, Buildkite, CircleCI and Jenkins are read; on a pull request the commit
is the head of the pull request's branch (what its check run is attached to), not the merge commit
GitHub Actions checks out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from flaketriage.errors import ConfigError, GitError
from flaketriage.process.git import Git
from flaketriage.results.model import ResultsUpload, TestResult, upload_key
from flaketriage.variant import Variant

_REPO_IN_URL = re.compile(r"[:/]([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+?)(?:\.git)?/?$")
_SHA = re.compile(r"^[0-9a-f]{7,64}$")


@dataclass(frozen=True)
class RunContext:
    """What a results upload says about where it ran; any part may be unknown (None)."""

    repository: str | None = None
    branch: str | None = None
    commit: str | None = None
    pull_request: int | None = None
    run_id: str | None = None
    run_url: str | None = None
    job: str | None = None
    attempt: int = 1

    def upload(
        self,
        *,
        source: Literal["junit", "pytest"],
        variant: Variant,
        tests: Sequence[TestResult],
        parts: Iterable[bytes],
    ) -> ResultsUpload:
        """The upload of `tests` from this run (its repository must be known), keyed by the run,
        job, attempt, variant and `parts` (the bytes the results were read from)."""
        if not self.repository:
            raise ConfigError("which repository are these results of? (no CI variables or git origin said)")
        return ResultsUpload(
            upload_id=upload_key(
                repository=self.repository, run_id=self.run_id, job=self.job, attempt=self.attempt,
                variant=variant, parts=parts,
            ),
            source=source,
            repository=self.repository,
            branch=self.branch,
            commit=self.commit,
            pull_request=self.pull_request,
            run_id=self.run_id,
            run_url=self.run_url,
            job=self.job,
            attempt=self.attempt,
            variant=variant,
            tests=tuple(tests),
        )  # fmt: skip

    def over(self, fallback: RunContext) -> RunContext:
        """This context, its unknown parts taken from `fallback`."""
        return RunContext(
            repository=self.repository or fallback.repository,
            branch=self.branch or fallback.branch,
            commit=self.commit or fallback.commit,
            pull_request=self.pull_request or fallback.pull_request,
            run_id=self.run_id or fallback.run_id,
            run_url=self.run_url or fallback.run_url,
            job=self.job or fallback.job,
            attempt=self.attempt if self.attempt != 1 else fallback.attempt,
        )


def repository_of_url(url: str | None) -> str | None:
    """``owner/name`` of a git remote URL (``https://github.com/acme/models.git``,
    ``git@github.com:acme/models``), or None."""
    if not url:
        return None
    found = _REPO_IN_URL.search(url.strip())
    return f"{found.group(1)}/{found.group(2)}" if found else None


def _int(value: str | None) -> int | None:
    try:
        number = int(str(value).strip())
    except ValueError:
        return None
    return number if number > 0 else None


def _sha(value: str | None) -> str | None:
    text = (value or "").strip().lower()
    return text if _SHA.fullmatch(text) else None


def from_environment(env: Mapping[str, str]) -> RunContext:
    """The context a CI provider's variables give (empty outside CI)."""
    if env.get("GITHUB_ACTIONS") == "true":
        return _github(env)
    if env.get("GITLAB_CI") == "true":
        return RunContext(
            repository=env.get("CI_PROJECT_PATH"),
            branch=env.get("CI_MERGE_REQUEST_SOURCE_BRANCH_NAME") or env.get("CI_COMMIT_REF_NAME"),
            commit=_sha(env.get("CI_COMMIT_SHA")),
            pull_request=_int(env.get("CI_MERGE_REQUEST_IID")),
            run_id=env.get("CI_PIPELINE_ID"),
            run_url=env.get("CI_JOB_URL") or env.get("CI_PIPELINE_URL"),
            job=env.get("CI_JOB_NAME"),
        )
    if env.get("BUILDKITE") == "true":
        return RunContext(
            repository=repository_of_url(env.get("BUILDKITE_REPO")),
            branch=env.get("BUILDKITE_BRANCH"),
            commit=_sha(env.get("BUILDKITE_COMMIT")),
            pull_request=_int(env.get("BUILDKITE_PULL_REQUEST")),
            run_id=env.get("BUILDKITE_BUILD_ID"),
            run_url=env.get("BUILDKITE_BUILD_URL"),
            job=env.get("BUILDKITE_LABEL"),
            attempt=(_int(env.get("BUILDKITE_RETRY_COUNT") or "0") or 0) + 1,
        )
    if env.get("CIRCLECI") == "true":
        owner, name = env.get("CIRCLE_PROJECT_USERNAME"), env.get("CIRCLE_PROJECT_REPONAME")
        pr = env.get("CIRCLE_PR_NUMBER") or (env.get("CIRCLE_PULL_REQUEST") or "").rsplit("/", 1)[-1]
        return RunContext(
            repository=f"{owner}/{name}"
            if owner and name
            else repository_of_url(env.get("CIRCLE_REPOSITORY_URL")),
            branch=env.get("CIRCLE_BRANCH"),
            commit=_sha(env.get("CIRCLE_SHA1")),
            pull_request=_int(pr),
            run_id=env.get("CIRCLE_WORKFLOW_ID"),
            run_url=env.get("CIRCLE_BUILD_URL"),
            job=env.get("CIRCLE_JOB"),
        )
    if env.get("JENKINS_URL"):
        return RunContext(
            repository=repository_of_url(env.get("GIT_URL")),
            branch=env.get("CHANGE_BRANCH") or (env.get("GIT_BRANCH") or "").removeprefix("origin/") or None,
            commit=_sha(env.get("GIT_COMMIT")),
            pull_request=_int(env.get("CHANGE_ID")),
            run_id=env.get("BUILD_ID"),
            run_url=env.get("BUILD_URL"),
            job=env.get("JOB_NAME"),
        )
    return RunContext()


def _github(env: Mapping[str, str]) -> RunContext:
    repository = env.get("GITHUB_REPOSITORY")
    server = env.get("GITHUB_SERVER_URL", "https://github.com")
    run_id = env.get("GITHUB_RUN_ID")
    pull_request = None
    commit = _sha(env.get("GITHUB_SHA"))
    ref = env.get("GITHUB_REF", "")
    if ref.startswith("refs/pull/"):
        pull_request = _int(ref.split("/")[2])
    event = _github_event(env.get("GITHUB_EVENT_PATH"))
    pr = event.get("pull_request")
    if isinstance(pr, dict):
        pull_request = pull_request or _int(str(pr.get("number", "")))
        head = pr.get("head")
        if isinstance(head, dict):
            commit = _sha(str(head.get("sha", ""))) or commit
    return RunContext(
        repository=repository,
        branch=env.get("GITHUB_HEAD_REF") or env.get("GITHUB_REF_NAME"),
        commit=commit,
        pull_request=pull_request,
        run_id=run_id,
        run_url=f"{server}/{repository}/actions/runs/{run_id}" if repository and run_id else None,
        job=env.get("GITHUB_JOB"),
        attempt=_int(env.get("GITHUB_RUN_ATTEMPT")) or 1,
    )


def _github_event(path: str | None) -> dict[str, object]:
    """The workflow's event payload (a pull request's head commit is only there); {} if unreadable."""
    if not path:
        return {}
    try:
        with open(path, "rb") as handle:
            data = json.loads(handle.read(5 * 1024 * 1024))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def from_git(cwd: Path, git: Git | None = None) -> RunContext:
    """The context git gives in `cwd`: the commit, the branch checked out and the origin's repository."""
    git = git or Git(timeout_s=10.0)

    def ask(*args: str) -> str | None:
        try:
            return git.run(list(args), cwd).decode("utf-8", "replace").strip() or None
        except (GitError, OSError):
            return None

    branch = ask("rev-parse", "--abbrev-ref", "HEAD")
    return RunContext(
        repository=repository_of_url(ask("config", "--get", "remote.origin.url")),
        branch=None if branch == "HEAD" else branch,
        commit=_sha(ask("rev-parse", "HEAD")),
    )


def detect(env: Mapping[str, str], cwd: Path, *, overrides: RunContext | None = None) -> RunContext:
    """`overrides` (the command line), then the CI provider's variables, then git."""
    found = from_environment(env)
    if overrides is not None:
        found = overrides.over(found)
    if found.repository and found.commit and found.branch:
        return found
    return found.over(from_git(cwd))
