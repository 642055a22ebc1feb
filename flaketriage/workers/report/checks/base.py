"""The pull request's check run, as data: one CI run's failures (`CheckSummary`), the rendered run
(`CheckOutput`), where it went (`CheckRef`), the `CheckSink` base of its sinks, and the names a
sink may trust (an ``owner/name``, a whole commit id, a plain http(s) URL).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Literal
from urllib.parse import quote, urlsplit

from flaketriage.errors import ReportError
from flaketriage.text.printable import printable

CheckState = Literal["quarantined", "flaky", "real", "triaging", "new"]
CheckStatus = Literal["in_progress", "completed"]
CheckConclusion = Literal["success", "failure", "neutral"]

CHECK_NAME = "flaketriage"
"""The check run's name on GitHub (one per head commit, updated in place)."""
MAX_OUTPUT = 65535
"""GitHub's limit on ``output.summary`` and on ``output.text``. It is documented in characters; the
output is fitted to this many UTF-8 bytes, which is never fewer characters, nor UTF-16 units."""
MAX_URL = 2000
_OWNER_OR_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}")
_SHA = re.compile(r"[0-9a-fA-F]{40}|[0-9a-fA-F]{64}")
_URL = re.compile(r"https?://[!-~]+", re.IGNORECASE)
_URL_SAFE = "!#$%&+,-./:;=?@_~"
"""What stays as it is in a link: everything else (``( ) [ ] < > ` ' " \\ *``) is percent-encoded,
so no URL can end the link early or turn into Markdown."""


@dataclass(frozen=True)
class CheckFailure:
    """One failed test of the CI run and what flaketriage knows about it."""

    test_id: str
    variant: str
    """The variant key (``gpu=none,os=linux,python=3.12``); empty when the run has one variant."""
    state: CheckState
    rate: tuple[float, float, float] | None
    """The failure rate (estimate, low, high) as fractions of runs, for flaky and quarantined tests."""
    issue_url: str | None
    case_url: str | None
    message: str | None
    """The failure message (its first line is shown)."""
    jobs: tuple[str, ...]
    """The jobs it failed in."""
    passed_on_retry: bool


@dataclass(frozen=True)
class CheckSummary:
    """One CI run of a pull request's head commit, as its check run shows it."""

    repository: str
    """``owner/name``: where the check run goes."""
    head_sha: str
    pull_request: int | None
    tests: int
    """Tests that ran."""
    failures: tuple[CheckFailure, ...]
    """Failures of the jobs not in `storm_jobs` (an outage's are not listed one by one)."""
    storm_jobs: tuple[str, ...]
    """Jobs where most tests failed at once: an infrastructure outage, shown as one line."""
    details_url: str | None


@dataclass(frozen=True)
class CheckOutput:
    """A rendered check run: `title` at most 255 characters, `summary` and `text` Markdown within
    `MAX_OUTPUT` each; `conclusion` is what the run concludes once `status` is completed."""

    title: str
    summary: str
    text: str
    status: CheckStatus
    conclusion: CheckConclusion


@dataclass(frozen=True)
class CheckRef:
    """Where a check run is: `location` is the check run's id as text, or the file's path; `url`
    its page (None for a file). Give `location` back to `CheckSink.publish` to update it."""

    kind: Literal["github", "markdown"]
    location: str
    url: str | None


class CheckSink(ABC):
    """Where check runs go: one per repository and head commit, updated in place."""

    kind: ClassVar[Literal["github", "markdown"]]

    @abstractmethod
    def publish(self, summary: CheckSummary, existing: str | None = None) -> CheckRef:
        """Show `summary` in the check run of its repository and head commit: the one `existing`
        locates (the `CheckRef.location` an earlier publish returned) updated in place, or a new one
        when `existing` is None or gone. Calls for one commit must not run at the same time (the
        caller serializes them). Raises `ReportError` (`IssueTrackerError` for GitHub's refusals)."""


# -- names ------------------------------------------------------------------------------------------
def split_repository(repository: str) -> tuple[str, str]:
    """``owner/name`` as (owner, name), each letters, digits, ``-``, ``_`` and ``.`` (not ``.`` or
    ``..``), as GitHub allows; anything else, a path in particular, is a `ReportError`."""
    owner, slash, name = repository.partition("/")
    if not slash or not all(_OWNER_OR_NAME.fullmatch(p) and p not in (".", "..") for p in (owner, name)):
        raise ReportError(
            f"the repository {printable(repository)!r} is not owner/name (letters, digits, '-', '_' "
            "and '.'); pass the repository the CI run belongs to, as GitHub names it"
        )
    return owner, name


def check_head_sha(sha: str) -> str:
    """`sha` in lower case when it is a whole commit id (40 or 64 hex digits); else `ReportError`."""
    if not _SHA.fullmatch(sha):
        raise ReportError(
            f"the head commit {printable(sha)!r} is not a whole commit id (40 or 64 hex digits); pass "
            "the pull request's head SHA as GitHub reports it"
        )
    return sha.lower()


def safe_url(url: str | None) -> str | None:
    """`url` fit for a Markdown link and GitHub's ``details_url``: an ``http(s)`` URL of printable
    ASCII with a host, with the characters Markdown cares about percent-encoded; None otherwise."""
    if url is None or len(url) > MAX_URL or not _URL.fullmatch(url):
        return None
    try:
        host = urlsplit(url).netloc
    except ValueError:  # a broken IPv6 host ("http://[::1")
        return None
    return quote(url, safe=_URL_SAFE) if host else None
