"""`MarkdownCheckSink`: the pull request's check run as a Markdown file,
``<directory>/<owner>/<name>/<head_sha>.md`` (``FLAKETRIAGE_CHECKS_DIR``, default
``<store>/checks``), rewritten in place (atomically) on each publish.

The path is made only of a validated ``owner/name`` (lower case, as GitHub's names are not case
sensitive) and a whole commit id, and checked to stay inside the directory, so no summary can write
anywhere else.
"""

from __future__ import annotations

from pathlib import Path

from flaketriage.errors import ReportError
from flaketriage.files import atomic
from flaketriage.files.modes import OWNER_ONLY, FileModes
from flaketriage.workers.report.checks.base import (
    CheckOutput,
    CheckRef,
    CheckSink,
    CheckSummary,
    check_head_sha,
    split_repository,
)
from flaketriage.workers.report.checks.render import render_check

_STATUS_WORDS = {"in_progress": "in progress", "completed": "completed"}


class MarkdownCheckSink(CheckSink):
    """Check runs as files ``<directory>/<owner>/<name>/<head sha>.md`` (``FLAKETRIAGE_CHECKS_DIR``,
    created on first write with `modes`: a run names tests and failure messages, so it is its
    owner's alone unless the store is shared)."""

    kind = "markdown"

    def __init__(self, directory: Path | str, *, modes: FileModes = OWNER_ONLY) -> None:
        self.directory = Path(directory)
        self.modes = modes

    def path_for(self, repository: str, head_sha: str) -> Path:
        """Where the check run of `repository` at `head_sha` is; `ReportError` for an unsafe name."""
        owner, name = split_repository(repository)
        path = self.directory / owner.lower() / name.lower() / f"{check_head_sha(head_sha)}.md"
        root = self.directory.resolve()
        if not path.resolve().is_relative_to(root):  # a symbolic link inside pointing elsewhere
            raise ReportError(
                f"the check run file {path} would be outside {root} (a symbolic link in the way); "
                "remove the link or point the sink at another directory"
            )
        return path

    def publish(self, summary: CheckSummary, existing: str | None = None) -> CheckRef:
        """Write the file; `existing` changes nothing (the path follows from the repository and the
        commit, so an earlier file is always the one rewritten)."""
        path = self.path_for(summary.repository, summary.head_sha)
        output = render_check(summary)
        try:
            self.modes.make_dirs(path.parent)
            atomic.write_atomic(path, document(output).encode("utf-8"), mode=self.modes.file)
        except OSError as exc:
            raise ReportError(
                f"cannot write the check run {path} ({exc.strerror or exc}); make {self.directory} "
                "writable and check free space"
            ) from exc
        return CheckRef(kind="markdown", location=str(path), url=None)


def document(output: CheckOutput) -> str:
    """The file's text: the title, the status and conclusion in words, the summary, then the text."""
    conclusion = "Conclusion" if output.status == "completed" else "Conclusion so far"
    head = f"**Status**: {_STATUS_WORDS[output.status]} · **{conclusion}**: {output.conclusion}"
    return f"# {output.title}\n\n{head}\n\n{output.summary}\n\n{output.text}\n"


__all__ = ["MarkdownCheckSink", "document"]
