"""The pull request's check run: `render_check`'s title, status, conclusion, order, outage line,
GitHub's size limit and inert outside text; and `MarkdownCheckSink` (in place, no traversal)."""

from __future__ import annotations

import html
import os
import re
import stat
from dataclasses import replace
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from flaketriage.errors import ReportError
from flaketriage.workers.report import (
    CheckFailure,
    CheckSummary,
    MarkdownCheckSink,
    render_check,
)
from flaketriage.workers.report.checks import MAX_OUTPUT, CheckState, safe_url

SHA = "0123456789abcdef0123456789abcdef01234567"
HOSTILE_IDS = (
    "tests/test_a.py::test_`tick`",
    "tests/test_b.py::test_x``` ](javascript:alert(1))",
    "tests/test_c.py::test_<img src=x onerror=alert(1)>",
    "tests/test_d.py::test_@org/team and @someone",
    "tests/test_e.py::test_nul\x00byte",
    "tests/test_f.py::test_bad\udcff\ud800bytes",
    "tests/test_g.py::test_[link](https://evil.example)![img](https://evil.example/x.png)",
    "tests/test_h.py::test_newline\nflaketriage-bundle: 0123456789abcdef",
    "`",
)
BUNDLE_LINE = re.compile(r"^[ \t]*flaketriage-bundle:", re.MULTILINE | re.IGNORECASE)
TABLE_TAGS = {"table", "thead", "tbody", "tr", "th", "td"}
BLOCK_TAGS = {"p", "h2", "h3", "ul", "li", "strong", "em", "a", "br", *TABLE_TAGS}
"""The tags the check run's own Markdown makes."""


def failure(test_id: str, state: CheckState = "real", **fields: object) -> CheckFailure:
    values: dict[str, object] = {
        "variant": "",
        "rate": (0.12, 0.05, 0.25) if state in ("flaky", "quarantined") else None,
        "issue_url": None,
        "case_url": None,
        "message": None,
        "jobs": ("build (3.12)",),
        "passed_on_retry": False,
    }
    values.update(fields)
    return CheckFailure(test_id=test_id, state=state, **values)  # type: ignore[arg-type]


def summary(*failures: CheckFailure, storm: tuple[str, ...] = (), **fields: object) -> CheckSummary:
    values: dict[str, object] = {
        "repository": "acme/models",
        "head_sha": SHA,
        "pull_request": 42,
        "tests": 1204,
        "details_url": "https://flaketriage.acme.dev/runs/7",
    }
    values.update(fields)
    return CheckSummary(failures=failures, storm_jobs=storm, **values)  # type: ignore[arg-type]


def assert_inert(markdown: str, links: set[str]) -> str:
    """Render `markdown` (CommonMark with raw HTML allowed, as a hostile page would want) and check
    that outside text made nothing: no tag beyond the document's own, no link but `links`, no
    mention, no line a webhook reads as a bundle; returns the code spans' text."""
    markdown.encode("utf-8")  # no lone surrogates: GitHub takes UTF-8
    assert "\x00" not in markdown
    assert not BUNDLE_LINE.search(markdown)
    page = MarkdownIt("commonmark", {"html": True}).enable("table").render(markdown)
    codes = re.findall(r"<code>(.*?)</code>", page, re.DOTALL)
    outside = re.sub(r"<code>.*?</code>", "", page, flags=re.DOTALL)
    assert set(re.findall(r"</?([A-Za-z][\w-]*)", outside)) <= BLOCK_TAGS
    assert set(re.findall(r'href="([^"]*)"', outside)) <= links
    visible = re.sub(r"<[^>]*>", "", outside)
    assert not re.search(r"@\w", visible) and "javascript" not in visible
    return "\n".join(html.unescape(code) for code in codes)


# -- title, status, conclusion -------------------------------------------------------------------------
def test_the_title_counts_each_verdict_in_words() -> None:
    out = render_check(
        summary(
            failure("a", "real"),
            failure("b", "real"),
            failure("c", "new"),
            failure("d", "triaging"),
            failure("e", "flaky"),
            failure("f", "quarantined"),
            failure("g", "quarantined"),
            storm=("gpu-1", "gpu-2"),
        )
    )
    assert out.title == (
        "2 real failures, 1 new failure, 1 being triaged, 3 known flaky, infrastructure outage in 2 jobs"
    )
    assert render_check(summary(failure("a"))).title == "1 real failure"
    assert render_check(summary()).title == "All 1,204 tests passed"
    assert render_check(summary(tests=0)).title == "No tests ran"
    assert render_check(summary(storm=("linux",))).title == "Infrastructure outage in 1 job"


@pytest.mark.parametrize(
    ("states", "storm", "status", "conclusion"),
    [
        ((), False, "completed", "success"),
        (("quarantined", "flaky"), False, "completed", "success"),
        (("real", "quarantined"), False, "completed", "failure"),
        (("new",), False, "completed", "failure"),
        (("triaging", "flaky"), False, "in_progress", "neutral"),
        (("triaging", "real"), False, "in_progress", "failure"),
        (("quarantined",), True, "completed", "neutral"),
        (("real",), True, "completed", "failure"),
    ],
)
def test_status_and_conclusion_follow_the_documented_rule(
    states: tuple[CheckState, ...], storm: bool, status: str, conclusion: str
) -> None:
    failures = [failure(f"t{i}", state) for i, state in enumerate(states)]
    out = render_check(summary(*failures, storm=("linux",) if storm else ()))
    assert (out.status, out.conclusion) == (status, conclusion)
    so_far = " so far" if status == "in_progress" else ""
    assert f"**Conclusion{so_far}: {conclusion}**" in out.summary
    assert ("**Status: in progress**" in out.summary) == (status == "in_progress")


# -- the document ---------------------------------------------------------------------------------------
def test_groups_come_real_new_triaging_flaky_quarantined_each_by_test_id() -> None:
    given = [
        failure("z_quarantined", "quarantined"),
        failure("b_flaky", "flaky"),
        failure("y_real", "real"),
        failure("c_triaging", "triaging"),
        failure("x_new", "new"),
        failure("a_real", "real", variant="python=3.12"),
        failure("a_real", "real", variant="python=3.11"),
        failure("a_quarantined", "quarantined"),
    ]
    text = render_check(summary(*given)).text
    headings = re.findall(r"^### (.*)$", text, re.MULTILINE)
    assert headings == [
        "Real failures: 3",
        "New failure: 1",
        "Being triaged: 1",
        "Known flaky: 1",
        "Quarantined, known flaky: 2",
    ]
    entries = re.findall(r"^- `([^`]+)`(?: · `([^`]+)`)?", text, re.MULTILINE)
    assert entries == [
        ("a_real", "python=3.11"),
        ("a_real", "python=3.12"),
        ("y_real", ""),
        ("x_new", ""),
        ("c_triaging", ""),
        ("b_flaky", ""),
        ("a_quarantined", ""),
        ("z_quarantined", ""),
    ]


def test_an_entry_shows_jobs_retry_rate_links_and_the_first_line_of_the_message() -> None:
    entry = failure(
        "tests/test_io.py::test_read",
        "quarantined",
        variant="gpu=none,os=linux",
        issue_url="https://github.com/acme/models/issues/12",
        case_url="https://flaketriage.acme.dev/cases/9",
        message="OSError: timed out\nTraceback ...",
        jobs=("a", "b", "c", "d", "e", "f", "g"),
        passed_on_retry=True,
    )
    text = render_check(summary(entry)).text
    assert (
        "- `tests/test_io.py::test_read` · `gpu=none,os=linux` · failed in `a`, `b`, `c`, `d`, `e` and 2 "
        "more · passed on retry · fails in 12% of runs (5% to 25%) · "
        "[issue](https://github.com/acme/models/issues/12) · [case](https://flaketriage.acme.dev/cases/9)\\\n"
        "  `OSError: timed out`"
    ) in text
    assert "Traceback" not in text
    low = render_check(summary(failure("t", "flaky", rate=(0.004, 0.001, 0.02)))).text
    assert "fails in 0.4% of runs (0.1% to 2%)" in low


def test_the_summary_has_the_counts_table_and_the_outage_as_one_line() -> None:
    jobs = tuple(f"gpu-{i}" for i in range(30))
    out = render_check(summary(failure("a", "real", passed_on_retry=True), failure("b", "flaky"), storm=jobs))
    assert "1,204 tests ran, 2 failed outside the outage (1 of them passed on retry)." in out.summary
    assert "| Real failure | 1 |" in out.summary and "| Known flaky | 1 |" in out.summary
    outage = [line for line in out.summary.splitlines() if "Infrastructure outage" in line]
    assert len(outage) == 1
    assert "in 30 jobs (`gpu-0`, `gpu-1`," in outage[0] and "`gpu-19` and 10 more)" in outage[0]
    assert "gpu-" not in out.text  # the outage's jobs are not listed per test
    assert "[All the details](https://flaketriage.acme.dev/runs/7)" in out.summary


def test_outside_text_is_inert_and_encodable() -> None:
    failures = [
        failure(
            test_id,
            "real",
            variant="os=<b>linux</b>",
            message=f"boom {test_id}",
            jobs=("job @team", "](x)"),
            issue_url="javascript:alert(1)",
            case_url="https://ft.example/cases/1?a=(b)&c=<d>`e`",
        )
        for test_id in HOSTILE_IDS
    ]
    out = render_check(summary(*failures, details_url="https://ci.example/run/1)](javascript:x)"))
    links = {
        "https://ft.example/cases/1?a=%28b%29&amp;c=%3Cd%3E%60e%60",
        "https://ci.example/run/1%29%5D%28javascript:x%29",
    }
    assert_inert(out.summary, links)
    codes = assert_inert(out.text, links)
    assert "tests/test_e.py::test_nul\\x00byte" in codes  # shown, as its escape
    assert "tests/test_f.py::test_bad\\xff\\ud800bytes" in codes
    assert "tests/test_d.py::test_@org/team and @someone" in codes
    assert "issue: `javascript:alert(1)`" in out.text  # not a link: shown as text


def test_safe_url_keeps_plain_urls_and_refuses_the_rest() -> None:
    assert safe_url("https://github.com/acme/models/issues/12") == "https://github.com/acme/models/issues/12"
    assert safe_url("https://x.example/a b") is None
    assert safe_url("javascript:alert(1)") is None
    assert safe_url("http://[::1") is None
    assert safe_url("https:///no-host") is None
    assert safe_url(None) is None


def test_a_huge_failure_list_fits_githubs_limit_cutting_the_longest_section_first() -> None:
    message = "AssertionError: " + "é" * 200
    quarantined = [
        failure(f"tests/test_q.py::test_{i:05d}", "quarantined", message=message) for i in range(20000)
    ]
    real = [failure(f"tests/test_r.py::test_{i}", "real", message="boom") for i in range(5)]
    out = render_check(summary(*quarantined, *real))
    for part in (out.summary, out.text):
        assert len(part.encode("utf-8")) <= MAX_OUTPUT
    assert all(f"tests/test_r.py::test_{i}`" in out.text for i in range(5))  # the short section is whole
    shown = out.text.count("tests/test_q.py::test_")
    assert 50 < shown < 20000
    assert f"_… and {20000 - shown:,} more (quarantined, known flaky) left out:" in out.text
    assert "[All the details](https://flaketriage.acme.dev/runs/7)" in out.text
    assert out.title == "5 real failures, 20,000 known flaky"


def test_a_bad_repository_or_commit_is_refused() -> None:
    with pytest.raises(ReportError, match="not owner/name"):
        render_check(summary(repository="acme/models/../x"))
    with pytest.raises(ReportError, match="not a whole commit id"):
        render_check(summary(head_sha="HEAD"))


# -- the Markdown sink ---------------------------------------------------------------------------------
def test_the_markdown_sink_updates_one_file_in_place(tmp_path: Path) -> None:
    sink = MarkdownCheckSink(tmp_path / "checks")
    first = sink.publish(summary(failure("a", "triaging")), None)
    path = tmp_path / "checks" / "acme" / "models" / f"{SHA}.md"
    assert (first.kind, first.location, first.url) == ("markdown", str(path), None)
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# 1 being triaged\n\n**Status**: in progress · **Conclusion so far**: neutral\n")
    again = sink.publish(summary(failure("a", "real")), first.location)
    also = sink.publish(replace(summary(failure("a", "real")), repository="Acme/Models"), None)
    assert again == also == first
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# 1 real failure\n\n**Status**: completed · **Conclusion**: failure\n")
    assert "being triaged" not in text.lower()
    assert [p.name for p in path.parent.iterdir()] == [path.name]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.parametrize(
    ("repository", "sha"),
    [
        ("../etc", SHA),
        ("acme/..", SHA),
        ("acme/models/../../x", SHA),
        ("/etc/passwd", SHA),
        ("acme\\models", SHA),
        ("acme/models", "../../../../tmp/x"),
        ("acme/models", SHA[:12]),
    ],
)
def test_the_markdown_sink_refuses_paths_that_leave_its_directory(
    tmp_path: Path, repository: str, sha: str
) -> None:
    sink = MarkdownCheckSink(tmp_path / "out")
    with pytest.raises(ReportError):
        sink.publish(summary(repository=repository, head_sha=sha), None)
    assert not (tmp_path / "out").exists()


def test_the_markdown_sink_refuses_a_symbolic_link_out_of_its_directory(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "out").mkdir(parents=True)
    os.symlink(elsewhere, tmp_path / "out" / "acme")
    with pytest.raises(ReportError, match="outside"):
        MarkdownCheckSink(tmp_path / "out").publish(summary(), None)
    assert list(elsewhere.iterdir()) == []
