"""Issue sinks: the `IssueSink` base, Markdown files, an in-memory backend, and issue rendering;
and the pull request's check run (`checks`): its rendering and its sinks.

The GitHub issue sink (PyGithub, ``pip install 'flaketriage[github]'``) lives in `github_sink`, the
check run's GitHub sink in `checks`; the issue sink keeps the same bookkeeping comment in the issue
body, so issues move between backends without losing history.
"""

from __future__ import annotations

from flaketriage.workers.report.base import IssueDraft, IssueRecord, IssueSink, ReportKind, ReportRef
from flaketriage.workers.report.checks import (
    CheckFailure,
    CheckOutput,
    CheckRef,
    CheckSink,
    CheckSummary,
    MarkdownCheckSink,
    render_check,
)
from flaketriage.workers.report.markdown import MarkdownIssueSink
from flaketriage.workers.report.memory import MemoryIssueSink
from flaketriage.workers.report.render import issue_title, render_issue

__all__ = [
    "CheckFailure",
    "CheckOutput",
    "CheckRef",
    "CheckSink",
    "CheckSummary",
    "IssueDraft",
    "IssueRecord",
    "IssueSink",
    "MarkdownCheckSink",
    "MarkdownIssueSink",
    "MemoryIssueSink",
    "ReportKind",
    "ReportRef",
    "issue_title",
    "render_check",
    "render_issue",
]
