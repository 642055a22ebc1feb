"""Answers to people who asked for a triage (a ``/flaketriage triage`` comment, a labelled issue).

`Commenter` is where they go; `MarkdownCommenter` appends them to a Markdown file per issue (the
embedded default, next to the Markdown issues); `GitHubCommenter`
(`flaketriage.workers.report.github_sink`) comments on the issue itself. `open_commenter` picks
the one the settings ask for.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Protocol

from flaketriage.errors import ReportError
from flaketriage.files.atomic import write_atomic
from flaketriage.files.lock import locked
from flaketriage.files.modes import OWNER_ONLY, FileModes
from flaketriage.settings import Settings
from flaketriage.workers.report.base import ReportRef


class Commenter(Protocol):
    def comment(self, repository: str, issue: int, body: str) -> ReportRef: ...


class MarkdownCommenter:
    """Comments as ``<directory>/<owner>__<repo>__<issue>.md``, newest last."""

    def __init__(self, directory: Path, *, modes: FileModes = OWNER_ONLY) -> None:
        self.directory = Path(directory)
        self.modes = modes
        """The store's (`FileModes.of`): a reply quotes the failure, owner-only unless shared."""

    def path_for(self, repository: str, issue: int) -> Path:
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", repository.replace("/", "__"))
        return self.directory / f"{safe}__{int(issue)}.md"

    def comment(self, repository: str, issue: int, body: str) -> ReportRef:
        path = self.path_for(repository, issue)
        try:
            self.modes.make_dirs(self.directory)
            with locked(self.directory / ".comments.lock", self.modes.file):
                old = path.read_bytes() if path.exists() else f"# {repository}#{issue}\n".encode()
                write_atomic(path, old + b"\n---\n\n" + body.encode("utf-8") + b"\n", mode=self.modes.file)
        except OSError as exc:
            raise ReportError(f"cannot write the comment for {repository}#{issue} to {path}: {exc}") from exc
        return ReportRef(kind="markdown", location=str(path), created=False)


def open_commenter(settings: Settings) -> Commenter:
    """A `GitHubCommenter` when GitHub is configured, else Markdown files in ``<issues>/comments``."""
    from flaketriage.workers.report.backend import github_client

    client = github_client(settings)
    if client is None:
        return MarkdownCommenter(
            settings.resolved_issues_dir() / "comments", modes=FileModes.of(settings.store_shared)
        )
    from flaketriage.workers.report.github_sink import GitHubCommenter

    return GitHubCommenter(client)
