"""GitHub webhooks: failed workflow runs and check runs, labelled issues and ``/flaketriage`` comments.

* ``workflow_run`` / ``check_run`` completed with conclusion ``failure`` open or update a case for the
  workflow (or check) in that repository; an occurrence records the run (head SHA, URL, attempt);
  a check run's ``run_url`` is the Actions run its ``details_url`` names, when it names one.
  Each ``flaketriage-bundle: <id>`` line in a check run's ``output.summary`` or ``output.text``
  starts a triage of that bundle.
* ``issues`` labelled ``flaketriage`` triage the bundles the issue names, and
  ``issue_comment`` with ``/flaketriage triage <bundle-id>`` triages that bundle; the result is
  commented back on the issue. A comment asks only when its author may: an owner, member or
  collaborator of the repository (GitHub's ``author_association``); anyone else's command is
  acknowledged, ignored and said so.
* A label asks only when whoever chose it may, as a comment does. GitHub's ``issues`` payload names
  the labeller (``sender``) but not their association; it gives only the issue author's. So:
  a person (not a bot) labelling someone else's issue may ask, as labelling another's issue takes
  triage access. An issue opened with the label, or labelled by its own author, asks only when the
  author is an owner, member or collaborator: an issue template applies its labels for anyone who
  opens an issue with it (the ``opened`` and ``labeled`` events then come from the author). A bot
  (``sender.type`` ``Bot``: a workflow or an app labelling by the issue's text) asks for the author
  too, whose text it acted on. A label that may not ask is acknowledged, ignored and said so.
* Everything else (``ping`` included) is acknowledged and ignored.

A delivery is recorded by what its body is about (`Parsed.subject`), not by ``X-GitHub-Delivery``:
GitHub signs the body only, so a captured body re-sent under a new delivery id must be the same
delivery (a duplicate), never a new triage or occurrence. The keys: a workflow run's id and attempt,
a check run's id and ``completed_at``, an issue's id with the action, the label and the issue's
``updated_at`` (the label put on again later is another request), a comment's id and
``updated_at``.

Payloads are read leniently (GitHub adds fields all the time) but what is used is type-checked.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from flaketriage.orchestrator.intake import Sighting
from flaketriage.orchestrator.payloads import Parsed, field_of, subject
from flaketriage.orchestrator.run_links import run_url
from flaketriage.orchestrator.sightings import StorePolicy, bundle_ids, resolve_bundles
from flaketriage.text.titles import clip

LABEL = "flaketriage"
COMMANDERS = frozenset({"OWNER", "MEMBER", "COLLABORATOR"})
"""The ``author_association`` values whose ``/flaketriage`` comments are obeyed."""
COMMAND = re.compile(
    r"^[ \t]*/flaketriage[ \t]+triage[ \t]+([0-9a-f]{12,64})[ \t\r]*$", re.MULTILINE | re.IGNORECASE
)
"""A ``/flaketriage triage <bundle-id>`` line of a comment (blanks as in `BUNDLE_LINE`)."""


CHECK_RUN_NAME = "flaketriage"
"""The name of flaketriage's own pull request check run (`flaketriage.workers.report.checks.CHECK_NAME`;
the service does not import the workers, a test keeps the two equal): its failing is no new failure."""


def _fingerprint(*parts: str) -> str:
    return hashlib.sha256("|".join(parts).encode("utf-8")).hexdigest()


def parse(event: str, payload: dict[str, Any], policy: StorePolicy) -> Parsed:
    """The sightings of one GitHub delivery (``X-GitHub-Event`` = `event`), and what it is about."""
    action = payload.get("action")
    if event == "workflow_run" and action == "completed":
        parsed = _workflow_run(payload)
        parsed.subject = _subject(event, "workflow_run.id", "workflow_run.run_attempt", payload=payload)
    elif event == "check_run" and action == "completed":
        parsed = _check_run(payload, policy)
        parsed.subject = _subject(event, "check_run.id", "check_run.completed_at", payload=payload)
    elif event == "issues" and action in ("labeled", "opened"):
        parsed = _issue(payload, policy)
        parsed.subject = _subject(
            event, "issue.id", "action", "label.name", "issue.updated_at", payload=payload
        )
    elif event == "issue_comment" and action == "created":
        parsed = _comment(payload, policy)
        parsed.subject = _subject(event, "comment.id", "comment.updated_at", payload=payload)
    else:
        parsed = Parsed(handled=False)
    return parsed


def _subject(event: str, identifier: str, *more: str, payload: dict[str, Any]) -> str | None:
    """The key of a body: `event`, its `identifier` field (None without one: the delivery id is
    the key then) and the `more` fields that tell its events apart (a field it lacks is empty)."""
    found = field_of(payload, identifier, (int, str), required=False)
    if found is None:
        return None
    values = (field_of(payload, path, (int, str), required=False) for path in more)
    return subject(event, found, *("" if value is None else value for value in values))


def _workflow_run(payload: dict[str, Any]) -> Parsed:
    run = field_of(payload, "workflow_run", dict)
    if run.get("conclusion") != "failure":
        return Parsed(handled=False)
    repo = field_of(payload, "repository.full_name")
    name = field_of(run, "name", required=False) or field_of(run, "path")
    provenance = {
        "ci_provider": "github-actions",
        "repository": repo,
        "workflow": name,
        "head_sha": field_of(run, "head_sha"),
        "head_branch": field_of(run, "head_branch", required=False),
        "run_url": field_of(run, "html_url"),
        "run_id": field_of(run, "id", int),
        "attempt": str(field_of(run, "run_attempt", int, required=False) or 1),
        "event": field_of(run, "event", required=False),
    }
    sighting = Sighting(
        fingerprint=_fingerprint("github-workflow", repo, name),
        kind="workflow",
        title=f"{repo}: workflow {name} failed",
        job=name,
        repository=repo,
        provenance=provenance,
        trigger="never",
    )
    return Parsed(handled=True, sightings=[sighting])


def _check_run(payload: dict[str, Any], policy: StorePolicy) -> Parsed:
    check = field_of(payload, "check_run", dict)
    if check.get("conclusion") != "failure":
        return Parsed(handled=False)
    if check.get("name") == CHECK_RUN_NAME:
        # flaketriage's own pull request check run failing says what flaketriage already knows.
        return Parsed(handled=False, notes=[f"the {CHECK_RUN_NAME} check run is flaketriage's own"])
    repo = field_of(payload, "repository.full_name")
    name = field_of(check, "name")
    output = check.get("output") if isinstance(check.get("output"), dict) else {}
    html = field_of(check, "html_url", required=False)
    details = field_of(check, "details_url", required=False)
    provenance = {
        "ci_provider": "github-checks",
        "repository": repo,
        "check": name,
        "head_sha": field_of(check, "head_sha"),
        # The Actions run the check is a job of (its details_url names it), as captured failures
        # name their run: what links them (`flaketriage.orchestrator.run_links`).
        "run_url": run_url(details, html) or html or details,
        "check_url": html,
        "check_run_id": field_of(check, "id", int),
    }
    parsed = Parsed(
        handled=True,
        sightings=[
            Sighting(
                fingerprint=_fingerprint("github-check", repo, name),
                kind="workflow",
                title=f"{repo}: check {name} failed",
                job=name,
                repository=repo,
                provenance=provenance,
                trigger="never",
            )
        ],
    )
    summary = output.get("summary") if isinstance(output.get("summary"), str) else None
    text = output.get("text") if isinstance(output.get("text"), str) else None
    found, missing = resolve_bundles(bundle_ids(summary, text), policy, trigger="auto", extra=provenance)
    parsed.sightings.extend(found)
    parsed.notes.extend(missing)
    return parsed


def _issue_target(payload: dict[str, Any]) -> dict[str, Any]:
    return {
        "repository": field_of(payload, "repository.full_name"),
        "issue": field_of(payload, "issue.number", int),
    }


def _issue(payload: dict[str, Any], policy: StorePolicy) -> Parsed:
    labels = field_of(payload, "issue.labels", list, required=False) or []
    names = {
        label["name"] for label in labels if isinstance(label, dict) and isinstance(label.get("name"), str)
    }
    added = field_of(payload, "label.name", required=False)
    if (payload.get("action") == "labeled" and added != LABEL) or (LABEL not in names and added != LABEL):
        return Parsed(handled=False)
    refused = _labeller_refused(payload)
    if refused is not None:
        return Parsed(handled=False, notes=[refused])
    target = _issue_target(payload)
    body = field_of(payload, "issue.body", required=False)
    found, missing = resolve_bundles(
        bundle_ids(body), policy, trigger="always", extra={"requested_by": target}
    )
    return Parsed(
        handled=True,
        sightings=[_replying(s, target) for s in found],
        notes=missing or ([] if found else ["the issue names no flaketriage-bundle: <id> line"]),
    )


def _labeller_refused(payload: dict[str, Any]) -> str | None:
    """Why the ``flaketriage`` label on this issue asks nothing, or None when it may ask (see the
    module's docstring): set by a person other than the author, or the author may ask."""
    author = field_of(payload, "issue.user.login", required=False)
    labeller = field_of(payload, "sender.login", required=False)
    bot = field_of(payload, "sender.type", required=False) == "Bot"
    if payload.get("action") == "labeled" and labeller and labeller != author and not bot:
        return None  # only those with triage access label another's issue
    association = field_of(payload, "issue.author_association", required=False)
    if association in COMMANDERS:
        return None
    how = (
        "opened with" if payload.get("action") == "opened" else f"given by {labeller or 'an unknown sender'}"
    )
    return (
        f"the {LABEL} label is ignored: it was {how} on the issue of {author or 'an unknown author'}, "
        f"who is {str(association or 'unknown').lower()} on this repository; an owner, member or "
        "collaborator may ask (label it, or comment /flaketriage triage <bundle-id>)"
    )


def _comment(payload: dict[str, Any], policy: StorePolicy) -> Parsed:
    body = field_of(payload, "comment.body")
    idents = [m.group(1).lower() for m in COMMAND.finditer(body)]
    if not idents:
        return Parsed(handled=False)
    association = field_of(payload, "comment.author_association", required=False)
    if association not in COMMANDERS:
        # Cut: the answer echoes the payload's words, and a payload's may be as long as its body.
        author = clip(field_of(payload, "comment.user.login", required=False) or "the author", 60)
        role = clip(str(association or "unknown"), 30).lower()
        return Parsed(
            handled=False,
            notes=[
                f"/flaketriage ignored: {author} is {role} on this repository; an owner, member or "
                "collaborator may ask"
            ],
        )
    target = _issue_target(payload)
    found, missing = resolve_bundles(idents, policy, trigger="always", extra={"requested_by": target})
    return Parsed(handled=True, sightings=[_replying(s, target) for s in found], notes=missing)


def _replying(sighting: Sighting, target: dict[str, Any]) -> Sighting:
    from dataclasses import replace

    return replace(sighting, reply_to=target)
