"""The reply a requested triage posts on the pull request or issue: what was found, per verdict."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace

import pytest

from flaketriage.bundle.manifest import Command, Failure, Manifest
from flaketriage.workers.attribution import Attribution
from flaketriage.workers.findings import Finding
from flaketriage.workers.minimize.minimizer import MinimizeResult
from flaketriage.workers.polluters import PolluterSearch
from flaketriage.workers.report import ReportRef
from flaketriage.workers.report.render import order_command, render_comment
from flaketriage.workers.triage import TriageResult
from flaketriage.workers.verdict import RateInterval, Verdict, VerdictResult

BUNDLE = "1" * 64
VICTIM = "tests/test_cache.py::test_reads_empty"
POLLUTER = "tests/test_warm.py::test_fills_cache"


def verdict(kind: Verdict, reproductions: int, replays: int, low: float, high: float) -> VerdictResult:
    return VerdictResult(
        verdict=kind,
        decided=True,
        replays=replays,
        reproductions=reproductions,
        passes=replays - reproductions,
        different=0,
        rate=RateInterval(estimate=reproductions / replays, low=low, high=high),
    )


@pytest.fixture
def victim(make_manifest: Callable[..., Manifest]) -> Manifest:
    return make_manifest(
        command=Command(argv=("python", "-m", "pytest", VICTIM), cwd="/work/project"),
        failure=Failure(
            kind="test", test_id=VICTIM, exception_type="AssertionError", fingerprint="ab" * 32, signature="s"
        ),
    )


def order_result(search: PolluterSearch) -> TriageResult:
    return TriageResult(
        bundle_id=BUNDLE,
        verdict=verdict(Verdict.ORDER_DEPENDENT, 0, 5, 0.0, 0.522),
        polluter_search=search,
        report=ReportRef(kind="github", location="https://github.com/acme/repo/issues/7", created=True),
    )


def found(**fields: object) -> PolluterSearch:
    base = PolluterSearch(
        preceding=8, reproduced_in_order=True, polluters=(POLLUTER,), confirmations=4, confirm_runs=4
    )
    return replace(base, **fields)  # type: ignore[arg-type]


def test_an_order_dependent_reply_names_its_polluters_and_the_command_in_order(victim: Manifest) -> None:
    reply = render_comment(order_result(found()), victim, quarantined=True)
    assert f"`{POLLUTER}`" in reply and f"`{VICTIM}`" in reply
    assert f"python -m pytest -p no:randomly {POLLUTER} {VICTIM}" in reply
    assert "passes alone; fails after" in reply
    assert "rate 0.0% (95% interval 0.0%–52.2%)" in reply
    assert "**Quarantined** with its polluters named" in reply
    assert "https://github.com/acme/repo/issues/7" in reply
    assert "Quarantined" not in render_comment(order_result(found()), victim, quarantined=False)


def test_a_reply_for_state_setters_and_for_a_test_that_fails_run_twice(victim: Manifest) -> None:
    setters = render_comment(order_result(found(kind="setters")), victim)
    assert "State-setters (it passes only after them)" in setters and f"`{POLLUTER}`" in setters
    assert f"-p no:randomly {POLLUTER} {VICTIM}" in setters
    twice = render_comment(order_result(found(polluters=(VICTIM,), itself=True)), victim)
    assert "fails when run twice in one process" in twice
    assert f"python -m pytest -p no:randomly --count 2 {VICTIM}" in twice


def test_order_command_quotes_node_ids_for_the_shell() -> None:
    search = found(polluters=("t.py::test_a[x y]",))
    assert (
        order_command("t.py::test_b", search)
        == "python -m pytest -p no:randomly 't.py::test_a[x y]' t.py::test_b"
    )


def test_a_deterministic_reply_shows_what_minimization_kept_and_how_to_reproduce(victim: Manifest) -> None:
    minimal = MinimizeResult(
        bundle_id="2" * 64, data={"data/train.csv": (1, 400)}, args={"--steps": ("200", "1")}, oracle_calls=9
    )
    result = TriageResult(
        bundle_id=BUNDLE, verdict=verdict(Verdict.DETERMINISTIC, 5, 5, 0.478, 1.0), minimized=minimal
    )
    reply = render_comment(result, victim)
    assert "`data/train.csv`: kept 1 of 400" in reply and "`--steps`: `200` → `1`" in reply
    assert f"flaketriage bundle export {'2' * 64} repro && cd repro && bash run.sh" in reply
    assert f"python -m pytest {VICTIM}" in reply  # the captured command
    assert "reproduced in 5 of 5 replays" in reply


def test_a_flaky_reply_gives_the_rate_its_interval_and_says_it_is_quarantined() -> None:
    result = TriageResult(
        bundle_id=BUNDLE,
        verdict=verdict(Verdict.FLAKY, 3, 20, 0.032, 0.379),
        report=ReportRef(kind="quarantine", location="quarantine:" + "ab" * 32, created=True),
    )
    reply = render_comment(result)
    assert "rate 15.0% (95% interval 3.2%–37.9%)" in reply
    assert "**Quarantined**" in reply and f"flaketriage triage {BUNDLE}" in reply


def test_environment_and_not_reproduced_replies_say_what_comes_next(victim: Manifest) -> None:
    spread = TriageResult(
        bundle_id=BUNDLE,
        verdict=verdict(Verdict.ENVIRONMENT_SPECIFIC, 10, 20, 0.27, 0.73),
        attribution=Attribution.from_json(
            {
                "original": "gpu-a100-1",
                "runners": [
                    {"runner": "gpu-a100-1", "matches_original": True, "reproductions": 10, "passes": 0},
                    {"runner": "cpu-3", "matches_original": False, "reproductions": 0, "passes": 10},
                ],
                "specific": True,
                "side": "original",
                "p_value": 5.4e-06,
            }
        ),
    )
    reply = render_comment(spread, victim)
    assert "Replays by runner:" in reply and "gpu-a100-1" in reply and "cpu-3" in reply
    reason = Finding(fingerprint="ef" * 32, kind="environment", summary="pip: no torch==9.9", count=1)
    broken = render_comment(
        TriageResult(bundle_id=BUNDLE, verdict=verdict(Verdict.ENVIRONMENT, 0, 1, 0, 0.97), findings=[reason])
    )
    assert "- environment (1×): pip: no torch==9.9" in broken
    assert "no replay could run in the bundle's environment" in broken and "FLAKETRIAGE_ENVIRONMENT" in broken
    gone = render_comment(
        TriageResult(bundle_id=BUNDLE, verdict=verdict(Verdict.NOT_REPRODUCED, 0, 59, 0, 0.0606))
    )
    assert "at most 6.1%" in gone and f"flaketriage telemetry {BUNDLE}" in gone


def test_a_reply_keeps_captured_text_inert(make_manifest: Callable[..., Manifest]) -> None:
    hostile = "tests/t.py::test_x[@octocat <img src=x>]"
    manifest = make_manifest(
        failure=Failure(kind="test", test_id=hostile, fingerprint="ab" * 32, signature="s")
    )
    result = order_result(found(polluters=("a.py::test_`@team`",)))
    result.findings = [
        Finding(fingerprint="cd" * 32, kind="exception", summary="@octocat <img src=x>", count=2)
    ]
    prose = re.sub(r"(`{3,})[a-z]*\n.*?\n\1", "", render_comment(result, manifest), flags=re.S)
    prose = re.sub(r"(`+) ?[^`].*?\1", "", prose)  # code spans: GitHub mentions no one in them
    assert "@octocat" not in prose and "@team" not in prose and "<img" not in prose
