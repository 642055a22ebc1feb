"""`GitHubIssueSink` against the GitHub stand-in: one issue per fingerprint across processes, retries
that count once, reopening, labels, closing on a quarantine lift, paced comments, hostile content."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from flaketriage.bundle.manifest import Command, Failure, Manifest
from flaketriage.errors import IssueTrackerError
from flaketriage.store import LocalStore, MemoryStore
from flaketriage.workers.findings import Finding
from flaketriage.workers.quarantine.file import Quarantine
from flaketriage.workers.report import IssueRecord, render_issue
from flaketriage.workers.report.github_client import GitHubClient
from flaketriage.workers.report.github_sink import GitHubCommenter, GitHubIssueSink, fit_body
from flaketriage.workers.report.render import render_comment, render_lift
from flaketriage.workers.triage import TriageResult, report
from flaketriage.workers.verdict import RateInterval, Verdict, VerdictResult
from tests.workers.github.conftest import FP, REPO, Clock, config, draft
from tests.workers.github.stand_in import GitHubStandIn, iter_markers

SinkFactory = Callable[..., GitHubIssueSink]
ISSUES = rf"/repos/{REPO}/issues"


def record_of(issue: dict[str, Any]) -> IssueRecord:
    return IssueRecord.parse(issue["body"], "the stand-in's issue")


def labels_of(issue: dict[str, Any]) -> list[str]:
    return [label["name"] for label in issue["labels"]]


# -- one issue per fingerprint ----------------------------------------------------------------------
def test_files_once_and_another_process_finds_it_by_its_marker(
    github: GitHubStandIn, make_sink: SinkFactory
) -> None:
    first = make_sink().upsert(draft("a" * 64, key="t1"))
    assert first.created and first.kind == "github"
    [issue] = github.issues()
    assert first.location == issue["html_url"]
    assert list(iter_markers(issue["body"])) == [FP]
    assert labels_of(issue) == ["flaketriage", "deterministic"]
    assert issue["title"] == "[flaketriage] train.py: ZeroDivisionError: division by zero (deterministic)"
    # The labels were created with flaketriage's colours before they were applied.
    assert github.repos[REPO].labels["flaketriage"]["color"] == "5319e7"

    second = make_sink().upsert(draft("b" * 64, key="t2"))  # a new process: no memory of the first
    assert not second.created and second.location == first.location
    [issue] = github.issues()
    record = record_of(issue)
    assert record.occurrences == 2 and record.bundles == ("a" * 64, "b" * 64)
    [comment] = github.comments(1)
    assert "Seen again" in comment["body"] and "bundle `bbbbbbbbbbbb`" in comment["body"]
    assert "reproduced in 5 of 5 replays" in comment["body"]
    # It was found through the search API, by the marker, in this repository's bodies.
    [search, *_] = github.calls_to("GET", "/search/issues")
    assert search.query["q"] == [f'"flaketriage-fingerprint: {FP}" repo:{REPO} in:body']
    assert search.headers["authorization"].startswith("token ghp_")
    assert search.headers["user-agent"] == "PyGithub/Python"


def test_a_lagging_search_index_falls_back_to_the_labelled_issues(
    github: GitHubStandIn, make_sink: SinkFactory
) -> None:
    github.search_lag_s = 3600  # GitHub indexes new issues seconds to minutes late
    make_sink().upsert(draft("a" * 64))
    ref = make_sink().upsert(draft("b" * 64))
    assert not ref.created and len(github.issues()) == 1
    listing = github.calls_to("GET", ISSUES)[-1]
    assert listing.query["labels"] == ["flaketriage"] and listing.query["state"] == ["all"]


def test_a_failing_search_falls_back_to_the_labelled_issues(
    github: GitHubStandIn, make_sink: SinkFactory
) -> None:
    make_sink().upsert(draft("a" * 64))
    github.fail("GET", "/search/issues", 422, message="Validation Failed")
    assert not make_sink().upsert(draft("b" * 64)).created
    assert len(github.issues()) == 1 and record_of(github.issues()[0]).occurrences == 2


def test_racing_processes_settle_on_one_issue(github: GitHubStandIn, make_sink: SinkFactory) -> None:
    github.search_lag_s = 3600
    github.hold("POST", ISSUES, parties=2)  # both file before either can see the other's issue
    sinks = [make_sink(), make_sink()]
    with ThreadPoolExecutor(max_workers=2) as pool:
        refs = list(pool.map(lambda n: sinks[n].upsert(draft(str(n) * 64, key=f"t{n}")), range(2)))
    github.unhold()
    first, second = github.issues()
    assert sorted(r.created for r in refs) == [False, True]
    assert {r.location for r in refs} == {first["html_url"]}
    assert first["state"] == "open" and record_of(first).occurrences == 2
    assert (second["state"], second["state_reason"]) == ("closed", "not_planned")
    assert record_of(second).extra["duplicate_of"] == 1
    assert any("Duplicate of #1" in c["body"] for c in github.comments(2))
    # Later reporters, however they find issues, never pick the duplicate.
    make_sink().upsert(draft("c" * 64))
    assert record_of(github.issues()[0]).occurrences == 3 and len(github.issues()) == 2


def test_many_fingerprints_many_issues_one_fingerprint_from_many_tests_one_issue(
    github: GitHubStandIn, make_sink: SinkFactory
) -> None:
    fingerprints = [c * 64 for c in "abc"]
    for fp in fingerprints:
        assert make_sink().upsert(draft("a" * 64, fingerprint=fp)).created
    for n in range(4):  # four tests failing with the first fingerprint (one cause)
        title = f"[flaketriage] tests/test_{n}.py::test_it: RuntimeError: CUDA error (deterministic)"
        ref = make_sink().upsert(draft(f"{n}" * 64, fingerprint=fingerprints[0], title=title))
        assert not ref.created
    issues = github.issues()
    assert len(issues) == 3
    assert [next(iter_markers(i["body"])) for i in issues] == fingerprints
    assert record_of(issues[0]).occurrences == 5
    assert issues[0]["title"].startswith("[flaketriage] tests/test_3.py::test_it")


# -- retries ----------------------------------------------------------------------------------------
def test_a_retried_report_counts_its_occurrence_once(github: GitHubStandIn, make_sink: SinkFactory) -> None:
    sink = make_sink()
    sink.upsert(draft("a" * 64, key="triage-1"))
    sink.upsert(draft("a" * 64, key="triage-1"))
    make_sink().upsert(draft("a" * 64, key="triage-1"))  # retried by another worker
    assert record_of(github.issues()[0]).occurrences == 1 and github.comments(1) == []

    sink.upsert(draft("b" * 64, key="triage-2"))
    writes = len([c for c in github.calls if c.method in ("POST", "PATCH")])
    make_sink().upsert(draft("b" * 64, key="triage-2"))
    assert len([c for c in github.calls if c.method in ("POST", "PATCH")]) == writes  # no write at all
    assert record_of(github.issues()[0]).occurrences == 2 and len(github.comments(1)) == 1

    # A worker dies after counting the occurrence and before commenting; its task is retried.
    github.fail("PATCH", rf"{ISSUES}/comments/\d+", 500, times=10)  # the recent comment is edited
    with pytest.raises(IssueTrackerError):
        sink.upsert(draft("c" * 64, key="triage-3"))
    github.faults.clear()
    assert record_of(github.issues()[0]).occurrences == 3
    make_sink().upsert(draft("c" * 64, key="triage-3"))
    make_sink().upsert(draft("c" * 64, key="triage-3"))
    assert record_of(github.issues()[0]).occurrences == 3
    [comment] = github.comments(1)  # the recent comment got the evidence, once
    assert comment["body"].count("bundle `cccccccccccc`") == 1


def test_upserts_without_a_key_always_count(github: GitHubStandIn, make_sink: SinkFactory) -> None:
    sink = make_sink()
    for _ in range(3):
        sink.upsert(draft("a" * 64))
    assert record_of(github.issues()[0]).occurrences == 3


# -- reopening, labels, closing ---------------------------------------------------------------------
def test_a_closed_issue_whose_failure_returns_is_reopened_with_a_comment(
    github: GitHubStandIn, make_sink: SinkFactory
) -> None:
    sink = make_sink()
    sink.upsert(draft("a" * 64))
    github.issues()  # someone closes it by hand
    github.repos[REPO].issues[1].update(state="closed", state_reason="completed")
    ref = make_sink().upsert(draft("b" * 64))
    [issue] = github.issues()
    assert not ref.created and (issue["state"], issue["state_reason"]) == ("open", "reopened")
    assert record_of(issue).occurrences == 2
    assert "Reopened" in record_of(issue).note  # type: ignore[operator]
    [comment] = github.comments(1)
    assert comment["body"].splitlines()[1].startswith("**Reopened**")


def _verdict(kind: Verdict, reproductions: int, replays: int) -> VerdictResult:
    rate = reproductions / replays
    return VerdictResult(
        kind, True, replays, reproductions, replays - reproductions, 0, RateInterval(rate, 0.0, 1.0)
    )


def test_a_flaky_verdict_labels_the_issue_and_links_it_and_a_lift_closes_it(
    github: GitHubStandIn, make_sink: SinkFactory, make_manifest: Callable[..., Manifest], tmp_path: Path
) -> None:
    store, manifest, sink = MemoryStore(), make_manifest(), make_sink()
    quarantine = Quarantine(tmp_path / "quarantine.json")
    deterministic = TriageResult(bundle_id="1" * 64, verdict=_verdict(Verdict.DETERMINISTIC, 5, 5))
    filed = report(store, manifest, deterministic, sink, quarantine, key="triage-1")
    assert filed is not None and filed.created
    github.repos[REPO].issues[1]["labels"].append(github.label_json(github.repos[REPO], "needs-owner"))

    flaky = TriageResult(bundle_id="2" * 64, verdict=_verdict(Verdict.FLAKY, 4, 20))
    ref = report(store, manifest, flaky, sink, quarantine, key="triage-2")
    assert ref is not None and ref.kind == "quarantine"
    entry = quarantine.get(manifest.failure.fingerprint)
    assert entry is not None and entry.issue_url == filed.location
    [issue] = github.issues()
    assert labels_of(issue) == ["flaketriage", "needs-owner", "flaky"]  # deterministic dropped, hers kept
    assert issue["title"].endswith("(flaky)") and "**Verdict: flaky**" in issue["body"]

    lift = render_lift(TriageResult(bundle_id="3" * 64, verdict=_verdict(Verdict.NOT_REPRODUCED, 0, 59)))
    closed = make_sink().close(manifest.failure.fingerprint, lift)
    assert closed is not None and closed.location == filed.location
    [issue] = github.issues()
    assert (issue["state"], issue["state_reason"]) == ("closed", "completed")
    assert github.comments(1)[-1]["body"].split("\n", 1)[1].startswith("**Fixed**: the quarantine is lifted")
    record = make_sink().get(manifest.failure.fingerprint)
    assert record is not None and record.state == "closed" and record.note and "Fixed" in record.note
    assert make_sink().close(manifest.failure.fingerprint, lift) == closed  # closing again: nothing
    assert len(github.comments(1)) == 2
    assert make_sink().close("cd" * 32, lift) is None and make_sink().find("cd" * 32) is None


def test_no_issue_no_link_for_a_flaky_verdict_of_a_test(
    github: GitHubStandIn, make_sink: SinkFactory, make_manifest: Callable[..., Manifest], tmp_path: Path
) -> None:
    quarantine = Quarantine(tmp_path / "quarantine.json")
    flaky = TriageResult(bundle_id="2" * 64, verdict=_verdict(Verdict.FLAKY, 4, 20))
    test = Failure(kind="test", test_id="tests/test_a.py::test_a", fingerprint="ab" * 32, signature="s")
    report(MemoryStore(), make_manifest(failure=test), flaky, make_sink(), quarantine)
    entry = quarantine.get("ab" * 32)
    assert entry is not None and entry.issue_url is None and github.issues() == []


def test_a_flaky_verdict_with_no_test_identity_is_filed_as_a_flaky_issue(
    github: GitHubStandIn, make_sink: SinkFactory, make_manifest: Callable[..., Manifest], tmp_path: Path
) -> None:
    quarantine = Quarantine(tmp_path / "quarantine.json")
    flaky = TriageResult(bundle_id="2" * 64, verdict=_verdict(Verdict.FLAKY, 4, 20))
    report(MemoryStore(), make_manifest(), flaky, make_sink(), quarantine)  # python train.py
    [issue] = github.issues()
    assert labels_of(issue) == ["flaketriage", "flaky"]
    entry = quarantine.get("ab" * 32)
    assert entry is not None and entry.issue_url == issue["html_url"]


# -- paced comments ---------------------------------------------------------------------------------
def test_comments_are_paced_per_issue(github: GitHubStandIn, make_sink: SinkFactory) -> None:
    clock = Clock()
    sink = make_sink(clock=clock, interval_s=600)
    sink.upsert(draft("a" * 64, key="t1"))
    sink.upsert(draft("b" * 64, key="t2"))
    clock.advance(minutes=4)
    make_sink(clock=clock, interval_s=600).upsert(draft("c" * 64, key="t3"))  # another process too
    clock.advance(minutes=4)
    sink.upsert(draft("d" * 64, key="t4"))
    [comment] = github.comments(1)
    assert [
        line.split("bundle ")[1][:14] for line in comment["body"].splitlines() if line.startswith("- ")
    ] == [
        "`bbbbbbbbbbbb`",
        "`cccccccccccc`",
        "`dddddddddddd`",
    ]
    assert "3 times in a row" in comment["body"]
    assert len(github.calls_to("PATCH", rf"{ISSUES}/comments/\d+")) == 2
    clock.advance(minutes=3)  # 11 minutes after the comment: a new one
    sink.upsert(draft("e" * 64, key="t5"))
    assert len(github.comments(1)) == 2
    assert record_of(github.issues()[0]).occurrences == 5


def test_a_deleted_comment_is_replaced_not_an_error(github: GitHubStandIn, make_sink: SinkFactory) -> None:
    sink = make_sink()
    sink.upsert(draft("a" * 64, key="t1"))
    sink.upsert(draft("b" * 64, key="t2"))
    github.repos[REPO].comments.clear()
    sink.upsert(draft("c" * 64, key="t3"))
    [comment] = github.comments(1)
    assert "cccccccccccc" in comment["body"]


# -- hostile content --------------------------------------------------------------------------------
HOSTILE = (
    "@octocat and @acme/admins look <img src=x onerror=alert(1)> <script>alert(1)</script> "
    "[click](javascript:alert(1)) ![x](http://evil.invalid/x.png) | a | b ``` ~~~ &#64;team --> "
)


def outside_code(markdown: str) -> tuple[str, bool]:
    """The text GitHub renders outside fenced blocks, code spans and HTML comments, and whether
    every fence is closed."""
    kept, fence = [], None
    for line in markdown.splitlines():
        match = re.match(r" {0,3}(`{3,}|~{3,})", line)
        if fence is None and match:
            fence = match.group(1)
        elif (
            fence is not None
            and match
            and match.group(1)[0] == fence[0]
            and len(match.group(1)) >= len(fence)
        ):
            fence = None
        elif fence is None:
            kept.append(line)
    text = re.sub(r"<!--.*?-->", " ", "\n".join(kept), flags=re.DOTALL)
    text = re.sub(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", " ", text)
    return text, fence is None


def test_hostile_content_is_inert_and_a_huge_failure_fits_githubs_limit(
    github: GitHubStandIn, make_sink: SinkFactory, tmp_path: Path, make_manifest: Callable[..., Manifest]
) -> None:
    store = LocalStore(tmp_path / "store")
    huge = "\n".join(f'  File "/w/{HOSTILE}{i}.py", line 1, in f\n    {"x" * 5000}' for i in range(400))
    manifest = make_manifest(
        command=Command(argv=("pytest", "tests"), cwd="/work"),
        failure=Failure(
            kind="test",
            test_id="tests/test_x.py::test_mention[@octocat]",
            exception_type="ValueError",
            message=HOSTILE + "y" * 200_000,
            traceback="Traceback (most recent call last):\n" + huge + "\nValueError: " + HOSTILE,
            detail=HOSTILE,
            fingerprint=FP,
            signature="sig",
        ),
        logs={"stderr": store.put_bytes(("\n".join([HOSTILE * 30] * 3000)).encode())},
    )
    result = TriageResult(
        bundle_id="1" * 64,
        verdict=_verdict(Verdict.DETERMINISTIC, 5, 5),
        findings=[Finding(fingerprint="cd" * 32, kind="exception", summary=HOSTILE, count=2)],
    )
    drafted = render_issue(store, manifest, "1" * 64, result.verdict, findings=[HOSTILE], key="triage-1")
    ref = make_sink().upsert(drafted)  # the stand-in refuses bodies over 65,536 characters (422)
    [issue] = github.issues()
    body, title = issue["body"], issue["title"]
    assert len(drafted.body) > 65536  # the draft itself would not fit
    assert ref.created and len(body) <= 65536
    assert "left out (GitHub's body limit)" in body
    prose, closed = outside_code(body)
    assert closed, "a code fence was left open"
    for bad in ("@octocat", "@acme", "<img", "<script", "[click](javascript:", "![x](", "&#64;team"):
        assert bad not in prose, bad  # escaped: \[click\](...) is text, &lt;img is text
    assert "@\u200boctocat" in title and "@octocat" not in title and len(title) <= 256
    assert record_of(issue).fingerprint == FP  # the bookkeeping survived the cut
    # The triage's reply comment is as inert.
    commenter = GitHubCommenter(GitHubClient(config(github)))
    made = commenter.comment(REPO, 1, render_comment(result))
    comment = github.comments(1)[-1]["body"]
    assert made.location == github.comments(1)[-1]["html_url"]
    prose, _ = outside_code(comment)
    assert "@octocat" not in prose and "<img" not in prose and "[click](javascript:" not in prose


def test_a_long_comment_history_and_occurrence_list_still_fit(
    github: GitHubStandIn, make_sink: SinkFactory
) -> None:
    sink = make_sink(interval_s=0)
    body = "**Verdict: deterministic**\n\n```text\n" + "z" * 70_000 + "\n```\n"
    for n in range(3):
        sink.upsert(draft(f"{n:064x}", body=body))
    record = record_of(github.issues()[0])
    assert record.occurrences == 3 and record.body.count("```") == 2
    many = IssueRecord.new(draft("0" * 64), Clock()())
    many = replace(many, bundles=tuple(f"{n:064x}" for n in range(2000)), occurrences=2000)
    text = fit_body(many)
    assert len(text) <= 65536 and IssueRecord.parse(text, "x").occurrences == 2000


def test_the_repository_answer_is_shaped_like_githubs(github: GitHubStandIn) -> None:
    repo = GitHubClient(config(github)).repo()
    assert (repo.full_name, repo.has_issues, repo.owner.login) == (REPO, True, "acme")
    raw = github.calls_to("GET", f"/repos/{REPO}")[0]
    assert raw.status == 200
    assert json.loads(json.dumps(github.repo_json(github.repos[REPO])))["url"].endswith(
        f"/api/v3/repos/{REPO}"
    )
