"""POST /webhooks/github with GitHub's payloads (``payloads/github_*.json``, shaped as GitHub sends
them): failed workflow and check runs open cases, bundle lines and ``/flaketriage`` commands start
triages, the rest is acknowledged and ignored."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from conftest import Captured, MakeReceiver, Receiver  # tests/orchestrator/conftest.py

Load = Callable[[str], dict[str, Any]]
MISSING = "f" * 64


def _check_run(load_payload: Load, summary: str, text: str = "") -> dict[str, Any]:
    data = load_payload("github_check_run.completed.json")
    data["check_run"]["output"].update(summary=summary, text=text)
    return data


def _issue_labeled(load_payload: Load, body: str) -> dict[str, Any]:
    data = load_payload("github_issues.labeled.json")
    data["issue"]["body"] = body
    return data


def _comment(load_payload: Load, body: str) -> dict[str, Any]:
    data = load_payload("github_issue_comment.created.json")
    data["comment"]["body"] = body
    return data


# -- workflow runs --------------------------------------------------------------------------------
def test_a_failed_workflow_run_opens_a_workflow_case_without_a_triage(
    receiver: Receiver, load_payload: Load
) -> None:
    response = receiver.github("workflow_run", load_payload("github_workflow_run.completed.json"))

    assert response.status_code == 200, response.text
    assert response.json()["outcome"] == "recorded"
    [case] = receiver.cases()
    assert (case.kind, case.status, case.repository, case.job, case.occurrences) == (
        "workflow",
        "open",
        "Codertocat/Hello-World",
        "Build",
        1,
    )
    assert "Build" in case.title and "Codertocat/Hello-World" in case.title
    [occurrence] = receiver.occurrences()
    assert occurrence.source == "github"
    assert occurrence.provenance == {
        "ci_provider": "github-actions",
        "repository": "Codertocat/Hello-World",
        "workflow": "Build",
        "head_sha": "acb5820ced9479c074f688cc328bf03f341a511d",
        "head_branch": "main",
        "run_url": "https://github.com/Codertocat/Hello-World/actions/runs/30433642",
        "run_id": 30433642,
        "attempt": "2",
        "event": "push",
    }
    assert receiver.works() == [] and receiver.sender.sent == []


def test_a_second_run_of_the_same_workflow_is_another_occurrence_of_its_case(
    receiver: Receiver, load_payload: Load
) -> None:
    first = load_payload("github_workflow_run.completed.json")
    second = load_payload("github_workflow_run.completed.json")
    second["workflow_run"].update(
        id=30433999,
        run_number=563,
        run_attempt=1,
        head_sha="b" * 40,
        html_url="https://github.com/Codertocat/Hello-World/actions/runs/30433999",
    )
    assert receiver.github("workflow_run", first).status_code == 200

    response = receiver.github("workflow_run", second)

    assert response.status_code == 200
    [case] = receiver.cases()
    assert response.json()["cases"] == [case.id]
    assert case.occurrences == 2
    assert [(o.provenance["head_sha"], o.provenance["attempt"]) for o in receiver.occurrences()] == [
        ("acb5820ced9479c074f688cc328bf03f341a511d", "2"),
        ("b" * 40, "1"),
    ]


@pytest.mark.parametrize("conclusion", ["success", "cancelled", "skipped", None])
def test_a_workflow_run_that_did_not_fail_is_ignored(
    receiver: Receiver, load_payload: Load, conclusion: str | None
) -> None:
    data = load_payload("github_workflow_run.completed.json")
    data["workflow_run"]["conclusion"] = conclusion

    response = receiver.github("workflow_run", data)

    assert response.status_code == 200
    assert response.json()["outcome"] == "ignored"
    assert receiver.cases() == [] and receiver.sender.sent == []


def test_a_failed_run_without_a_field_it_needs_is_a_422_naming_it(
    receiver: Receiver, load_payload: Load
) -> None:
    data = load_payload("github_workflow_run.completed.json")
    del data["workflow_run"]["head_sha"]

    response = receiver.github("workflow_run", data)

    assert response.status_code == 422
    assert "workflow_run.head_sha" in response.json()["detail"] or "head_sha" in response.json()["detail"]
    assert receiver.counts()["deliveries"] == 0


# -- check runs -----------------------------------------------------------------------------------
def test_a_failed_check_run_naming_two_bundles_triages_both(
    receiver: Receiver, captured: Captured, load_payload: Load
) -> None:
    data = _check_run(
        load_payload,
        summary=f"pytest failed.\n\nflaketriage-bundle: {captured.value_error}\n",
        text=f"More in the log.\r\nflaketriage-bundle: {captured.key_error.upper()}\r\n",
    )

    response = receiver.github("check_run", data)

    assert response.status_code == 202, response.text
    body = response.json()
    assert body["outcome"] == "accepted" and body["notes"] == []
    check, first, second = receiver.cases()
    assert (check.kind, check.job, check.repository) == (
        "workflow",
        "pytest (3.11, gpu)",
        "Codertocat/Hello-World",
    )
    assert [c.fingerprint for c in (first, second)] == [
        captured.manifest(captured.value_error).failure.fingerprint,
        captured.manifest(captured.key_error).failure.fingerprint,
    ]
    works = receiver.works()
    assert [(w.case_id, w.bundle_id) for w in works] == [
        (first.id, captured.value_error),
        (second.id, captured.key_error),
    ]
    assert body["work"] == [w.id for w in works]
    assert sorted(body["cases"]) == [check.id, first.id, second.id]
    assert [order.work_id for _, order, _ in receiver.sender.sent] == [w.id for w in works]
    bundle_occurrence = receiver.occurrences()[1]
    assert bundle_occurrence.provenance["check_run_id"] == 128620228
    assert bundle_occurrence.provenance["head_sha"] == "ec26c3e57ca3a959ca5aad62de7213c562f8c821"


def test_a_check_run_naming_a_missing_bundle_says_so_and_still_records(
    receiver: Receiver, captured: Captured, load_payload: Load
) -> None:
    data = _check_run(
        load_payload, summary=f"flaketriage-bundle: {MISSING}\nflaketriage-bundle: {captured.value_error}"
    )

    response = receiver.github("check_run", data)

    assert response.status_code == 202
    [note] = response.json()["notes"]
    assert MISSING in note
    [work] = receiver.works()
    assert work.bundle_id == captured.value_error


def test_a_check_run_naming_only_missing_bundles_records_the_check(
    receiver: Receiver, load_payload: Load
) -> None:
    response = receiver.github(
        "check_run", _check_run(load_payload, summary=f"flaketriage-bundle: {MISSING}")
    )

    assert response.status_code == 200
    assert response.json()["outcome"] == "recorded"
    assert MISSING in response.json()["notes"][0]
    assert len(receiver.cases()) == 1 and receiver.works() == []


def test_flaketriages_own_check_run_failing_opens_no_case(receiver: Receiver, load_payload: Load) -> None:
    from flaketriage.orchestrator.github_hooks import CHECK_RUN_NAME
    from flaketriage.workers.report.checks import CHECK_NAME

    assert CHECK_RUN_NAME == CHECK_NAME
    data = _check_run(load_payload, summary="2 real failures")
    data["check_run"]["name"] = CHECK_NAME
    response = receiver.github("check_run", data)
    assert response.status_code == 200 and response.json()["outcome"] == "ignored"
    assert "flaketriage's own" in response.json()["notes"][0]
    assert receiver.cases() == [] and receiver.works() == []


def test_a_check_run_naming_two_bundles_of_one_failure_is_one_occurrence_and_one_triage(
    receiver: Receiver, captured: Captured, load_payload: Load
) -> None:
    """The same test failed in two jobs of a matrix: one case, seen once by this delivery."""
    data = _check_run(
        load_payload,
        summary="\n".join(
            f"flaketriage-bundle: {b}" for b in (captured.value_error, captured.value_error_again)
        ),
    )

    response = receiver.github("check_run", data)

    assert response.status_code == 202, response.text
    _check, case = receiver.cases()
    assert case.occurrences == 1
    [work] = receiver.works()
    assert (work.case_id, work.bundle_id) == (case.id, captured.value_error)
    assert len(receiver.sender.sent) == 1


def test_a_bundle_line_is_read_only_from_the_allowed_store_even_before_it_exists(
    make_receiver: MakeReceiver, captured: Captured, load_payload: Load, tmp_path: Path
) -> None:
    """A fresh deployment: the store is configured but nothing was captured into it yet."""
    empty = tmp_path / "not-created-yet"
    receiver = make_receiver(store=str(empty), allowed_stores=[str(empty)])

    response = receiver.github(
        "check_run", _check_run(load_payload, summary=f"flaketriage-bundle: {captured.value_error}")
    )

    assert response.status_code == 200, response.text
    assert captured.value_error in response.json()["notes"][0]
    assert receiver.works() == []


def test_a_note_never_names_a_path_of_the_servers(
    make_receiver: MakeReceiver, captured: Captured, load_payload: Load, tmp_path: Path
) -> None:
    """Notes go back to whoever sent the delivery: a bundle not there, or a store not there, is said
    by the id alone."""
    summary = f"flaketriage-bundle: {MISSING}"
    empty = tmp_path / "not-created-yet"
    for receiver in (make_receiver(), make_receiver(store=str(empty), allowed_stores=[str(empty)])):
        response = receiver.github("check_run", _check_run(load_payload, summary=summary))

        assert response.status_code == 200, response.text
        [note] = response.json()["notes"]
        assert MISSING in note and "store" in note
        assert str(captured.store) not in note and str(tmp_path) not in note


def test_a_delivery_naming_more_bundles_than_allowed_reads_only_so_many(
    make_receiver: MakeReceiver, captured: Captured, load_payload: Load, monkeypatch: pytest.MonkeyPatch
) -> None:
    """30,000 bundle lines once took 16 s and answered 4 MB: the first few different ids are read, the
    rest counted in one note."""
    from flaketriage.orchestrator import sightings

    reads: list[str] = []
    load = sightings.load_manifest
    monkeypatch.setattr(
        sightings, "load_manifest", lambda store, ident: reads.append(ident) or load(store, ident)
    )
    receiver = make_receiver(max_bundles_per_delivery=3, max_body_kb=8192)
    named = [captured.value_error] * 5 + [f"{n:064x}" for n in range(30_000)]
    summary = "\n".join(f"flaketriage-bundle: {ident}" for ident in named)

    response = receiver.github("check_run", _check_run(load_payload, summary=summary, text=summary))

    assert response.status_code == 202, response.text
    assert reads == [captured.value_error, f"{0:064x}", f"{1:064x}"]  # repeats read once
    *missing, left_out = response.json()["notes"]
    assert len(missing) == 2
    assert left_out.startswith("29998 more bundles") and "FLAKETRIAGE_MAX_BUNDLES_PER_DELIVERY" in left_out
    assert len(response.content) < 2048
    [work] = receiver.works()
    assert work.bundle_id == captured.value_error


# -- requests from people -------------------------------------------------------------------------
def test_an_issue_labelled_flaketriage_triages_its_bundle_and_replies_there(
    receiver: Receiver, captured: Captured, load_payload: Load
) -> None:
    # Known and triaged already: a person asking is reason enough to triage again.
    assert receiver.post_event(captured.event(captured.value_error)).status_code == 202
    data = _issue_labeled(
        load_payload, f"Again in nightly.\r\n\r\nflaketriage-bundle: {captured.value_error}\r\n"
    )

    response = receiver.github("issues", data)

    assert response.status_code == 202, response.text
    first, second = receiver.works()
    assert response.json()["work"] == [second.id]
    assert second.bundle_id == captured.value_error
    assert second.options["reply_to"] == {"repository": "Codertocat/Hello-World", "issue": 1}
    assert "reply_to" not in first.options
    assert len(receiver.sender.sent) == 2


def test_an_issue_labelled_otherwise_is_ignored(
    receiver: Receiver, captured: Captured, load_payload: Load
) -> None:
    data = _issue_labeled(load_payload, f"flaketriage-bundle: {captured.value_error}")
    data["label"] = data["issue"]["labels"][0]  # "bug"

    response = receiver.github("issues", data)

    assert response.status_code == 200 and response.json()["outcome"] == "ignored"
    assert receiver.works() == []


def test_an_issue_labelled_flaketriage_without_a_bundle_line_says_so(
    receiver: Receiver, load_payload: Load
) -> None:
    response = receiver.github("issues", _issue_labeled(load_payload, "It is flaky, please look."))

    assert response.status_code == 200
    assert response.json()["outcome"] == "ignored"
    assert "flaketriage-bundle" in response.json()["notes"][0]


def _outsiders_issue(load_payload: Load, captured: Captured, action: str = "labeled") -> dict[str, Any]:
    """An issue of someone outside the repository naming a bundle, with the label (on it as it
    was opened, as an issue template puts it, or given by its author)."""
    data = _issue_labeled(load_payload, f"flaketriage-bundle: {captured.value_error}")
    data["issue"].update(author_association="NONE", user=data["issue"]["user"] | {"login": "outsider"})
    data["sender"].update(login="outsider", type="User")
    data["action"] = action
    if action == "opened":
        del data["label"]
    data["issue"]["labels"].append({"name": "flaketriage"})
    return data


@pytest.mark.parametrize("action", ["opened", "labeled"])
def test_an_outsiders_issue_labelled_by_its_template_or_its_author_is_ignored_and_said_so(
    receiver: Receiver, captured: Captured, load_payload: Load, action: str
) -> None:
    response = receiver.github("issues", _outsiders_issue(load_payload, captured, action))

    assert response.status_code == 200 and response.json()["outcome"] == "ignored", response.text
    [note] = response.json()["notes"]
    assert "outsider, who is none" in note and "collaborator may ask" in note
    assert receiver.works() == [] and receiver.sender.sent == []


def test_an_outsiders_issue_labelled_by_a_bot_is_ignored(
    receiver: Receiver, captured: Captured, load_payload: Load
) -> None:
    # A workflow or app labelling from the issue's text: the text is the outsider's.
    data = _outsiders_issue(load_payload, captured)
    data["sender"].update(login="github-actions[bot]", type="Bot")

    response = receiver.github("issues", data)

    assert response.json()["outcome"] == "ignored" and receiver.works() == []


def test_an_outsiders_issue_labelled_by_a_maintainer_is_triaged(
    receiver: Receiver, captured: Captured, load_payload: Load
) -> None:
    data = _outsiders_issue(load_payload, captured)
    data["sender"].update(login="Codertocat")  # labelling another's issue takes triage access

    response = receiver.github("issues", data)

    assert response.status_code == 202, response.text
    assert [w.bundle_id for w in receiver.works()] == [captured.value_error]


@pytest.mark.parametrize("association", ["OWNER", "MEMBER", "COLLABORATOR"])
def test_an_issue_opened_with_the_label_by_the_repositorys_people_is_triaged(
    receiver: Receiver, captured: Captured, load_payload: Load, association: str
) -> None:
    data = _outsiders_issue(load_payload, captured, "opened")
    data["issue"]["author_association"] = association

    assert receiver.github("issues", data).status_code == 202
    assert [w.bundle_id for w in receiver.works()] == [captured.value_error]


def test_a_triage_comment_triages_the_bundle_and_replies_on_the_issue(
    receiver: Receiver, captured: Captured, load_payload: Load
) -> None:
    data = _comment(
        load_payload, f"Still failing on main.\r\n/flaketriage triage {captured.key_error[:12]}\r\n"
    )

    response = receiver.github("issue_comment", data, delivery="d" * 128)

    assert response.status_code == 202, response.text
    [work] = receiver.works()
    assert work.bundle_id == captured.key_error
    assert work.options["reply_to"] == {"repository": "Codertocat/Hello-World", "issue": 1}
    assert [order.work_id for _, order, _ in receiver.sender.sent] == [work.id]


def test_a_comment_without_the_command_is_ignored(
    receiver: Receiver, captured: Captured, load_payload: Load
) -> None:
    data = _comment(load_payload, f"I think flaketriage triage {captured.key_error} would help")

    response = receiver.github("issue_comment", data)

    assert response.status_code == 200 and response.json()["outcome"] == "ignored"


@pytest.mark.parametrize("association", ["NONE", "CONTRIBUTOR", "FIRST_TIME_CONTRIBUTOR", None])
def test_a_triage_comment_from_outside_the_repository_is_ignored_and_said_so(
    receiver: Receiver, captured: Captured, load_payload: Load, association: str | None
) -> None:
    data = _comment(load_payload, f"/flaketriage triage {captured.key_error[:12]}")
    if association is None:
        del data["comment"]["author_association"]
    else:
        data["comment"]["author_association"] = association

    response = receiver.github("issue_comment", data)

    assert response.status_code == 200 and response.json()["outcome"] == "ignored"
    [note] = response.json()["notes"]
    assert "Codertocat is" in note and "collaborator may ask" in note
    assert receiver.works() == [] and receiver.sender.sent == []


def test_the_note_on_an_outsiders_comment_is_bounded_whatever_the_payload_says(
    make_receiver: MakeReceiver, captured: Captured, load_payload: Load
) -> None:
    receiver = make_receiver(max_body_kb=1024)
    data = _comment(load_payload, f"/flaketriage triage {captured.key_error[:12]}")
    data["comment"]["user"]["login"] = "x" * 200_000
    data["comment"]["author_association"] = "NONE" * 100_000

    response = receiver.github("issue_comment", data)

    assert response.status_code == 200, response.text
    [note] = response.json()["notes"]
    assert len(note) < 400 and "collaborator may ask" in note


@pytest.mark.parametrize("association", ["OWNER", "MEMBER", "COLLABORATOR"])
def test_a_triage_comment_from_the_repository_is_obeyed(
    receiver: Receiver, captured: Captured, load_payload: Load, association: str
) -> None:
    data = _comment(load_payload, f"/flaketriage triage {captured.key_error[:12]}")
    data["comment"]["author_association"] = association
    assert receiver.github("issue_comment", data).status_code == 202
    assert [w.bundle_id for w in receiver.works()] == [captured.key_error]


def test_a_triage_comment_for_a_missing_bundle_says_so(receiver: Receiver, load_payload: Load) -> None:
    response = receiver.github("issue_comment", _comment(load_payload, f"/flaketriage triage {MISSING}"))

    assert response.status_code == 200
    assert MISSING in response.json()["notes"][0]
    assert receiver.works() == []


# -- everything else ------------------------------------------------------------------------------
def test_ping_and_unknown_events_are_ignored_and_counted(receiver: Receiver, load_payload: Load) -> None:
    ping = receiver.github("ping", load_payload("github_ping.json"))
    star = receiver.github("star", load_payload("github_star.created.json"))
    long_name = receiver.github("x" * 100, load_payload("github_star.created.json"))

    for response in (ping, star, long_name):
        assert response.status_code == 200, response.text
        assert response.json() == {"outcome": "ignored", "cases": [], "work": [], "notes": []}
    assert receiver.events_total("github", "ignored") == 3
    assert receiver.cases() == [] and receiver.sender.sent == []


def test_a_repeated_delivery_is_a_duplicate(
    receiver: Receiver, captured: Captured, load_payload: Load
) -> None:
    data = _check_run(load_payload, summary=f"flaketriage-bundle: {captured.value_error}")
    assert (
        receiver.github("check_run", data, delivery="72d3162e-cc78-11e3-81ab-4c9367dc0958").status_code == 202
    )
    counts, sent = receiver.counts(), list(receiver.sender.sent)

    again = receiver.github("check_run", data, delivery="72d3162e-cc78-11e3-81ab-4c9367dc0958")

    assert again.status_code == 200 and again.json()["outcome"] == "duplicate"
    assert receiver.counts() == counts and receiver.sender.sent == sent
    assert receiver.events_total("github", "duplicate") == 1


def test_a_delivery_id_seen_before_with_another_body_is_recorded_by_what_the_body_is_about(
    receiver: Receiver, load_payload: Load
) -> None:
    # The delivery id is not signed; the body is, and it names another run: another occurrence.
    first = load_payload("github_workflow_run.completed.json")
    second = load_payload("github_workflow_run.completed.json")
    second["workflow_run"]["id"] = 30433999
    assert receiver.github("workflow_run", first, delivery="same-id").json()["outcome"] == "recorded"

    response = receiver.github("workflow_run", second, delivery="same-id")

    assert response.json()["outcome"] == "recorded"
    assert [o.delivery_id for o in receiver.occurrences()] == [
        "workflow_run:30433642:2",
        "workflow_run:30433999:2",
    ]


def test_a_delivery_id_naming_a_body_to_come_does_not_make_that_body_a_duplicate(
    receiver: Receiver, load_payload: Load
) -> None:
    # A captured body that names nothing of its own (a ping), re-sent under a delivery id spelled
    # as a run's key, must not pass for that run when its own delivery comes.
    ping = receiver.github("ping", load_payload("github_ping.json"), delivery="workflow_run:30433642:2")
    assert ping.json()["outcome"] == "ignored"

    response = receiver.github("workflow_run", load_payload("github_workflow_run.completed.json"))

    assert response.json()["outcome"] == "recorded"
    assert len(receiver.occurrences()) == 1


Body = tuple[str, dict[str, Any], Callable[[dict[str, Any]], None]]
"""An event, its payload, and what turns the payload into the next one of its kind."""


def _failed_run(load_payload: Load, captured: Captured) -> Body:
    def rerun(data: dict[str, Any]) -> None:
        data["workflow_run"]["run_attempt"] += 1

    return "workflow_run", load_payload("github_workflow_run.completed.json"), rerun


def _failed_check(load_payload: Load, captured: Captured) -> Body:
    def rerun(data: dict[str, Any]) -> None:  # a check run re-run is a check run of its own
        data["check_run"].update(id=data["check_run"]["id"] + 1, completed_at="2019-05-15T16:00:00Z")

    data = _check_run(load_payload, summary=f"flaketriage-bundle: {captured.value_error}")
    return "check_run", data, rerun


def _labelled(load_payload: Load, captured: Captured) -> Body:
    def relabel(data: dict[str, Any]) -> None:  # the label taken off and put on again, later
        data["issue"]["updated_at"] = "2019-05-16T09:00:00Z"

    return "issues", _issue_labeled(load_payload, f"flaketriage-bundle: {captured.value_error}"), relabel


def _command(load_payload: Load, captured: Captured) -> Body:
    def ask_again(data: dict[str, Any]) -> None:  # another comment with the same command
        data["comment"].update(id=data["comment"]["id"] + 1, updated_at="2019-05-16T09:00:00Z")

    return "issue_comment", _comment(load_payload, f"/flaketriage triage {captured.key_error}"), ask_again


BODIES = {
    "workflow_run": _failed_run,
    "check_run": _failed_check,
    "issues": _labelled,
    "issue_comment": _command,
}


@pytest.mark.parametrize("kind", BODIES)
def test_a_body_sent_again_under_another_delivery_id_is_a_duplicate(
    receiver: Receiver, captured: Captured, load_payload: Load, kind: str
) -> None:
    # GitHub signs the body, not X-GitHub-Delivery: a captured body re-sent with a new id is the
    # same event, and starts nothing twice (no occurrence, no triage, no comment).
    event, data, _ = BODIES[kind](load_payload, captured)
    first = receiver.github(event, data)
    assert first.json()["outcome"] in ("recorded", "accepted"), first.text
    counts, sent = receiver.counts(), list(receiver.sender.sent)

    again = [receiver.github(event, data, delivery=f"replay-{n}") for n in range(3)]

    assert [(r.status_code, r.json()["outcome"], r.json()["work"]) for r in again] == [
        (200, "duplicate", [])
    ] * 3
    assert receiver.counts() == counts and receiver.sender.sent == sent
    assert receiver.events_total("github", "duplicate") == 3


@pytest.mark.parametrize("kind", BODIES)
def test_the_next_event_of_the_same_thing_is_not_a_duplicate(
    receiver: Receiver, captured: Captured, load_payload: Load, kind: str
) -> None:
    event, data, next_one = BODIES[kind](load_payload, captured)
    assert receiver.github(event, data).json()["outcome"] in ("recorded", "accepted")
    occurrences = len(receiver.occurrences())
    next_one(data)

    response = receiver.github(event, data)

    assert response.json()["outcome"] in ("recorded", "accepted"), response.text
    assert len(receiver.occurrences()) == 2 * occurrences
    if event in ("issues", "issue_comment"):  # a person asking again is triaged again
        assert len(receiver.works()) == 2


def _bad_signature(r: Receiver, data: dict[str, Any]) -> Any:
    return r.github("workflow_run", data, secret=b"another-secret")


def _no_signature(r: Receiver, data: dict[str, Any]) -> Any:
    return r.github("workflow_run", data, omit=("X-Hub-Signature-256",))


def _sha1_signature(r: Receiver, data: dict[str, Any]) -> Any:
    return r.github("workflow_run", data, **{"X-Hub-Signature-256": "sha1=" + "0" * 40})


def _no_event_header(r: Receiver, data: dict[str, Any]) -> Any:
    return r.github("workflow_run", data, omit=("X-GitHub-Event",))


def _no_delivery_header(r: Receiver, data: dict[str, Any]) -> Any:
    return r.github("workflow_run", data, omit=("X-GitHub-Delivery",))


@pytest.mark.parametrize(
    ("send", "status"),
    [
        (_bad_signature, 401),
        (_no_signature, 401),
        (_sha1_signature, 401),
        (_no_event_header, 400),
        (_no_delivery_header, 400),
    ],
    ids=lambda x: getattr(x, "__name__", None),
)
def test_a_refused_delivery_writes_nothing(
    receiver: Receiver, load_payload: Load, send: Callable[..., Any], status: int
) -> None:
    response = send(receiver, load_payload("github_workflow_run.completed.json"))

    assert response.status_code == status, response.text
    assert set(receiver.counts().values()) == {0}
    assert receiver.sender.sent == []


def test_an_unset_github_secret_refuses_every_delivery(
    make_receiver: MakeReceiver, load_payload: Load
) -> None:
    receiver = make_receiver(github_webhook_secret=None)

    response = receiver.github("workflow_run", load_payload("github_workflow_run.completed.json"))

    assert response.status_code == 401
    assert "FLAKETRIAGE_GITHUB_WEBHOOK_SECRET" in response.json()["detail"]
    assert set(receiver.counts().values()) == {0}


@pytest.mark.parametrize(
    ("place", "value", "field"),
    [("issue", {"labels": 5}, "issue.labels"), ("label", {"name": ["flaketriage"]}, "label.name")],
)
def test_an_issue_with_mistyped_labels_is_a_422_naming_them(
    receiver: Receiver, captured: Captured, load_payload: Load, place: str, value: dict[str, Any], field: str
) -> None:
    data = _issue_labeled(load_payload, f"flaketriage-bundle: {captured.value_error}")
    data[place].update(value)

    response = receiver.github("issues", data)

    assert response.status_code == 422, response.text
    assert field in response.json()["detail"]
    assert set(receiver.counts().values()) == {0}
