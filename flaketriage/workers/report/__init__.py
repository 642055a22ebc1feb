"""Issue sinks: the `IssueSink` base, Markdown files, an in-memory backend, and issue rendering.

A GitHub sink (PyGithub, ``pip install 'flaketriage[github]'``) joins them later; it keeps the same
bookkeeping comment in the issue body, so issues move between backends without losing history.
"""

from __future__ import annotations

from flaketriage.workers.report.base import IssueDraft, IssueRecord, IssueSink, ReportKind, ReportRef
from flaketriage.workers.report.markdown import MarkdownIssueSink
from flaketriage.workers.report.memory import MemoryIssueSink
from flaketriage.workers.report.render import issue_title, render_issue

__all__ = [
    "IssueDraft",
    "IssueRecord",
    "IssueSink",
    "MarkdownIssueSink",
    "MemoryIssueSink",
    "ReportKind",
    "ReportRef",
    "issue_title",
    "render_issue",
]
