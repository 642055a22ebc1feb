"""`GitHubIssueSink`: one GitHub issue per failure fingerprint; `GitHubCommenter`: replies on issues.

The issue body is the same document the Markdown sink writes (`IssueRecord.body_text`): the
bookkeeping comment, a hidden ``flaketriage-fingerprint: <fp>`` marker, the evidence and the
occurrences. Nothing is kept outside GitHub, so any number of processes share the issues:

- **Finding** an issue: the marker through the search API (``"<marker>" repo:o/r in:body``); when
  search finds none (its index lags behind new issues) or fails, every issue labelled
  ``flaketriage`` is listed and its body read. Each process remembers the numbers it found.
- **Racing** filers: after filing, the filer lists the labelled issues created around its own;
  when an older one has the same fingerprint, its own is closed as a duplicate of it and the
  occurrence goes to the older one. Every racer settles on the same (lowest-numbered) issue.
- **Retries**: a draft's idempotency key (the triage that reports) is recorded in the metadata and
  in the comment it caused, so upserting the same draft again changes nothing.
- **Recurrences** replace the evidence, count the occurrence and comment once with the new
  evidence; within `comment_interval_s` of the last flaketriage comment, that comment is edited
  instead. A closed issue whose failure returns is reopened with a comment.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from flaketriage.errors import IssueTrackerError, ReportError
from flaketriage.text.titles import clip
from flaketriage.workers.report.base import (
    MARKER_TAG,
    IssueDraft,
    IssueRecord,
    IssueSink,
    ReportRef,
    check_fingerprint,
    marker,
    utc_now,
)
from flaketriage.workers.report.github_client import GitHubClient

if TYPE_CHECKING:
    from github.Issue import Issue

log = logging.getLogger("flaketriage.workers.report")

LABEL = "flaketriage"
MAX_BODY = 65536
"""GitHub refuses an issue or comment body longer than this (characters)."""
MAX_TITLE = 256
MAX_COMMENT_ENTRIES = 20
SETTLE_WINDOW = timedelta(minutes=10)
"""Racing filers create their issues within seconds; the settle step looks this far around its own."""
KEEP_BUNDLES = 100
"""When a body would pass `MAX_BODY` even with its evidence cut, only the newest bundles stay listed."""

LABELS: dict[str, tuple[str, str]] = {
    LABEL: ("5319e7", "Filed by flaketriage"),
    "deterministic": ("b60205", "Reproduces on every replay"),
    "flaky": ("fbca04", "Reproduces only sometimes; quarantined"),
    "order_dependent": ("d93f0b", "Fails only after certain other tests"),
    "different_failure": ("c2e0c6", "Replays fail another way"),
    "not_reproduced": ("cfd3d7", "Did not reproduce on replay"),
    "environment_specific": ("0e8a16", "Reproduces on some runners and never on others"),
    "environment": ("cfd3d7", "No replay could run in the bundle's environment"),
    "suspected-environment": ("0e8a16", "Reproduces only on the original runner or hardware"),
}
"""The labels flaketriage manages (created with these colours when missing), verdicts among them:
an update drops the verdict labels that no longer apply and keeps every label a person added."""

_COMMENT_TAG = "flaketriage-comment"
_COMMENT_META_RE = re.compile(r"<!--\s*" + _COMMENT_TAG + r"\s+(\{.*?\})\s*-->", re.DOTALL)


class GitHubIssueSink(IssueSink):
    """Issues in the repository of `client`; `clock` dates records and paces comments."""

    kind = "github"

    def __init__(
        self,
        client: GitHubClient,
        *,
        comment_interval_s: float = 600.0,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.client = client
        self.comment_interval = timedelta(seconds=comment_interval_s)
        self._clock = clock
        self._numbers: dict[str, int] = {}
        self._labels: set[str] | None = None
        self._lock = threading.RLock()

    @property
    def repo_name(self) -> str:
        return self.client.config.repo

    # -- IssueSink ----------------------------------------------------------------------------
    def check(self) -> None:
        """Sign in and open the repository: bad credentials, a wrong name, issues disabled fail here."""
        self.client.repo()

    def upsert(self, draft: IssueDraft) -> ReportRef:
        fingerprint = check_fingerprint(draft.fingerprint)
        draft = replace(draft, title=_title(draft))  # the bookkeeping keeps the title GitHub shows
        with self._lock:
            self._ensure_labels(draft.labels)
            found = self._find(fingerprint)
            if found is None:
                issue = self._create(draft)
                found = self._settle(fingerprint, issue)
                if found is None:
                    return ReportRef(kind="github", location=issue.html_url, created=True)
            return self._recur(*found, draft)

    def find(self, fingerprint: str) -> ReportRef | None:
        with self._lock:
            found = self._find(check_fingerprint(fingerprint))
        return None if found is None else ReportRef(kind="github", location=found[0].html_url, created=False)

    def get(self, fingerprint: str) -> IssueRecord | None:
        with self._lock:
            found = self._find(check_fingerprint(fingerprint))
        if found is None:
            return None
        issue, record = found
        return replace(record, state="closed" if issue.state == "closed" else "open")

    def close(self, fingerprint: str, comment: str) -> ReportRef | None:
        fingerprint = check_fingerprint(fingerprint)
        with self._lock:
            found = self._find(fingerprint)
            if found is None:
                return None
            issue, record = found
            if issue.state != "closed":
                meta = {"fingerprint": fingerprint, "close": True}
                with self._calling(f"commenting on issue #{issue.number} before closing it"):
                    issue.create_comment(_fit(_comment_meta(meta) + "\n" + comment))
                record = record.closed(comment, self._clock())
                with self._calling(f"closing issue #{issue.number}"):
                    issue.edit(body=fit_body(record), state="closed", state_reason="completed")
        return ReportRef(kind="github", location=issue.html_url, created=False)

    # -- finding ------------------------------------------------------------------------------
    def _find(self, fingerprint: str) -> tuple[Issue, IssueRecord] | None:
        number = self._numbers.get(fingerprint)
        if number is not None:
            found = self._load(number, fingerprint)
            if found is not None:
                return found
            del self._numbers[fingerprint]
        numbers = self._search(fingerprint)
        for n in sorted(numbers or ()):
            found = self._load(n, fingerprint)
            if found is not None:
                self._numbers[fingerprint] = n
                return found
        matches = self._listed(fingerprint)
        if not matches:
            return None
        issue, record = matches[0]
        self._numbers[fingerprint] = issue.number
        return issue, record

    def _search(self, fingerprint: str) -> list[int] | None:
        """Issue numbers whose body has the marker, by the search API; None when search failed."""
        query = f'"{marker(fingerprint)}" repo:{self.repo_name} in:body'
        try:
            with self._calling("searching issues for the fingerprint marker"):
                found = []
                for i, item in enumerate(self.client.github.search_issues(query)):
                    if i >= 30:
                        break
                    if marker(fingerprint) in (item.body or ""):
                        found.append(item.number)
                return found
        except IssueTrackerError as exc:
            if exc.status == 401:
                raise
            log.warning("GitHub search failed, listing labelled issues instead: %s", exc)
            return None

    def _listed(self, fingerprint: str, since: datetime | None = None) -> list[tuple[Issue, IssueRecord]]:
        """The labelled issues of this fingerprint (duplicates left out), oldest first."""
        found = []
        kwargs: dict[str, Any] = {"state": "all", "labels": [LABEL], "sort": "created", "direction": "asc"}
        if since is not None:
            kwargs["since"] = since
        with self._calling(f"listing the issues labelled {LABEL}"):
            for issue in self.client.repo().get_issues(**kwargs):
                if issue.pull_request is None and marker(fingerprint) in (issue.body or ""):
                    record = self._record(issue, fingerprint)
                    if record is not None:
                        found.append((issue, record))
        return sorted(found, key=lambda pair: pair[0].number)

    def _load(self, number: int, fingerprint: str) -> tuple[Issue, IssueRecord] | None:
        try:
            with self._calling(f"reading issue #{number}"):
                issue = self.client.repo().get_issue(number)
        except IssueTrackerError as exc:
            if exc.status in (404, 410):  # deleted or transferred since: look again
                return None
            raise
        record = self._record(issue, fingerprint)
        return None if record is None else (issue, record)

    def _record(self, issue: Issue, fingerprint: str) -> IssueRecord | None:
        """The flaketriage record in `issue`'s body, when it is this fingerprint's (not a duplicate)."""
        try:
            record = IssueRecord.parse(issue.body or "", where=f"issue #{issue.number} of {self.repo_name}")
        except ReportError:
            return None  # a person's issue quoting the marker, or a damaged one: not ours to update
        if record.fingerprint != fingerprint or record.extra.get("duplicate_of"):
            return None
        return record

    # -- filing -------------------------------------------------------------------------------
    def _create(self, draft: IssueDraft) -> Issue:
        record = IssueRecord.new(draft, self._clock())
        if draft.key:  # the filing itself is its key's evidence: no comment owed
            record = _with_comment(record, {"id": None, "at": None, "keys": [draft.key]})
        with self._calling("filing an issue"):
            issue = self.client.repo().create_issue(
                title=_title(draft), body=fit_body(record), labels=list(dict.fromkeys(draft.labels))
            )
        self._numbers[draft.fingerprint] = issue.number
        return issue

    def _settle(self, fingerprint: str, ours: Issue) -> tuple[Issue, IssueRecord] | None:
        """None when `ours` is the fingerprint's issue; else the older one it duplicates (ours closed)."""
        since = ours.created_at - SETTLE_WINDOW
        older = [pair for pair in self._listed(fingerprint, since) if pair[0].number < ours.number]
        if not older:
            return None
        winner, record = older[0]
        self._numbers[fingerprint] = winner.number
        log.info("issue #%s duplicates #%s (filed at the same time); closing it", ours.number, winner.number)
        mine = self._record(ours, fingerprint)
        with self._calling(f"closing issue #{ours.number} as a duplicate of #{winner.number}"):
            ours.create_comment(
                f"Duplicate of #{winner.number}: another flaketriage process filed the same failure at "
                "the same time; its evidence continues there."
            )
            if mine is not None:
                mine = replace(mine, extra={**mine.extra, "duplicate_of": winner.number})
                ours.edit(body=fit_body(mine), state="closed", state_reason="not_planned")
        return winner, record

    # -- updating -----------------------------------------------------------------------------
    def _recur(self, issue: Issue, record: IssueRecord, draft: IssueDraft) -> ReportRef:
        """Count the occurrence (body first: that is what a retry checks), comment, then note the
        comment in the body, so a retry cut short anywhere neither counts nor comments twice."""
        ref = ReportRef(kind="github", location=issue.html_url, created=False)
        reopen = issue.state == "closed"
        info = _comment_info(record)
        counted = record.counted(draft)
        if counted and draft.key in info["keys"] and not reopen:
            return ref  # a retry of an upsert that finished
        if not counted:
            # GitHub's state is the truth (a person may have closed it): recur notes a reopening.
            record = replace(record, state="closed" if reopen else "open").recur(draft, self._clock())
        record = replace(record, state="open")
        if not counted or reopen:
            fields: dict[str, Any] = {"state": "open", "state_reason": "reopened"} if reopen else {}
            with self._calling(f"updating issue #{issue.number}"):
                issue.edit(
                    title=_title(draft),
                    body=fit_body(record),
                    labels=self._labels_for(issue, draft),
                    **fields,
                )
        new_info = self._comment(issue, record, draft, info, reopened=reopen)
        if new_info != info:
            with self._calling(f"recording the comment on issue #{issue.number}"):
                issue.edit(body=fit_body(_with_comment(record, new_info)))
        return ref

    def _comment(
        self, issue: Issue, record: IssueRecord, draft: IssueDraft, info: dict[str, Any], *, reopened: bool
    ) -> dict[str, Any]:
        """Comment the new evidence, or add it to the last comment when that one is recent."""
        now = self._clock()
        keys = [k for k in (draft.key,) if k]
        entry = _entry(record, draft, now)
        last_at = _time(info.get("at"))
        recent = last_at is not None and now - last_at < self.comment_interval
        if info.get("id") and recent and not reopened:
            merged = [*info.get("keys", []), *keys][-50:]
            meta = {"fingerprint": record.fingerprint, "keys": merged}
            try:
                with self._calling(f"updating the last flaketriage comment on issue #{issue.number}"):
                    comment = issue.get_comment(int(info["id"]))
                    body = comment.body or ""
                    if not set(keys) <= set(_comment_keys(body)):  # else a retry: it is there
                        entries = [*_entries(body), entry][-MAX_COMMENT_ENTRIES:]
                        comment.edit(_fit(_comment_text(meta, entries, reopened=False)))
                return {"id": info["id"], "at": info["at"], "keys": merged}
            except IssueTrackerError as exc:
                if exc.status != 404:  # 404: someone deleted it; comment afresh
                    raise
        meta = {"fingerprint": record.fingerprint, "keys": keys}
        with self._calling(f"commenting on issue #{issue.number}"):
            comment = issue.create_comment(_fit(_comment_text(meta, [entry], reopened=reopened)))
        return {"id": comment.id, "at": now.isoformat(), "keys": keys}

    def _labels_for(self, issue: Issue, draft: IssueDraft) -> list[str]:
        current = [label.name for label in issue.labels]
        kept = [name for name in current if name not in LABELS or name == LABEL or name in draft.labels]
        return list(dict.fromkeys([*kept, *draft.labels]))

    def _ensure_labels(self, names: Iterable[str]) -> None:
        """Create flaketriage's labels that the repository lacks (once per sink), with colours."""
        if self._labels is None:
            with self._calling("listing the repository's labels"):
                self._labels = {label.name for label in self.client.repo().get_labels()}
        for name in names:
            if name in self._labels:
                continue
            color, description = LABELS.get(name, ("ededed", "flaketriage"))
            try:
                with self._calling(f"creating the label {name!r}"):
                    self.client.repo().create_label(name, color, description)
            except IssueTrackerError as exc:
                if exc.status != 422:  # 422: another process created it first
                    raise
            self._labels.add(name)

    def _calling(self, doing: str) -> Any:
        return self.client.calling(f"{doing} in {self.repo_name}")


class GitHubCommenter:
    """Answers a triage request with a comment on the issue (or pull request) that asked."""

    def __init__(self, client: GitHubClient) -> None:
        self.client = client

    def comment(self, repository: str, issue: int, body: str) -> ReportRef:
        doing = f"commenting on {repository}#{issue}"
        with self.client.calling(doing):
            repo = self.client.github.get_repo(repository)
            made = repo.get_issue(int(issue)).create_comment(_fit(body))
        return ReportRef(kind="github", location=made.html_url, created=True)


# -- bodies ---------------------------------------------------------------------------------------
def fit_body(record: IssueRecord, limit: int = MAX_BODY) -> str:
    """`record.body_text()` within `limit` characters: the evidence cut first (closing any code
    fence or details block it cuts through), then the occurrence list down to the newest bundles."""
    text = record.body_text()
    if len(text) <= limit:
        return text
    room = limit - (len(text) - len(record.body)) - 400
    if room > 0:
        text = replace(record, body=truncate_markdown(record.body, room)).body_text()
    if len(text) > limit:
        dropped = max(len(record.bundles) - KEEP_BUNDLES, 0)
        slim = replace(
            record,
            body=truncate_markdown(record.body, max(0, limit // 2)),
            bundles=record.bundles[-KEEP_BUNDLES:],
            extra={**record.extra, "bundles_dropped": int(record.extra.get("bundles_dropped", 0)) + dropped},
        )
        text = slim.body_text()
    return text[:limit]


_FENCE_RE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def truncate_markdown(text: str, limit: int) -> str:
    """The first whole lines of `text` within about `limit` characters, with every code fence and
    ``<details>`` block it cuts through closed, and a line saying how much was left out."""
    if len(text) <= limit:
        return text
    kept: list[str] = []
    used = 0
    fence: str | None = None
    details = 0
    for line in text.splitlines():
        if used + len(line) + 1 > limit:
            break
        kept.append(line)
        used += len(line) + 1
        match = _FENCE_RE.match(line)
        if fence is None and match:
            fence = match.group(1)
        elif fence is not None and match and _closes(match.group(1), fence):
            fence = None
        elif fence is None:
            details += line.count("<details>") - line.count("</details>")
    tail = [fence] if fence else []
    tail += ["</details>"] * max(details, 0)
    left = len(text) - used
    tail += ["", f"_… {left} more characters left out (GitHub's body limit); the bundle has them all._"]
    return "\n".join([*kept, *tail])


def _closes(run: str, fence: str) -> bool:
    return run[0] == fence[0] and len(run) >= len(fence)


def _fit(text: str) -> str:
    return text if len(text) <= MAX_BODY else truncate_markdown(text, MAX_BODY - 400)


def _title(draft: IssueDraft) -> str:
    title = " ".join(draft.title.split())
    if not title:
        title = f"[flaketriage] failure {draft.fingerprint[:12]} ({draft.verdict})"
    return clip(title, MAX_TITLE)


def _with_comment(record: IssueRecord, info: dict[str, Any]) -> IssueRecord:
    return replace(record, extra={**record.extra, "comment": info})


def _comment_info(record: IssueRecord) -> dict[str, Any]:
    info = record.extra.get("comment")
    if not isinstance(info, dict):
        return {"id": None, "at": None, "keys": []}
    keys = info.get("keys")
    return {"id": info.get("id"), "at": info.get("at"), "keys": list(keys) if isinstance(keys, list) else []}


def _time(raw: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(raw)) if raw else None
    except ValueError:
        return None


def _comment_meta(meta: dict[str, Any]) -> str:
    text = json.dumps(meta, sort_keys=True).replace("--", "-\\u002d")
    return f"<!-- {_COMMENT_TAG} {text} -->"


def _entry(record: IssueRecord, draft: IssueDraft, now: datetime) -> str:
    minimal = f" (minimized: `{draft.minimal_bundle_id[:12]}`)" if draft.minimal_bundle_id else ""
    evidence = " ".join(draft.evidence.split()) or f"**{draft.verdict}**"
    return (
        f"- {now.strftime('%Y-%m-%d %H:%M UTC')} · occurrence {record.occurrences} · bundle "
        f"`{draft.bundle_id[:12]}`{minimal}: {evidence}"
    )


def _comment_keys(body: str) -> list[str]:
    match = _COMMENT_META_RE.search(body)
    try:
        keys = json.loads(match.group(1)).get("keys", []) if match else []
    except (ValueError, AttributeError):
        return []
    return [str(k) for k in keys] if isinstance(keys, list) else []


def _entries(body: str) -> list[str]:
    return [line for line in body.splitlines() if line.startswith("- ")]


def _comment_text(meta: dict[str, Any], entries: list[str], *, reopened: bool) -> str:
    if reopened:
        head = "**Reopened**: this failure came back after the issue was closed. New evidence:"
    elif len(entries) == 1:
        head = "**Seen again**: this failure came back. New evidence (the issue body has the details):"
    else:
        head = (
            f"**Seen again**, {len(entries)} times in a row; this comment is updated rather than "
            "repeated. New evidence (the issue body has the details):"
        )
    return "\n".join([_comment_meta(meta), head, "", *entries])


__all__ = [
    "LABEL",
    "LABELS",
    "MARKER_TAG",
    "GitHubCommenter",
    "GitHubIssueSink",
    "fit_body",
    "truncate_markdown",
]
