"""`/v1/cases/{id}` links a failed CI run (``workflow_run``, ``check_run``) with the failures captured in
that run, both ways and whichever arrives first; a run URL that names no run links nothing and
breaks nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from flaketriage.bundle.manifest import Provenance
from flaketriage.orchestrator.run_links import run_url

if TYPE_CHECKING:
    from conftest import Captured, Receiver  # tests/orchestrator/conftest.py

Load = Callable[[str], dict[str, Any]]
RUN = "https://github.com/Codertocat/Hello-World/actions/runs/30433642"
"""The recorded workflow_run payload's ``html_url``; a captured failure of that run names it as the
CI probes build it (``$GITHUB_SERVER_URL/$GITHUB_REPOSITORY/actions/runs/$GITHUB_RUN_ID``)."""


def _captured_in(receiver: Receiver, captured: Captured, url: str | None) -> int:
    event = captured.event(
        captured.value_error, provenance=Provenance(ci_provider="github-actions", run_url=url)
    )
    response = receiver.post_event(event)
    assert response.status_code == 202, response.text
    return int(response.json()["cases"][0])


def _workflow_run(receiver: Receiver, load_payload: Load, html_url: str) -> int:
    data = load_payload("github_workflow_run.completed.json")
    data["workflow_run"]["html_url"] = html_url
    response = receiver.github("workflow_run", data)
    assert response.status_code == 200, response.text
    return int(response.json()["cases"][0])


def _check_run(receiver: Receiver, load_payload: Load, details_url: str) -> int:
    data = load_payload("github_check_run.completed.json")
    data["check_run"]["details_url"] = details_url
    response = receiver.github("check_run", data)
    assert response.status_code == 200, response.text
    return int(response.json()["cases"][0])


def _links(receiver: Receiver, case_id: int) -> list[tuple[int, str, str]]:
    response = receiver.client.get(f"/v1/cases/{case_id}")
    assert response.status_code == 200, response.text
    return [(link["id"], link["kind"], link["run_url"]) for link in response.json()["linked_cases"]]


@pytest.mark.parametrize("run_first", [True, False], ids=["run-first", "capture-first"])
def test_a_failed_workflow_run_and_the_failure_captured_in_it_link_both_ways(
    receiver: Receiver, captured: Captured, load_payload: Load, run_first: bool
) -> None:
    if run_first:
        run_case = _workflow_run(receiver, load_payload, RUN)
        bundle_case = _captured_in(receiver, captured, RUN)
    else:
        bundle_case = _captured_in(receiver, captured, RUN)
        run_case = _workflow_run(receiver, load_payload, RUN)
    assert run_case != bundle_case

    assert _links(receiver, bundle_case) == [(run_case, "workflow", RUN)]
    assert _links(receiver, run_case) == [(bundle_case, "bundle", RUN)]
    detail = receiver.client.get(f"/v1/cases/{bundle_case}").json()
    assert "Hello-World" in detail["linked_cases"][0]["title"]


def test_a_failed_check_run_links_through_the_actions_run_its_details_url_names(
    receiver: Receiver, captured: Captured, load_payload: Load
) -> None:
    bundle_case = _captured_in(receiver, captured, RUN)
    check_case = _check_run(receiver, load_payload, f"{RUN}/job/987654")

    assert _links(receiver, check_case) == [(bundle_case, "bundle", RUN)]
    assert _links(receiver, bundle_case) == [(check_case, "workflow", RUN)]
    [occurrence] = [o for o in receiver.occurrences() if o.case_id == check_case]
    assert occurrence.provenance["run_url"] == RUN
    assert occurrence.provenance["check_url"].startswith("https://github.com/Codertocat/Hello-World/runs/")


def test_failures_of_another_run_are_not_linked(
    receiver: Receiver, captured: Captured, load_payload: Load
) -> None:
    bundle_case = _captured_in(receiver, captured, RUN.replace("30433642", "30433643"))
    run_case = _workflow_run(receiver, load_payload, RUN)

    assert _links(receiver, run_case) == [] and _links(receiver, bundle_case) == []


@pytest.mark.parametrize(
    "hostile",
    [RUN + "\x00", RUN + "\ud800", RUN + "/" + "x" * 10_000, "x" * 10_000],
    ids=["nul", "surrogate", "10k-after-run", "10k"],
)
def test_a_run_url_that_names_no_run_links_nothing_and_is_answered(
    receiver: Receiver, captured: Captured, load_payload: Load, hostile: str
) -> None:
    bundle_case = _captured_in(receiver, captured, RUN)
    run_case = _workflow_run(receiver, load_payload, hostile)

    # Hostile or not, it is the run's own URL as GitHub sent it: the case reads back, linking only
    # where the URL still names the run (a long tail after it is not the run's).
    assert _links(receiver, run_case) == [] and _links(receiver, bundle_case) == []


@pytest.mark.parametrize(
    ("url", "run"),
    [
        (RUN, RUN),
        (f"{RUN}/job/42", RUN),
        (f"{RUN}/attempts/2", RUN),
        (f"{RUN}?check_suite_focus=true", RUN),
        (
            "https://ghe.example:8443/org/repo/actions/runs/7",
            "https://ghe.example:8443/org/repo/actions/runs/7",
        ),
        ("https://github.com/Codertocat/Hello-World/runs/128620228", None),
        ("https://octocoders.github.io", None),
        (RUN + "9" * 30, None),
        (None, None),
        (42, None),
    ],
)
def test_run_url_names_the_run_of_a_job_an_attempt_or_a_query(url: object, run: str | None) -> None:
    assert run_url(url) == run
