"""`render_check`: a `CheckSummary` as a check run's title, status, conclusion and Markdown.

Everything that comes from outside (test ids, variants, job names, messages) is shown in code spans
after `flaketriage.text.printable.printable`, so it is one line of encodable text (a NUL or a lone
surrogate written as its escape) that makes no link, image, HTML, mention or ``#123`` reference and
never starts a line of its own (a ``flaketriage-bundle:`` line would start a triage). URLs become
links only through `safe_url`; any other is shown as text. Each of the summary and the text is
fitted to GitHub's limit, the longest lists cut first, saying how many entries were left out.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from flaketriage.text.markdown import code_span
from flaketriage.text.printable import printable
from flaketriage.text.titles import clip
from flaketriage.workers.report.checks.base import (
    MAX_OUTPUT,
    CheckConclusion,
    CheckFailure,
    CheckOutput,
    CheckState,
    CheckSummary,
    check_head_sha,
    safe_url,
    split_repository,
)

MAX_TITLE = 255
MAX_ID = 300
MAX_MESSAGE = 300
MAX_NAME = 100
"""Characters of one job name or variant shown."""
MAX_JOBS = 5
"""Job names shown per failure, and (times four) per infrastructure outage."""
MAX_ENTRIES = MAX_OUTPUT // len("- `x`\n\n") + 1
"""Entries rendered per section at most: more could never fit (the rest are only counted)."""

ORDER: tuple[CheckState, ...] = ("real", "new", "triaging", "flaky", "quarantined")
_HEADINGS = {
    "real": ("Real failure", "Real failures"),
    "new": ("New failure", "New failures"),
    "triaging": ("Being triaged", "Being triaged"),
    "flaky": ("Known flaky", "Known flaky"),
    "quarantined": ("Quarantined, known flaky", "Quarantined, known flaky"),
}
_MEANING = {
    "real": "fails for a reason that needs a fix",
    "new": "not seen before; no verdict yet",
    "triaging": "being replayed now; this check is updated when the verdict is in",
    "flaky": "fails only some of the time, whatever the change",
    "quarantined": "known flaky and quarantined: its failures do not count",
}


# -- rendering ----------------------------------------------------------------------------------------
def render_check(summary: CheckSummary) -> CheckOutput:
    """The check run for `summary`. Failures are grouped real, new, triaging, flaky, quarantined,
    each group sorted by test id (then variant).

    `status` is ``in_progress`` while any failure is being triaged, since verdicts are still to
    come; ``completed`` otherwise. A new failure (nothing known about it yet: a suite that sends
    only JUnit XML may never have it triaged) completes the run as a failure; when its bundle's
    triage starts it is ``triaging`` and the run goes back in progress.

    `conclusion`, in this order (the first that applies):

    - ``failure`` when any failure is real or new: something needs a look;
    - ``neutral`` when any is still being triaged (the verdict may go either way) or a job had an
      infrastructure outage (its tests did not really run, so the run cannot vouch for them);
    - ``success`` otherwise: every failure is known flaky (quarantined or not), or nothing failed.

    GitHub completes a check run that is given any conclusion, so sinks send it only with status
    completed; while in progress it is the conclusion so far.
    """
    groups = {state: _sorted(f for f in summary.failures if f.state == state) for state in ORDER}
    in_progress = bool(groups["triaging"])
    if groups["real"] or groups["new"]:
        conclusion: CheckConclusion = "failure"
    elif groups["triaging"] or summary.storm_jobs:
        conclusion = "neutral"
    else:
        conclusion = "success"
    return CheckOutput(
        title=_title(summary, groups),
        summary=_fit(_summary(summary, groups, conclusion, in_progress), [], MAX_OUTPUT),
        text=_fit(_text_head(summary), _sections(groups, safe_url(summary.details_url)), MAX_OUTPUT),
        status="in_progress" if in_progress else "completed",
        conclusion=conclusion,
    )


def _sorted(failures: Iterable[CheckFailure]) -> list[CheckFailure]:
    return sorted(failures, key=lambda f: (f.test_id, f.variant))


def _count(n: int, one: str, many: str) -> str:
    return f"{n:,} {one if n == 1 else many}"


def _title(summary: CheckSummary, groups: dict[CheckState, list[CheckFailure]]) -> str:
    parts = []
    if groups["real"]:
        parts.append(_count(len(groups["real"]), "real failure", "real failures"))
    if groups["new"]:
        parts.append(_count(len(groups["new"]), "new failure", "new failures"))
    if groups["triaging"]:
        parts.append(f"{len(groups['triaging']):,} being triaged")
    known = len(groups["flaky"]) + len(groups["quarantined"])
    if known:
        parts.append(f"{known:,} known flaky")
    if summary.storm_jobs:
        parts.append("infrastructure outage in " + _count(len(summary.storm_jobs), "job", "jobs"))
    if not parts:
        parts.append(
            f"All {_count(summary.tests, 'test', 'tests')} passed" if summary.tests else "No tests ran"
        )
    title = ", ".join(parts)
    return clip(title[:1].upper() + title[1:], MAX_TITLE)


def _code(text: str, limit: int) -> str:
    """Outside text as one inert code span: control characters, NULs and lone surrogates escaped,
    cut at `limit` characters."""
    return code_span(clip(printable(text), limit))


def _names(names: Sequence[str], limit: int) -> str:
    shown = ", ".join(_code(name, MAX_NAME) for name in names[:limit])
    more = len(names) - limit
    return f"{shown} and {more:,} more" if more > 0 else shown


def _intro(summary: CheckSummary) -> str:
    owner, name = split_repository(summary.repository)
    sha = check_head_sha(summary.head_sha)
    where = f"pull request #{summary.pull_request}, " if summary.pull_request is not None else ""
    return f"flaketriage on {code_span(f'{owner}/{name}')} ({where}commit {code_span(sha[:12])})"


def _text_head(summary: CheckSummary) -> str:
    if not summary.failures:
        return "No failures to list."
    return "## Failures by verdict\n\nEach test as reported, with the jobs it failed in and its message."


def _summary(
    summary: CheckSummary,
    groups: dict[CheckState, list[CheckFailure]],
    conclusion: CheckConclusion,
    in_progress: bool,
) -> str:
    failed = len(summary.failures)
    retried = sum(f.passed_on_retry for f in summary.failures)
    again = f" ({retried:,} of them passed on retry)" if retried else ""
    outside = " outside the outage" if summary.storm_jobs else ""
    ran = _count(summary.tests, "test", "tests")
    lines = [f"**{_intro(summary)}**: {ran} ran, {failed:,} failed{outside}{again}."]
    rows = [(state, len(groups[state])) for state in ORDER if groups[state]]
    if rows:
        lines += ["", "| Verdict | Tests | What it means |", "| --- | ---: | --- |"]
        lines += [f"| {_HEADINGS[s][n != 1]} | {n:,} | {_MEANING[s]} |" for s, n in rows]
    if summary.storm_jobs:
        lines += ["", _outage(summary.storm_jobs)]
    so_far = " so far" if in_progress else ""
    lines += ["", f"**Conclusion{so_far}: {conclusion}**: {_why(groups, summary.storm_jobs)}"]
    if in_progress:
        waiting = len(groups["new"]) + len(groups["triaging"])
        lines += [
            "",
            f"**Status: in progress**: {_count(waiting, 'failure awaits', 'failures await')} a "
            "verdict; this check is updated in place as verdicts arrive.",
        ]
    url = safe_url(summary.details_url)
    if url:
        lines += ["", f"[All the details]({url})"]
    return "\n".join(lines)


def _outage(jobs: Sequence[str]) -> str:
    one = len(jobs) == 1
    return (
        f"**Infrastructure outage** in {_count(len(jobs), 'job', 'jobs')} ({_names(jobs, 4 * MAX_JOBS)}): "
        f"most of {'its' if one else 'their'} tests failed at once, which points at the runner or a "
        "service rather than at the tests, so those failures are not listed one by one. Rerun "
        f"{'it' if one else 'them'}."
    )


def _why(groups: dict[CheckState, list[CheckFailure]], storm: Sequence[str]) -> str:
    if groups["real"] or groups["new"]:
        return "real or new failures need a look."
    if groups["triaging"]:
        return "no real failure so far; the failures being triaged may still turn out real."
    if storm:
        return "no real failure among the tests that ran, but the outage's jobs must run again."
    if groups["flaky"] or groups["quarantined"]:
        return "every failure is a known flaky test."
    return "nothing failed."


def _sections(groups: dict[CheckState, list[CheckFailure]], details: str | None) -> list[_Section]:
    sections = []
    for state in ORDER:
        failures = groups[state]
        if failures:
            heading = f"### {_HEADINGS[state][len(failures) != 1]}: {len(failures):,}"
            entries = [_entry(f) for f in failures[:MAX_ENTRIES]]
            sections.append(_Section(state, heading, entries, len(failures), details))
    return sections


def _entry(failure: CheckFailure) -> str:
    parts = [_code(failure.test_id, MAX_ID)]
    if failure.variant:
        parts.append(_code(failure.variant, MAX_NAME))
    if failure.jobs:
        parts.append(f"failed in {_names(failure.jobs, MAX_JOBS)}")
    if failure.passed_on_retry:
        parts.append("passed on retry")
    if failure.rate is not None and failure.state in ("flaky", "quarantined"):
        parts.append(_rate(failure.rate))
    parts += [link for link in (_link("issue", failure.issue_url), _link("case", failure.case_url)) if link]
    line = "- " + " · ".join(parts)
    first = next((part for part in (failure.message or "").splitlines() if part.strip()), "")
    # A hard line break (a backslash ending the line): the message under the test, not beside it.
    return f"{line}\\\n  {_code(' '.join(first.split()), MAX_MESSAGE)}" if first else line


def _rate(rate: tuple[float, float, float]) -> str:
    estimate, low, high = (min(max(value, 0.0), 1.0) for value in rate)
    return f"fails in {_percent(estimate)} of runs ({_percent(low)} to {_percent(high)})"


def _percent(value: float) -> str:
    scaled = 100 * value
    return f"{scaled:.1f}%" if 0 < scaled < 1 else f"{scaled:.0f}%"


def _link(label: str, url: str | None) -> str | None:
    if url is None:
        return None
    safe = safe_url(url)
    return f"[{label}]({safe})" if safe else f"{label}: {_code(url, MAX_ID)}"


# -- fitting GitHub's limit ------------------------------------------------------------------------
def _size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


@dataclass
class _Section:
    state: CheckState
    heading: str
    entries: list[str]
    total: int
    """Entries in all, `entries` the first of them."""
    details: str | None

    def __post_init__(self) -> None:
        self.ends = list(itertools.accumulate(_size(e) + 2 for e in self.entries))  # "\n\n" after each

    def kept(self, cap: int) -> int:
        """How many entries fit in `cap` bytes."""
        return bisect.bisect_right(self.ends, cap)

    def render(self, cap: int | None = None) -> str:
        keep = len(self.entries) if cap is None else self.kept(cap)
        lines = [self.heading, *self.entries[:keep]]
        if keep < self.total:
            lines.append(self.note(self.total - keep))
        return "\n\n".join(lines)

    def note(self, left: int) -> str:
        where = f" [All the details]({self.details})." if self.details else ""
        noun = _HEADINGS[self.state][left != 1].lower()
        return (
            f"_… and {left:,} more ({noun}) left out: GitHub shows at most {MAX_OUTPUT:,} characters "
            f"of a check run's text, and the longest lists are cut first._{where}"
        )


def _fit(head: str, sections: list[_Section], limit: int) -> str:
    """`head` and `sections` within `limit` UTF-8 bytes: while they do not fit, the longest sections
    are cut first (every section to the same number of bytes, the most that fits), each saying how
    many entries it left out."""

    def joined(cap: int | None) -> str:
        return "\n\n".join([head, *(section.render(cap) for section in sections)])

    text = joined(None)
    if _size(text) <= limit:
        return text
    if sections:
        low, high = 0, max(section.ends[-1] for section in sections)
        while low < high:  # the largest cap that fits; cap 0 (headings and notes only) always does
            mid = (low + high + 1) // 2
            if _size(joined(mid)) <= limit:
                low = mid
            else:
                high = mid - 1
        text = joined(low)
    return text if _size(text) <= limit else _cut(text, limit)


def _cut(text: str, limit: int) -> str:
    """The whole lines of `text` that fit in `limit` bytes with a note (a last resort: the summary
    is made to fit, and so are sections)."""
    note = "\n\n_… cut to fit GitHub's limit on a check run's output._"
    room = limit - _size(note)
    kept = text.encode("utf-8", "surrogatepass")[:room].decode("utf-8", "ignore")
    return kept[: kept.rfind("\n")] + note if "\n" in kept else kept + note
