"""`GitHubCheckSink` with PyGithub against the GitHub stand-in: one check run per commit, updated in
place, found again when its id is lost or recreated when it is gone; Checks: write named on a 403;
GitHub's 65,535-character limit; hostile test ids inert; and the stand-in's own Checks API rules."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from github import GithubException

from flaketriage.errors import IssueTrackerError
from flaketriage.workers.report import CheckFailure, CheckSummary
from flaketriage.workers.report.checks import MAX_OUTPUT, CheckState, GitHubCheckSink
from flaketriage.workers.report.github_client import GitHubClient
from tests.workers.github.conftest import REPO, config
from tests.workers.github.stand_in import CHECK_RUN_EXAMPLE, GitHubStandIn
from tests.workers.test_check_render import HOSTILE_IDS, assert_inert

SHA = "0123456789abcdef0123456789abcdef01234567"
OTHER_SHA = "89abcdef0123456789abcdef0123456789abcdef"
RUNS = rf"/repos/{REPO}/check-runs"
SinkFactory = Callable[..., GitHubCheckSink]


@pytest.fixture
def make_checks(github: GitHubStandIn) -> SinkFactory:
    """A new sink with its own client (another process, as far as GitHub can tell)."""

    def build(**overrides: Any) -> GitHubCheckSink:
        return GitHubCheckSink(GitHubClient(config(github, **overrides)))

    return build


def failure(test_id: str, state: CheckState = "real", **fields: Any) -> CheckFailure:
    values: dict[str, Any] = {
        "variant": "python=3.12",
        "rate": (0.1, 0.05, 0.2) if state in ("flaky", "quarantined") else None,
        "issue_url": "https://github.com/acme/models/issues/3" if state == "real" else None,
        "case_url": None,
        "message": "AssertionError: boom",
        "jobs": ("build (3.12)",),
        "passed_on_retry": False,
    }
    values.update(fields)
    return CheckFailure(test_id=test_id, state=state, **values)


def summary(*failures: CheckFailure, sha: str = SHA, repository: str = REPO, **fields: Any) -> CheckSummary:
    values: dict[str, Any] = {"pull_request": 7, "tests": 300, "storm_jobs": (), "details_url": None}
    values.update(fields)
    return CheckSummary(repository=repository, head_sha=sha, failures=failures, **values)


def only_run(github: GitHubStandIn, sha: str = SHA, repo: str = REPO) -> dict[str, Any]:
    runs = github.check_runs(repo, sha)
    assert len(runs) == 1, runs
    return runs[0]


# -- one check run, in place ------------------------------------------------------------------------
def test_one_check_run_per_commit_updated_in_place(github: GitHubStandIn, make_checks: SinkFactory) -> None:
    sink = make_checks()
    first = sink.publish(summary(failure("t_a", "triaging"), failure("t_b", "quarantined")), None)
    run = only_run(github)
    assert (first.kind, first.location) == ("github", str(run["id"]))
    assert first.url == f"{github.origin}/{REPO}/runs/{run['id']}"
    assert (run["name"], run["status"], run["conclusion"]) == ("flaketriage", "in_progress", None)
    assert run["output"]["title"] == "1 being triaged, 1 known flaky"
    assert "conclusion" not in github.calls_to("POST", RUNS)[0].body  # else GitHub would complete it

    ref = first
    for states, conclusion in ((("real", "quarantined"), "failure"), (("flaky", "quarantined"), "success")):
        ref = sink.publish(summary(*(failure(f"t_{s}", s) for s in states)), ref.location)
        assert ref == first
        run = only_run(github)
        assert (run["status"], run["conclusion"]) == ("completed", conclusion)
    # A failure that arrives later, being triaged, reopens the same run.
    assert sink.publish(summary(failure("t_late", "triaging")), ref.location) == first
    run = only_run(github)
    assert (run["status"], run["conclusion"], run["completed_at"]) == ("in_progress", None, None)
    assert len(github.calls_to("POST", RUNS)) == 1
    assert len(github.calls_to("PATCH", rf"{RUNS}/\d+")) == 3
    assert run["external_id"] == f"flaketriage:{REPO}@{SHA}"


def test_a_lost_id_finds_the_commits_run_by_its_external_id(
    github: GitHubStandIn, make_checks: SinkFactory
) -> None:
    first = make_checks().publish(summary(failure("t_a", "triaging")), None)
    again = make_checks().publish(summary(failure("t_a", "real")), None)  # another process, no id
    assert again == first
    assert only_run(github)["conclusion"] == "failure"
    assert len(github.calls_to("POST", RUNS)) == 1


def test_a_gone_check_run_is_recreated(github: GitHubStandIn, make_checks: SinkFactory) -> None:
    sink = make_checks()
    first = sink.publish(summary(failure("t_a", "triaging")), None)
    github.delete_check_run(int(first.location))
    again = sink.publish(summary(failure("t_a", "real")), first.location)
    assert again.location != first.location
    assert only_run(github)["id"] == int(again.location)
    assert sink.publish(summary(failure("t_a", "real")), again.location) == again


def test_a_run_of_another_commit_is_never_overwritten(
    github: GitHubStandIn, make_checks: SinkFactory
) -> None:
    sink = make_checks()
    first = sink.publish(summary(failure("t_a", "real")), None)
    other = sink.publish(summary(failure("t_b", "flaky"), sha=OTHER_SHA), first.location)
    assert other.location != first.location
    assert only_run(github, SHA)["output"]["title"] == "1 real failure"
    assert only_run(github, OTHER_SHA)["output"]["title"] == "1 known flaky"
    assert sink.publish(summary(), "/tmp/checks/acme/models/x.md").location == first.location


def test_check_runs_go_to_the_summarys_repository(github: GitHubStandIn, make_checks: SinkFactory) -> None:
    github.add_repo("acme/datasets", has_issues=False)  # check runs need no issues
    ref = make_checks().publish(summary(failure("t_a"), repository="acme/datasets"), None)
    assert only_run(github, SHA, "acme/datasets")["id"] == int(ref.location)
    assert github.check_runs(REPO) == []
    github.add_token("ghs_models_only", repos={REPO})
    with pytest.raises(IssueTrackerError) as info:
        make_checks(token="ghs_models_only").publish(summary(repository="acme/datasets"), None)
    assert info.value.status == 404
    assert "the repository acme/datasets does not exist" in str(info.value)
    assert "the token must have access to it" in str(info.value)


# -- refusals -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("checks", "said"),
    [(None, "You must authenticate via a GitHub App."), ("read", "Resource not accessible by integration")],
)
def test_a_403_names_the_checks_write_permission(
    github: GitHubStandIn, make_checks: SinkFactory, checks: str | None, said: str
) -> None:
    github.add_token("ghp_no_checks", checks=checks)
    with pytest.raises(IssueTrackerError) as info:
        make_checks(token="ghp_no_checks").publish(summary(failure("t_a")), None)
    error = info.value
    assert error.status == 403 and "\n" not in str(error)
    assert f"(403 {said!r})" in str(error)
    assert "Checks: write" in str(error) and "cannot write check runs on acme/models" in str(error)
    assert "permissions: checks: write" in str(error)
    assert github.check_runs(REPO) == []


def test_a_commit_the_repository_lacks_is_a_clear_422(
    github: GitHubStandIn, make_checks: SinkFactory
) -> None:
    github.repos[REPO].commits = {OTHER_SHA}
    with pytest.raises(IssueTrackerError) as info:
        make_checks().publish(summary(failure("t_a")), None)
    assert info.value.status == 422
    assert f"No commit found for SHA: {SHA}" in str(info.value)
    assert "the commit must be one of acme/models's" in str(info.value)


# -- content ------------------------------------------------------------------------------------------
def test_a_huge_failure_list_fits_githubs_limit(github: GitHubStandIn, make_checks: SinkFactory) -> None:
    failures = [
        failure(f"tests/test_big.py::test_case_{i:05d}", "real", message="ValueError: " + "x" * 250)
        for i in range(5000)
    ]
    make_checks().publish(summary(*failures), None)  # the stand-in refuses more than 65,535 with a 422
    output = only_run(github)["output"]
    assert len(output["text"].encode("utf-8")) <= MAX_OUTPUT < len(failures) * 250
    shown = output["text"].count("tests/test_big.py::test_case_")
    assert f"_… and {5000 - shown:,} more (real failures) left out:" in output["text"]


def test_hostile_test_ids_are_inert_on_github(github: GitHubStandIn, make_checks: SinkFactory) -> None:
    failures = [failure(t, "real", message=t, jobs=(t,), variant=t) for t in HOSTILE_IDS]
    make_checks().publish(summary(*failures), None)
    output = only_run(github)["output"]
    links = {"https://github.com/acme/models/issues/3"}
    assert_inert(output["summary"], links)
    codes = assert_inert(output["text"], links)
    assert "tests/test_f.py::test_bad\\xff\\ud800bytes" in codes
    assert "tests/test_c.py::test_<img src=x onerror=alert(1)>" in codes


# -- the stand-in ---------------------------------------------------------------------------------------
def test_the_stand_in_answers_in_the_documented_shape(
    github: GitHubStandIn, make_checks: SinkFactory
) -> None:
    make_checks().publish(summary(failure("t_a")), None)
    run = only_run(github)
    assert next(c for c in github.calls if c.method == "POST").status == 201
    served = GitHubClient(config(github)).github.requester.requestJsonAndCheck(
        "GET", f"{github.url}/repos/{REPO}/check-runs/{run['id']}"
    )[1]

    def shape(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: shape(v) for k, v in value.items()}
        return type(value).__name__ if not isinstance(value, list) else "list"

    expected = shape(CHECK_RUN_EXAMPLE)
    got = shape(served)
    assert got.keys() == expected.keys()
    assert got["output"].keys() == expected["output"].keys() and got["app"] == expected["app"]
    listed = GitHubClient(config(github)).github.requester.requestJsonAndCheck(
        "GET", f"{github.url}/repos/{REPO}/commits/{SHA}/check-runs"
    )[1]
    assert listed["total_count"] == 1 and listed["check_runs"][0]["id"] == run["id"]


def test_the_stand_in_validates_as_github_documents(github: GitHubStandIn) -> None:
    repo = GitHubClient(config(github)).repository(REPO)
    requester = GitHubClient(config(github)).github.requester

    def refused(call: Callable[[], object]) -> GithubException:
        with pytest.raises(GithubException) as info:
            call()
        return info.value

    output = {"title": "t", "summary": "s"}
    assert refused(lambda: repo.create_check_run("flaketriage", SHA, status="completed")).status == 422
    too_long = {"title": "t", "summary": "s" * (MAX_OUTPUT + 1)}
    error = refused(lambda: repo.create_check_run("flaketriage", SHA, output=too_long))
    assert error.status == 422 and "summary is too long" in str(error.data)
    error = refused(
        lambda: requester.requestJsonAndCheck("POST", f"{repo.url}/check-runs", input={"name": "x"})
    )
    assert error.status == 422 and error.data["errors"][0]["field"] == "head_sha"
    assert refused(lambda: repo.create_check_run("flaketriage", SHA, conclusion="stale")).status == 422
    assert refused(lambda: repo.create_check_run("flaketriage", SHA, status="waiting")).status == 422
    assert refused(lambda: repo.create_check_run("flaketriage", SHA, output={"title": "t"})).status == 422
    assert refused(lambda: repo.get_check_run(999999).edit(output=output)).status == 404

    run = repo.create_check_run("flaketriage", SHA, status="in_progress", conclusion="success", output=output)
    assert (run.status, run.conclusion) == ("completed", "success")  # a conclusion completes it
    run.edit(status="queued")
    assert (run.status, run.conclusion) == ("queued", None)
