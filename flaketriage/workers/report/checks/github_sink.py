"""`GitHubCheckSink`: the pull request's check run on GitHub (the Checks API through PyGithub), one
per repository and head commit, created once and edited in place as verdicts arrive.

The run is found again by the id an earlier publish returned (read first: a run of another commit,
or another check, is never overwritten). Without one, or when that run is gone, it is looked up by
its ``external_id`` (``flaketriage:<owner>/<name>@<sha>``) among the commit's check runs named
``flaketriage``, so a caller that lost the id still updates the same run; only then is one created.

Writing check runs needs the Checks: write permission, which only a GitHub App's token carries (in
GitHub Actions, ``GITHUB_TOKEN`` with ``permissions: checks: write``); a 403 says so.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from flaketriage.errors import IssueTrackerError
from flaketriage.workers.report.checks.base import (
    CHECK_NAME,
    CheckOutput,
    CheckRef,
    CheckSink,
    CheckSummary,
    check_head_sha,
    safe_url,
    split_repository,
)
from flaketriage.workers.report.checks.render import render_check
from flaketriage.workers.report.github_client import GitHubClient

if TYPE_CHECKING:
    from github.CheckRun import CheckRun
    from github.Repository import Repository

log = logging.getLogger("flaketriage.workers.report")

LOOKUP_PAGE = 100
"""Check runs of one commit and name read when looking for ours: a commit has a handful."""


class GitHubCheckSink(CheckSink):
    """Check runs named `name` in the repository each summary names, through `client`'s sign-in
    (`GitHubClient.repository`: any repository the token, or the App's installation, reaches)."""

    kind = "github"

    def __init__(self, client: GitHubClient, *, name: str = CHECK_NAME) -> None:
        self.client = client
        self.name = name

    def publish(self, summary: CheckSummary, existing: str | None = None) -> CheckRef:
        output = render_check(summary)  # validates the repository and the commit first
        owner, name = split_repository(summary.repository)
        full_name, sha = f"{owner}/{name}", check_head_sha(summary.head_sha)
        external_id = f"flaketriage:{full_name.lower()}@{sha}"
        repo = self.client.repository(full_name)
        fields = _fields(output, summary, external_id)
        run = self._existing(repo, full_name, sha, existing) if existing else None
        if run is None:
            run = self._lookup(repo, full_name, sha, external_id)
        if run is not None:
            try:
                with self._calling(f"updating check run {run.id}", full_name, sha):
                    run.edit(**fields)
                return _ref(run)
            except IssueTrackerError as exc:
                if exc.status != 404:
                    raise
                log.info("check run %s on %s is gone; creating another", run.id, full_name)
        with self._calling("creating the check run", full_name, sha):
            made = repo.create_check_run(name=self.name, head_sha=sha, **fields)
        return _ref(made)

    def _existing(self, repo: Repository, full_name: str, sha: str, existing: str) -> CheckRun | None:
        """The check run `existing` names, when it is still there and is this commit's and check's."""
        if not existing.isascii() or not existing.isdigit():
            log.warning("ignoring %r: not a GitHub check run id (a Markdown sink's?)", existing)
            return None
        try:
            with self._calling(f"reading check run {existing}", full_name, sha):
                run = repo.get_check_run(int(existing))
                ours = run.head_sha == sha and run.name == self.name
        except IssueTrackerError as exc:
            if exc.status == 404:
                return None
            raise
        if not ours:
            log.warning(
                "check run %s on %s is %r of commit %s, not %r of %s; using this commit's own",
                existing, full_name, run.name, run.head_sha, self.name, sha,
            )  # fmt: skip
            return None
        return run

    def _lookup(self, repo: Repository, full_name: str, sha: str, external_id: str) -> CheckRun | None:
        """This commit's check run with our `external_id` (the newest), when there is one."""
        with self._calling("listing the commit's check runs", full_name, sha):
            _, data = self.client.github.requester.requestJsonAndCheck(
                "GET",
                f"{repo.url}/commits/{sha}/check-runs",
                parameters={"check_name": self.name, "filter": "all", "per_page": LOOKUP_PAGE},
            )
        runs = data.get("check_runs") if isinstance(data, dict) else None
        ids = [
            int(run["id"])
            for run in runs or []
            if isinstance(run, dict) and run.get("external_id") == external_id and run.get("head_sha") == sha
        ]
        return repo.get_check_run(max(ids)) if ids else None  # an id only: no request until edited

    def _calling(self, doing: str, full_name: str, sha: str) -> Any:
        return self.client.calling(f"{doing} on {full_name} at {sha[:12]}", repo=full_name, access="checks")


def _fields(output: CheckOutput, summary: CheckSummary, external_id: str) -> dict[str, Any]:
    """The check run's fields: a conclusion only with status completed (GitHub completes a run given
    any conclusion); ``details_url`` only when it is a plain http(s) URL."""
    fields: dict[str, Any] = {
        "status": output.status,
        "external_id": external_id,
        "output": {"title": output.title, "summary": output.summary, "text": output.text},
    }
    if output.status == "completed":
        fields["conclusion"] = output.conclusion
    details = safe_url(summary.details_url)
    if details:
        fields["details_url"] = details
    return fields


def _ref(run: CheckRun) -> CheckRef:
    return CheckRef(kind="github", location=str(run.id), url=run.html_url)


__all__ = ["GitHubCheckSink"]
