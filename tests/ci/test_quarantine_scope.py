"""The pytest plugin under quarantine entries limited to a variant or to a failure, in real pytest
processes (pytester): a failure the entry does not cover fails the job, and the summary says why."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from flaketriage.bundle.io import list_bundles, load_manifest
from flaketriage.ci.quarantine_list import run_variant
from flaketriage.store import LocalStore

pytest_plugins = ["pytester"]

A100 = "NVIDIA A100-SXM4-80GB (test)"
"""A GPU no machine running these tests has."""

SUITE = """
import os
def test_known_flaky():
    assert False, os.environ.get("HOW", "flaky again")
def test_fine():
    pass
"""
TEST = "test_suite.py::test_known_flaky"


@pytest.fixture(autouse=True)
def quiet(clean_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # Only flaketriage's plugin: the others installed here take seconds to load in every run.
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    for name in ("CI", "BUILD_NUMBER", "PYTEST_ADDOPTS", "HOW"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "store"


def run(pytester: pytest.Pytester, store_dir: Path) -> pytest.RunResult:
    return pytester.runpytest_subprocess(
        "-p", "flaketriage", "--flaketriage", f"--flaketriage-store={store_dir}", "-p", "no:cacheprovider",
        "-rfE", timeout=120,
    )  # fmt: skip


def quarantine(store_dir: Path, fingerprint: str, **limits: Any) -> None:
    entry = {
        "fingerprint": fingerprint,
        "test_id": TEST,
        "reason": "flaky: reproduced 3 of 20 replays",
        "evidence": {
            "replays": 20,
            "reproductions": 3,
            "rate": {"estimate": 0.15, "low": 0.03, "high": 0.38},
        },
        "command": f"python -m pytest {TEST}",
        "bundle_id": "e" * 64,
        "bundles": ["e" * 64],
        "occurrences": 1,
        "quarantined_at": "2024-05-01T12:00:00Z",
        "updated_at": "2024-05-01T12:00:00Z",
        **limits,
    }
    store_dir.mkdir(exist_ok=True)
    doc = {"version": 1, "entries": {fingerprint: entry}}
    (store_dir / "quarantine.json").write_text(json.dumps(doc))


def fingerprints(store_dir: Path) -> list[str]:
    """The fingerprints of the store's bundles, oldest first."""
    store = LocalStore(store_dir)
    manifests = sorted((load_manifest(store, b.id) for b in list_bundles(store)), key=lambda m: m.created_at)
    return [m.failure.fingerprint for m in manifests]


def test_an_entry_for_another_gpu_fails_the_job_and_says_why(
    pytester: pytest.Pytester, store_dir: Path
) -> None:
    pytester.makepyfile(test_suite=SUITE)
    quarantine(store_dir, "ab" * 32, variant={"gpu": A100})
    result = run(pytester, store_dir)
    assert result.ret == 1
    here = run_variant({k: v for k, v in os.environ.items() if not k.startswith("FLAKETRIAGE_")})["gpu"]
    result.stdout.fnmatch_lines(
        [
            f"FAILED {TEST} - AssertionError: flaky again*",
            f"flaketriage: NOT QUARANTINED {TEST} - quarantined on gpu={A100} only; this run is gpu={here}",
            "*1 failed, 1 passed*",
        ]
    )
    assert "QUARANTINED " + TEST not in result.stdout.str().replace("NOT QUARANTINED", "")


@pytest.mark.parametrize(
    ("variable", "value"),
    [("FLAKETRIAGE_GPU", A100), ("FLAKETRIAGE_VARIANT", f"gpu={A100},shard=2")],
)
def test_a_runner_that_states_the_gpu_the_entry_names_is_forgiven(
    pytester: pytest.Pytester, store_dir: Path, monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    pytester.makepyfile(test_suite=SUITE)
    quarantine(store_dir, "ab" * 32, variant={"gpu": A100})
    monkeypatch.setenv(variable, value)
    result = run(pytester, store_dir)
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(
        [f"*QUARANTINED {TEST} - flaky: reproduced 3 of 20 replays*", "*1 passed, 1 quarantined*"]
    )
    assert "NOT QUARANTINED" not in result.stdout.str()


def test_a_signature_limited_entry_forgives_its_failure_and_reports_another(
    pytester: pytest.Pytester, store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_suite=SUITE)
    assert run(pytester, store_dir).ret == 1
    (known,) = fingerprints(store_dir)  # the plugin's fingerprint of this failure
    quarantine(store_dir, known, signatures=[known])

    same = run(pytester, store_dir)
    assert same.ret == 0, same.stdout.str()
    same.stdout.fnmatch_lines(["*1 passed, 1 quarantined*"])

    monkeypatch.setenv("HOW", "a new way to fail")
    other = run(pytester, store_dir)
    assert other.ret == 1
    new = fingerprints(store_dir)[-1]
    assert new != known
    other.stdout.fnmatch_lines(
        [
            f"FAILED {TEST} - AssertionError: a new way to fail*",
            f"flaketriage: NOT QUARANTINED {TEST} - quarantined for the failure {known[:12]} only; "
            f"this failure is {new[:12]}",
            "*1 failed, 1 passed*",
        ]
    )


def test_an_entry_made_by_hand_is_enforced_until_it_expires(
    pytester: pytest.Pytester, store_dir: Path
) -> None:
    pytester.makepyfile(test_suite=SUITE)
    by_hand = {"reason": "by hand by alice (token)", "owner": "ml-infra", "bundle_id": "", "bundles": []}
    quarantine(store_dir, "cd" * 16, **by_hand, expires_at="2999-01-01T00:00:00Z")
    held = run(pytester, store_dir)
    assert held.ret == 0, held.stdout.str()
    held.stdout.fnmatch_lines(
        [
            f"*QUARANTINED {TEST} - by hand by alice (token), owner ml-infra, until 2999-01-01 00:00 UTC*",
            "*1 passed, 1 quarantined*",
        ]
    )
    quarantine(store_dir, "cd" * 16, **by_hand, expires_at="2024-06-01T09:30:00Z")
    expired = run(pytester, store_dir)
    assert expired.ret == 1
    expired.stdout.fnmatch_lines(
        [
            f"FAILED {TEST} - AssertionError: flaky again*",
            f"flaketriage: NOT QUARANTINED {TEST} - its quarantine (owner ml-infra) expired at "
            "2024-06-01 09:30 UTC",
            "*1 failed, 1 passed*",
        ]
    )
