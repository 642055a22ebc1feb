"""The case identity the pytest plugin gives a failing test: its exception through its frames (from
the test function on, pytest's own left out), in the space of a captured program's and a Sentry
event's, while the fingerprint stays the one a replay of the rerun computes. Where there is no
exception to read (an XPASS(strict)) or what is read is malformed, the fingerprint stands for it.
Real pytest sessions (pytester, in subprocesses); the bundles replayed by the real `triage`.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from flaketriage.bundle.io import list_bundles, load_manifest, write_bundle
from flaketriage.bundle.manifest import Manifest
from flaketriage.ci.pytest_bundle import FailedTest, SessionFacts, case_identity
from flaketriage.failure.fingerprint import exception_identity, fingerprint_exception
from flaketriage.store import LocalStore
from flaketriage.workers.replay import ReplayContext
from flaketriage.workers.sandbox import ProcessSandbox
from flaketriage.workers.triage import triage
from flaketriage.workers.verdict import Verdict, VerdictPolicy
from tests.ci.test_pytest_plugin import run

pytest_plugins = ["pytester"]

HEX = re.compile(r"^[0-9a-f]{64}$")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("FLAKETRIAGE_") or name in (
            "CI",
            "BUILD_NUMBER",
            "PYTEST_ADDOPTS",
            "PYTHONHASHSEED",
        ):
            monkeypatch.delenv(name)
    # The plugin alone: the others installed here take seconds to load in every run and replay.
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "store"


def bundles(store_dir: Path) -> list[Manifest]:
    if not store_dir.exists():
        return []
    store = LocalStore(store_dir)
    return [load_manifest(store, b.id) for b in list_bundles(store)]


def _identity(root: Path, kind: str, message: str, *frames: tuple[str, str]) -> str:
    return fingerprint_exception(
        kind, message, [(f"{root}/{f}", fn) for f, fn in frames], [str(root)]
    ).fingerprint


TRAINER = 'def load(batch):\n    raise ValueError(f"bad batch {batch}")\n'


def test_a_failing_test_is_identified_by_its_exception_through_its_frames(
    pytester: pytest.Pytester, store_dir: Path
) -> None:
    pytester.makepyfile(
        trainer=TRAINER, test_trainer="from trainer import load\n\ndef test_load():\n    load(7)\n"
    )

    result = run(pytester, store_dir)

    assert result.ret == 1
    [manifest] = bundles(store_dir)
    failure = manifest.failure
    root = pytester.path
    expected = _identity(
        root, "ValueError", "bad batch 7", ("test_trainer.py", "test_load"), ("trainer.py", "load")
    )
    assert failure.identity == expected == failure.case_identity
    # The fingerprint is still the rerun summary's, which replays match.
    assert failure.signature.startswith("pytest|test_trainer.py::test_load|ValueError|")


def test_an_exception_of_a_module_is_named_as_a_traceback_names_it(
    pytester: pytest.Pytester, store_dir: Path
) -> None:
    pytester.makepyfile(
        errors="class BatchError(Exception):\n    pass\n",
        test_x="from errors import BatchError\n\ndef test_x():\n    raise BatchError('bad')\n",
    )

    run(pytester, store_dir)

    [manifest] = bundles(store_dir)
    assert manifest.failure.identity == _identity(
        pytester.path, "errors.BatchError", "bad", ("test_x.py", "test_x")
    )


def test_a_fixture_error_is_identified_by_the_fixtures_frames(
    pytester: pytest.Pytester, store_dir: Path
) -> None:
    pytester.makepyfile(
        test_x="import pytest\n\n@pytest.fixture\ndef db():\n    raise RuntimeError('no database')\n\n"
        "def test_x(db):\n    pass\n"
    )

    result = run(pytester, store_dir)

    assert result.ret == 1
    [manifest] = bundles(store_dir)
    assert manifest.failure.identity == _identity(
        pytester.path, "RuntimeError", "no database", ("test_x.py", "db")
    )


def test_an_xpass_strict_has_no_exception_and_is_keyed_by_its_fingerprint(
    pytester: pytest.Pytester, store_dir: Path
) -> None:
    pytester.makepyfile(test_x="import pytest\n\n@pytest.mark.xfail(strict=True)\ndef test_x():\n    pass\n")

    result = run(pytester, store_dir)

    assert result.ret == 1
    [manifest] = bundles(store_dir)
    assert manifest.failure.identity is None
    assert manifest.failure.case_identity == manifest.failure.fingerprint
    assert b'"identity"' not in manifest.canonical_json()


def test_skips_and_xfails_capture_nothing(pytester: pytest.Pytester, store_dir: Path) -> None:
    pytester.makepyfile(
        test_x="import pytest\n\ndef test_skip():\n    pytest.skip('later')\n\n"
        "@pytest.mark.xfail\ndef test_xfail():\n    raise ValueError('known')\n"
    )

    result = run(pytester, store_dir)

    assert result.ret == 0
    result.stdout.fnmatch_lines(["flaketriage: captured 0 failures"])
    assert bundles(store_dir) == []


def test_a_deep_recursion_is_one_frame_per_function(pytester: pytest.Pytester, store_dir: Path) -> None:
    pytester.makepyfile(test_x="def down(n):\n    return down(n + 1)\n\ndef test_deep():\n    down(0)\n")

    result = run(pytester, store_dir)

    assert result.ret == 1
    [manifest] = bundles(store_dir)
    message = "maximum recursion depth exceeded"
    assert manifest.failure.identity == _identity(
        pytester.path, "RecursionError", message, ("test_x.py", "test_deep"), ("test_x.py", "down")
    )


def test_an_exception_whose_str_raises_is_still_identified(
    pytester: pytest.Pytester, store_dir: Path
) -> None:
    pytester.makepyfile(
        test_x="class Odd(Exception):\n    def __str__(self):\n        raise RuntimeError('no')\n\n"
        "def test_x():\n    raise Odd()\n"
    )

    result = run(pytester, store_dir)

    assert result.ret == 1
    [manifest] = bundles(store_dir)
    assert manifest.failure.identity == _identity(
        pytester.path, "test_x.Odd", "<exception str() failed>", ("test_x.py", "test_x")
    )


def test_a_pytest_xdist_worker_sends_its_identity_on(pytester: pytest.Pytester, store_dir: Path) -> None:
    pytester.makepyfile(
        trainer=TRAINER, test_trainer="from trainer import load\n\ndef test_load():\n    load(7)\n"
    )

    result = run(pytester, store_dir, "-p", "xdist", "-n", "2")

    assert result.ret == 1, result.stdout.str()
    [manifest] = bundles(store_dir)
    assert manifest.failure.identity == _identity(
        pytester.path, "ValueError", "bad batch 7", ("test_trainer.py", "test_load"), ("trainer.py", "load")
    )


# -- what the plugin read, however odd ------------------------------------------------------------
def _facts(root: Path) -> SessionFacts:
    return SessionFacts(invocation_dir=root, rootdir=root, verbose=0, force_short_summary=False, started_ns=0)


def _failed(*raised: Any) -> FailedTest:
    return FailedTest(
        nodeid="t.py::t", reports=[SimpleNamespace(flaketriage_exception=r) for r in raised], preceding=()
    )


def test_nul_surrogates_and_thousands_of_frames_give_an_identity(tmp_path: Path) -> None:
    frames = tuple((f"{tmp_path}/m\x00\udcff{i % 7}.py", f"f\x00\udcff{i}") for i in range(5000))
    got = case_identity(_failed(("Bad\x00Error", "bad \udcff\x00 value", frames)), _facts(tmp_path))

    assert got is not None and HEX.match(got)
    assert got == exception_identity("Bad\x00Error", "bad \udcff\x00 value", frames, [str(tmp_path)])


@pytest.mark.parametrize(
    "raised",
    [
        None,
        "ValueError",
        ("ValueError", "bad"),
        ("ValueError", "bad", (("only-a-file",),)),
        ("ValueError", 7, (("a.py", "f"),)),
        (None, "bad", (("a.py", "f"),)),
        ("ValueError", "bad", "a.py"),
        ("ValueError", "bad", ((b"a.py", "f"),)),
        ("", "bad", (("a.py", "f"),)),
        ("ValueError", "bad", ()),
    ],
    ids=repr,
)
def test_anything_else_falls_back_to_the_fingerprint(tmp_path: Path, raised: Any) -> None:
    assert case_identity(_failed(raised), _facts(tmp_path)) is None


def test_the_first_report_with_an_exception_names_it(tmp_path: Path) -> None:
    first = ("ValueError", "bad", [["a.py", "f"]])  # lists: as a pytest-xdist worker sends them
    got = case_identity(_failed(None, first, ("KeyError", "k", (("b.py", "g"),))), _facts(tmp_path))

    assert got == exception_identity("ValueError", "bad", [("a.py", "f")], [str(tmp_path)])


# -- a bundle written before identities -----------------------------------------------------------
def test_a_bundle_without_an_identity_still_reads_and_triages(
    pytester: pytest.Pytester, store_dir: Path
) -> None:
    pytester.makepyfile(
        trainer=TRAINER, test_trainer="from trainer import load\n\ndef test_load():\n    load(7)\n"
    )
    run(pytester, store_dir)
    [new] = bundles(store_dir)
    store = LocalStore(store_dir)
    # What an earlier plugin wrote: the same manifest, without the field.
    old_id = write_bundle(
        store, new.model_copy(update={"failure": new.failure.model_copy(update={"identity": None})})
    )
    old = load_manifest(store, old_id)
    assert b'"identity"' not in old.canonical_json() and old.failure.case_identity == old.failure.fingerprint

    for manifest in (old, new):
        result = triage(
            store,
            manifest.bundle_id,
            sandbox=ProcessSandbox(),
            policy=VerdictPolicy(max_rate=0.2, flaky_rate_replays=0),
            sink=None,
            quarantine=None,
            context=ReplayContext.from_process(),
        )
        assert result.verdict.verdict is Verdict.DETERMINISTIC, (manifest.bundle_id, sys.version)
