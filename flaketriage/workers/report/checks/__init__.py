"""The pull request's check run: what flaketriage knows about one CI run's failures (`CheckSummary`),
rendered as a check run's title, status, conclusion and Markdown (`render_check`), and the sinks
that keep ONE check run per repository and head commit, updated in place as verdicts arrive:
GitHub's Checks API through PyGithub (`GitHubCheckSink`) and Markdown files (`MarkdownCheckSink`).

``base`` holds the data and the `CheckSink` base, ``render`` the rendering, ``github_sink`` and
``markdown_sink`` the sinks; everything a caller needs is importable from here.
"""

from __future__ import annotations

from flaketriage.workers.report.checks.base import (
    CHECK_NAME,
    MAX_OUTPUT,
    CheckConclusion,
    CheckFailure,
    CheckOutput,
    CheckRef,
    CheckSink,
    CheckState,
    CheckStatus,
    CheckSummary,
    check_head_sha,
    safe_url,
    split_repository,
)
from flaketriage.workers.report.checks.github_sink import GitHubCheckSink
from flaketriage.workers.report.checks.markdown_sink import MarkdownCheckSink
from flaketriage.workers.report.checks.render import render_check

__all__ = [
    "CHECK_NAME",
    "MAX_OUTPUT",
    "CheckConclusion",
    "CheckFailure",
    "CheckOutput",
    "CheckRef",
    "CheckSink",
    "CheckState",
    "CheckStatus",
    "CheckSummary",
    "GitHubCheckSink",
    "MarkdownCheckSink",
    "check_head_sha",
    "render_check",
    "safe_url",
    "split_repository",
]
