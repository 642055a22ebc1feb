"""Links between cases about one CI run: a failed ``workflow_run`` or ``check_run`` and the failures
captured in that run, found by the run URL both record.

A captured failure's provenance names its run as the CI probes build it,
``$GITHUB_SERVER_URL/$GITHUB_REPOSITORY/actions/runs/$GITHUB_RUN_ID``; a workflow run's ``html_url``
is that same URL; a check run's ``html_url`` names the check (``.../runs/<check id>``) and its
``details_url`` the job (``.../actions/runs/<run id>/job/<job id>``). `run_url` turns each into the
run's URL, which the GitHub webhooks record as ``provenance.run_url`` and the links compare. The
link is read when a case is, so it holds whichever of the two arrived first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from sqlalchemy import Text, cast, or_, select
from sqlalchemy.orm import Session

from flaketriage.orchestrator.api_models import CaseLink
from flaketriage.records import Case, Occurrence

MAX_URL = 2000
"""A run URL longer than this names no run (GitHub's are under 200 characters)."""
RUNS_COMPARED = 20
"""The latest runs of a case whose other cases are looked up: a workflow's case gathers a run per
failure, and the newest are those a reader follows."""
MAX_LINKS = 50

_RUN = re.compile(
    r"(?P<base>https?://[A-Za-z0-9.-]+(?::[0-9]{1,5})?(?:/[A-Za-z0-9_.-]+){2,4})"
    r"/actions/runs/(?P<run>[0-9]{1,20})(?:[/?#]|\Z)"
)


def run_url(*candidates: object) -> str | None:
    """The Actions run the first URL among `candidates` that names one belongs to (its job, an
    attempt, a query dropped), as ``https://<host>/<owner>/<repo>/actions/runs/<id>``; None when
    none does (not a string, too long, not an Actions run's URL)."""
    for url in candidates:
        if not isinstance(url, str) or len(url) > MAX_URL:
            continue
        match = _RUN.match(url)
        if match:
            return f"{match.group('base')}/actions/runs/{match.group('run')}"
    return None


def linked_cases(session: Session, case: Case) -> list[CaseLink]:
    """The other cases an occurrence of which names a run one of `case`'s occurrences names."""
    runs = _latest_runs(o.provenance for o in reversed(case.occurrence_rows))
    if not runs:
        return []
    rows = session.execute(
        select(Case.id, Case.kind, Case.title, Occurrence.provenance)
        .join(Occurrence, Occurrence.case_id == Case.id)
        # Matched in the JSON's text, then read: extracting a field fails on PostgreSQL for every
        # row whose JSON holds an escaped NUL anywhere, which any sender may put in a provenance.
        .where(
            Case.id != case.id,
            or_(*(cast(Occurrence.provenance, Text).contains(f'{url}"', autoescape=True) for url in runs)),
        )
        .order_by(Case.id)
        .limit(MAX_LINKS * 4)
    ).all()
    links: dict[int, CaseLink] = {}
    for ident, kind, title, provenance in rows:
        url = run_url((provenance or {}).get("run_url"))
        if url in runs and ident not in links and len(links) < MAX_LINKS:
            links[ident] = CaseLink(id=ident, kind=kind, title=title, run_url=url)
    return list(links.values())


def _latest_runs(provenances: Iterable[dict[str, object] | None]) -> list[str]:
    runs: list[str] = []
    for provenance in provenances:
        url = run_url((provenance or {}).get("run_url"))
        if url is not None and url not in runs:
            runs.append(url)
            if len(runs) == RUNS_COMPARED:
                break
    return runs
