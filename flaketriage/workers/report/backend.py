"""Which issue sink the settings ask for: GitHub when a repository and credentials are set, else
Markdown files beside the store. The CLI's ``triage`` and the workers both build theirs here."""

from __future__ import annotations

from flaketriage.files.modes import FileModes
from flaketriage.settings import Settings
from flaketriage.workers.report.base import IssueSink
from flaketriage.workers.report.checks import CheckSink
from flaketriage.workers.report.github_client import GitHubClient, GitHubConfig
from flaketriage.workers.report.markdown import MarkdownIssueSink


def github_client(settings: Settings) -> GitHubClient | None:
    """A client for ``FLAKETRIAGE_GITHUB_REPO``, or None when it is unset. Raises `ConfigError` for a
    repository without credentials, `MissingDependencyError` when PyGithub is not installed."""
    config = GitHubConfig.from_settings(settings)
    return None if config is None else GitHubClient(config)


def open_issue_sink(settings: Settings) -> IssueSink:
    """`GitHubIssueSink` when GitHub is configured, else `MarkdownIssueSink` in the issues directory."""
    client = github_client(settings)
    if client is None:
        return MarkdownIssueSink(settings.resolved_issues_dir(), modes=FileModes.of(settings.store_shared))
    from flaketriage.workers.report.github_sink import GitHubIssueSink

    return GitHubIssueSink(client, comment_interval_s=settings.github_comment_interval_s)


def open_check_sink(settings: Settings) -> CheckSink:
    """`GitHubCheckSink` when GitHub is configured, else `MarkdownCheckSink` in the checks directory."""
    from flaketriage.workers.report.checks import GitHubCheckSink, MarkdownCheckSink

    client = github_client(settings)
    if client is None:
        return MarkdownCheckSink(settings.resolved_checks_dir(), modes=FileModes.of(settings.store_shared))
    return GitHubCheckSink(client)
