"""Data a pytest test declares (marker, ini option, fixture), stored as ``capture --data`` stores it.

Real suites run by pytester in real pytest processes, then what landed in the store is read back
and compared with what `run_and_capture` stores for ``--data`` of the same file. The minimization
itself, through the CLI, is in ``tests/e2e/test_pytest_data.py``.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import pytest

from flaketriage.bundle.io import list_bundles, load_manifest, write_bundle
from flaketriage.bundle.manifest import Manifest
from flaketriage.capture.record import CaptureRequest, run_and_capture
from flaketriage.capture.source import SourceLimits
from flaketriage.ci.pytest_data import DATA_DIR, BuiltData, data_key, declared_data
from flaketriage.store import LocalStore
from flaketriage.workers.replay import ReplayContext, Replayer, Variant
from flaketriage.workers.sandbox import ProcessSandbox
from flaketriage.workers.verdict import Outcome

pytest_plugins = ["pytester"]

BAD_ROW = 137


def prices_csv(rows: int = 200, bad: int | None = BAD_ROW) -> str:
    lines = ["sku,price"] + [f"sku-{i},{-1 if i == bad else i + 0.5}" for i in range(rows)]
    return "\n".join(lines) + "\n"


CHECKS_PRICES = """
import csv

def check(path):
    for row in csv.DictReader(open(path)):
        assert float(row["price"]) >= 0, f"negative price for {row['sku']}"
"""

MARKED = (
    CHECKS_PRICES
    + """
import pytest

@pytest.mark.flaketriage_data("data/prices.csv")
def test_prices():
    check("data/prices.csv")
"""
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("FLAKETRIAGE_") or name in ("CI", "BUILD_NUMBER", "PYTEST_ADDOPTS"):
            monkeypatch.delenv(name)
    # flaketriage's plugin alone (`run` names it): the others installed here take seconds to load,
    # in every run and in every replay of what it captures.
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "store"


def run(pytester: pytest.Pytester, store_dir: Path, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(
        "-p",
        "flaketriage",
        "--flaketriage",
        f"--flaketriage-store={store_dir}",
        "-p",
        "no:cacheprovider",
        "--strict-markers",
        *args,
        timeout=120,
    )


def only_bundle(store_dir: Path) -> Manifest:
    store = LocalStore(store_dir)
    bundles = list(list_bundles(store))
    assert len(bundles) == 1, bundles
    return load_manifest(store, bundles[0].id)


def without_pytester_temproot(store: LocalStore, manifest: Manifest) -> Manifest:
    """The bundle less pytester's ``PYTEST_DEBUG_TEMPROOT``: a directory under this machine's /tmp,
    which the replay's private /tmp does not have (a CI run sets no such variable), so the replayed
    ``tmp_path`` is made where a CI run's is."""
    env = {k: v for k, v in manifest.command.env.items() if k != "PYTEST_DEBUG_TEMPROOT"}
    command = manifest.command.model_copy(update={"env": env})
    return load_manifest(store, write_bundle(store, manifest.model_copy(update={"command": command})))


def warnings(result: pytest.RunResult) -> list[str]:
    return [line for line in result.outlines if line.startswith("flaketriage: warning: ")]


# -- the marker --------------------------------------------------------------------------------
def test_marker_data_is_stored_exactly_as_capture_data_stores_it(
    pytester: pytest.Pytester, store_dir: Path, tmp_path: Path
) -> None:
    data = pytester.path / "data" / "prices.csv"
    data.parent.mkdir()
    data.write_text(prices_csv())
    pytester.makepyfile(test_prices=MARKED)
    result = run(pytester, store_dir)
    assert result.ret == 1
    assert warnings(result) == []
    result.stdout.fnmatch_lines(["flaketriage: captured 1 failure(s): *"])
    [stored] = only_bundle(store_dir).data

    other = LocalStore(tmp_path / "capture-store")
    request = CaptureRequest(
        argv=[sys.executable, "-c", "raise SystemExit(1)"],
        cwd=pytester.path,
        limits=SourceLimits(max_file_bytes=2**20, max_total_bytes=2**24),
        data=[Path("data/prices.csv")],
        echo=False,
    )
    [by_capture] = load_manifest(other, str(run_and_capture(other, request).bundle_id)).data
    assert stored == by_capture
    assert (stored.path, stored.format, stored.items, stored.reducible) == (
        "data/prices.csv",
        "csv",
        200,
        True,
    )
    assert stored.blob is not None and stored.blob.sha256 == hashlib.sha256(data.read_bytes()).hexdigest()


def test_the_marker_is_registered_for_strict_markers_even_with_the_plugin_off(
    pytester: pytest.Pytester, store_dir: Path
) -> None:
    pytester.makepyfile(
        test_ok="""
import pytest

@pytest.mark.flaketriage_data("nothing.csv")
def test_ok():
    pass
"""
    )
    off = pytester.runpytest_subprocess("-p", "flaketriage", "--strict-markers", "-p", "no:cacheprovider")
    assert off.ret == 0, off.stdout.str()
    on = run(pytester, store_dir)
    assert on.ret == 0, on.stdout.str()
    assert warnings(on) == []  # a passing test's data is never looked at
    help_text = pytester.runpytest_subprocess("-p", "flaketriage", "--markers").stdout.str()
    assert "@pytest.mark.flaketriage_data(*paths)" in help_text


def test_marker_paths_are_relative_to_the_rootdir_wherever_pytest_runs(
    pytester: pytest.Pytester, store_dir: Path
) -> None:
    (pytester.path / "pytest.ini").write_text("[pytest]\n")
    suite = pytester.path / "suite"
    suite.mkdir()
    (suite / "data").mkdir()
    (suite / "data" / "prices.csv").write_text(prices_csv())
    (suite / "test_prices.py").write_text(MARKED.replace('"data/prices.csv")', '"suite/data/prices.csv")'))
    result = pytester.runpytest_subprocess(
        "-p", "flaketriage", "--flaketriage", f"--flaketriage-store={store_dir}", "-p", "no:cacheprovider",
        "--rootdir", str(pytester.path), str(suite / "test_prices.py"),
        timeout=120,
    )  # fmt: skip
    assert result.ret == 1
    [stored] = only_bundle(store_dir).data
    assert stored.path == "suite/data/prices.csv" and stored.items == 200


# -- the ini option ----------------------------------------------------------------------------
def test_ini_paths_and_globs_are_data_of_every_test(pytester: pytest.Pytester, store_dir: Path) -> None:
    (pytester.path / "data").mkdir()
    (pytester.path / "data" / "prices.csv").write_text(prices_csv())
    (pytester.path / "data" / "old.csv").write_text(prices_csv(10, bad=None))
    (pytester.path / "data" / "events.jsonl").write_text('{"a": 1}\n{"a": 2}\n')
    pytester.makeini(
        "[pytest]\nflaketriage_data =\n    data/*.csv\n    data/events.jsonl\n    missing/*.csv\n"
    )
    pytester.makepyfile(test_prices=CHECKS_PRICES + "\ndef test_prices():\n    check('data/prices.csv')\n")
    result = run(pytester, store_dir)
    assert result.ret == 1
    manifest = only_bundle(store_dir)
    assert {d.path: d.items for d in manifest.data} == {
        "data/old.csv": 10,
        "data/prices.csv": 200,
        "data/events.jsonl": 2,
    }
    assert warnings(result) == [
        "flaketriage: warning: ini flaketriage_data entry 'missing/*.csv' matches no file under the "
        f"rootdir {pytester.path}; no data taken from it"
    ]


def test_a_path_declared_by_the_marker_and_the_ini_option_is_one_input(
    pytester: pytest.Pytester, store_dir: Path
) -> None:
    (pytester.path / "data").mkdir()
    (pytester.path / "data" / "prices.csv").write_text(prices_csv())
    pytester.makeini("[pytest]\nflaketriage_data = data/prices.csv\n")
    pytester.makepyfile(test_prices=MARKED)
    assert run(pytester, store_dir).ret == 1
    assert [d.path for d in only_bundle(store_dir).data] == ["data/prices.csv"]


# -- the fixture -------------------------------------------------------------------------------
BUILDS_ITS_DATA = (
    CHECKS_PRICES
    + f"""
BAD = {BAD_ROW}

def test_built(tmp_path, flaketriage_data):
    raw = tmp_path / "prices.csv"
    raw.write_text("sku,price\\n" + "".join(f"sku-{{i}},{{-1 if i == BAD else i}}\\n" for i in range(200)))
    check(flaketriage_data.add(raw))
"""
)


def test_data_a_test_builds_is_stored_and_a_replay_reads_the_captured_copy(
    pytester: pytest.Pytester, store_dir: Path
) -> None:
    pytester.makepyfile(test_built=BUILDS_ITS_DATA)
    assert run(pytester, store_dir).ret == 1
    manifest = only_bundle(store_dir)
    [stored] = manifest.data
    rel = f"{DATA_DIR}/{data_key('test_built.py::test_built')}/prices.csv"
    assert (stored.path, stored.format, stored.items) == (rel, "csv", 200)
    # The replay restores the data at that stable path (the test's tmp_path differs each run) and
    # `add` hands the test that copy: without the bad row it passes, with it it fails again.
    store = LocalStore(store_dir)
    manifest = without_pytester_temproot(store, manifest)
    with Replayer(store, manifest, ProcessSandbox(), context=ReplayContext.from_process()) as replayer:
        assert replayer.run().outcome is Outcome.REPRODUCED
        good = [i for i in range(200) if i != BAD_ROW]
        assert replayer.run(Variant(data={rel: good})).outcome is Outcome.PASSED
        assert replayer.run(Variant(data={rel: [BAD_ROW]})).outcome is Outcome.REPRODUCED


def test_the_fixture_hands_back_the_written_path_outside_a_replay(tmp_path: Path) -> None:
    written = tmp_path / "rows.csv"
    built = BuiltData("t.py::test_x", tmp_path / "cwd", environ={})
    assert built.add(written) == written
    assert built.add(tmp_path / "other" / "rows.csv") == tmp_path / "other" / "rows.csv"
    key = data_key("t.py::test_x")
    assert [rel for _, rel in built.added] == [f"{DATA_DIR}/{key}/rows.csv", f"{DATA_DIR}/{key}/2-rows.csv"]


def test_inside_a_replay_the_fixture_hands_back_the_restored_copy(tmp_path: Path) -> None:
    cwd = tmp_path / "cwd"
    restored = cwd / DATA_DIR / data_key("t.py::test_x") / "rows.csv"
    restored.parent.mkdir(parents=True)
    restored.write_text("a\n1\n")
    built = BuiltData("t.py::test_x", cwd, environ={"FLAKETRIAGE_REPLAY": "1"})
    assert built.add(tmp_path / "rows.csv") == restored
    # An input the capture did not store (it was missing then) is the test's own again.
    assert built.add(tmp_path / "new.csv") == tmp_path / "new.csv"


def test_data_keys_are_bounded_names_distinct_per_test() -> None:
    keys = {data_key(n) for n in ("a.py::t[1]", "a.py::t[2]", "a.py::t/../x", "a.py::" + "y" * 500)}
    assert len(keys) == 4
    assert all(len(k) <= 91 and "/" not in k and not k.startswith(".") for k in keys)


# -- careless and hostile declarations ---------------------------------------------------------
def test_unusable_declarations_are_one_warning_each_and_the_failure_is_still_captured(
    pytester: pytest.Pytester, store_dir: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "secret.csv"
    outside.write_text("token\nhunter2\n")
    (pytester.path / "data").mkdir()
    (pytester.path / "data" / "prices.csv").write_text(prices_csv())
    (pytester.path / "data" / "link.csv").symlink_to(outside)
    (pytester.path / "data" / "notes.txt").write_text("not reducible\n")
    pytester.makepyfile(
        test_prices=CHECKS_PRICES
        + """
import pytest

@pytest.mark.flaketriage_data(
    "../../etc/passwd", "data/link.csv", "data/missing.csv", "/etc/passwd", "data/notes.txt", 42,
    "data/prices.csv",
)
def test_prices(flaketriage_data, tmp_path):
    flaketriage_data.add(tmp_path / "never-written.csv")
    check("data/prices.csv")
"""
    )
    result = run(pytester, store_dir)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["flaketriage: captured 1 failure(s): *"])
    assert [d.path for d in only_bundle(store_dir).data] == ["data/prices.csv"]
    lines = warnings(result)
    assert len(lines) == 7, lines
    expected = [
        "*'../../etc/passwd' leads out of the rootdir *; only data inside it is captured",
        f"*'data/link.csv' is a symbolic link to {outside}, outside the rootdir *: never followed*",
        "*'data/missing.csv': no such file or directory under the rootdir *; left out of the bundle",
        "*'/etc/passwd' is absolute; give it relative to the rootdir *",
        "*'data/notes.txt': data input * has suffix '.txt', which flaketriage cannot reduce*",
        "*marker path 42: expected a path relative to the rootdir, got 42*",
        "*flaketriage_data.add(*never-written.csv'): no such file or directory when the test failed*",
    ]
    for pattern in expected:
        result.stdout.fnmatch_lines([pattern])
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    assert "hunter2" not in "".join(
        p.read_text(errors="replace") for p in store_dir.rglob("*") if p.is_file()
    )


def test_a_broken_csv_is_left_out_with_capture_datas_reason(
    pytester: pytest.Pytester, store_dir: Path
) -> None:
    (pytester.path / "data").mkdir()
    (pytester.path / "data" / "prices.csv").write_bytes(b"sku,price\nx\ry,1\n")  # a bare CR in a row
    pytester.makepyfile(
        test_prices='import pytest\n@pytest.mark.flaketriage_data("data/prices.csv")\ndef test_prices():\n'
        "    assert False\n"
    )
    result = run(pytester, store_dir)
    assert result.ret == 1
    assert only_bundle(store_dir).data == ()
    [line] = warnings(result)
    assert line.startswith("flaketriage: warning: marker path 'data/prices.csv': ")
    assert "not readable as CSV" in line and line.endswith("; left out of the bundle")


def test_a_symbolic_link_out_of_the_rootdir_through_a_directory_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "data").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "prices.csv").write_text("a\n1\n")
    (root / "data" / "ext").symlink_to(elsewhere, target_is_directory=True)
    (root / "data" / "inside.csv").write_text("a\n1\n")
    (root / "data" / "alias.csv").symlink_to("inside.csv")
    declared, notes = declared_data(
        marker_paths=["data/ext/prices.csv", "data/alias.csv", "data/../data/inside.csv"],
        ini_patterns=["data/ext/*.csv", "../elsewhere/*"],
        added=[(root / "data" / "alias.csv", f"{DATA_DIR}/k/alias.csv")],
        rootdir=root,
        invocation_dir=root,
    )
    # A link that stays inside is followed, as `capture --data` follows it: stored where it leads.
    assert [d.rel for d in declared] == ["data/inside.csv", "data/inside.csv"]
    assert len(notes) == 4, notes
    assert sum("outside the rootdir" in n for n in notes) == 2
    assert sum("leads out of the rootdir" in n for n in notes) == 1
    assert "flaketriage_data.add(" in notes[-1] and "is a symbolic link" in notes[-1]


def test_data_outside_the_directory_pytest_runs_in_is_left_out(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.csv").write_text("a\n1\n")
    (tmp_path / "sub").mkdir()
    declared, notes = declared_data(
        marker_paths=["data/x.csv", "sub"],
        ini_patterns=[],
        added=[],
        rootdir=tmp_path,
        invocation_dir=tmp_path / "sub",
    )
    assert declared == []
    assert "outside the directory pytest runs in" in notes[0]
    assert "the whole directory pytest runs in" in notes[1]


def test_data_above_the_source_limits_is_stored_whole_as_capture_data_stores_it(
    pytester: pytest.Pytester, store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `capture --data` has no size cap (the data is streamed into the store): the source caps do
    # not apply to declared data, here or there.
    monkeypatch.setenv("FLAKETRIAGE_SNAPSHOT_MAX_FILE_MB", "0.01")
    monkeypatch.setenv("FLAKETRIAGE_SNAPSHOT_MAX_TOTAL_MB", "0.01")
    rows = 60_000
    data = pytester.path / "data" / "prices.csv"
    data.parent.mkdir()
    data.write_text(prices_csv(rows, bad=rows - 1))
    assert data.stat().st_size > 100 * 0.01 * 2**20
    pytester.makepyfile(test_prices=MARKED)
    assert run(pytester, store_dir).ret == 1
    [stored] = only_bundle(store_dir).data
    assert stored.items == rows
    assert stored.blob is not None and stored.blob.size == data.stat().st_size
