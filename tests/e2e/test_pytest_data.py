"""A pytest failure on one bad CSV row is narrowed to that row, as the same bug through ``capture --data``.

A real git project whose test reads ``data/prices.csv`` (200 rows, one negative price) and names it
with ``@pytest.mark.flaketriage_data``; ``pytest --flaketriage`` runs as CI would, then
``flaketriage triage --minimize`` (the real CLI) reduces the bundle. The same project captured with
``flaketriage capture --data`` around the same pytest command must come out the same.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from flaketriage.bundle.io import list_bundles, load_manifest
from flaketriage.store import LocalStore

pytestmark = pytest.mark.slow

ROWS, BAD = 200, 137

TEST_PRICES = """
import csv
import pytest

@pytest.mark.flaketriage_data("data/prices.csv")
def test_prices_are_not_negative():
    for row in csv.DictReader(open("data/prices.csv")):
        assert float(row["price"]) >= 0, f"negative price for {row['sku']}"
"""

TEST_BUILT = """
import csv

def test_built_prices_are_not_negative(tmp_path, flaketriage_data):
    raw = tmp_path / "prices.csv"
    raw.write_text(open("data/prices.csv").read())  # built at run time, in a directory of its own
    for row in csv.DictReader(open(flaketriage_data.add(raw))):
        assert float(row["price"]) >= 0, f"negative price for {row['sku']}"
"""


def _env(project: Any) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLAKETRIAGE_", "PYTEST_"))}
    env.pop("CI", None)
    env["FLAKETRIAGE_STORE"] = str(project.store)
    # flaketriage's plugin alone, by its entry point: the others installed here take seconds to
    # load, in this run and in every replay.
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return env


def _pytest(project: Any, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "pytest", "-p", "flaketriage", "-p", "no:cacheprovider", "--strict-markers"]
    return subprocess.run(
        [*argv, *args],
        cwd=project.root,
        env=_env(project),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _bundle_of(run: subprocess.CompletedProcess[str], store: Path) -> str:
    assert run.returncode == 1, run.stdout + run.stderr
    assert "flaketriage: warning" not in run.stdout, run.stdout
    assert "flaketriage: captured 1 failure(s): " in run.stdout, run.stdout
    [bundle] = list_bundles(LocalStore(store))
    return bundle.id


def _project(project: Any, tests: dict[str, str]) -> None:
    rows = [f"sku-{i},{-3.5 if i == BAD else round(1 + i * 0.25, 2)}" for i in range(ROWS)]
    project.write("data/prices.csv", "sku,price\n" + "\n".join(rows) + "\n")
    for name, text in tests.items():
        project.write(name, text)
    project.git_init()


def _minimized(project: Any, bundle: str, data: str) -> tuple[dict[str, Any], list[str]]:
    """Triage with minimization; the rows of `data` in the minimal bundle, as exported."""
    out = project.run_json("triage", bundle, "--minimize")
    assert out["verdict"] == "deterministic", out
    export = project.root.parent / f"repro-{bundle[:12]}"
    exported = project.run("bundle", "export", out["minimal_bundle"], str(export))
    assert exported.returncode == 0, exported.stderr
    return out, (export / "workspace" / data).read_text().splitlines()


def test_a_bad_row_in_marked_data_is_minimized_to_that_row_as_capture_data_does(project: Any) -> None:
    _project(project, {"test_prices.py": TEST_PRICES})
    bundle = _bundle_of(_pytest(project, "--flaketriage"), project.store)
    out, rows = _minimized(project, bundle, "data/prices.csv")
    assert out["minimal"]["data"] == {"data/prices.csv": {"kept": 1, "of": ROWS}}
    assert rows == ["sku,price", f"sku-{BAD},-3.5"]
    report = Path(out["report"]["location"]).read_text()
    assert "data/prices.csv" in report and f"kept 1 of {ROWS}" in report
    assert f"negative price for sku-{BAD}" in report

    # The same failure through `capture --data` around the same pytest command: the same reduction.
    pytest_argv = ["-m", "pytest", "-p", "flaketriage", "-p", "no:cacheprovider", "test_prices.py"]
    env = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    cap = project.run_json(
        "capture", "--data", "data/prices.csv", "--", sys.executable, *pytest_argv, env=env
    )
    assert cap["_exit"] == 1 and cap["bundle"], cap["_stderr"]
    by_capture, capture_rows = _minimized(project, cap["bundle"], "data/prices.csv")
    assert by_capture["minimal"]["data"] == out["minimal"]["data"]
    assert capture_rows == rows


def test_data_the_test_builds_is_minimized_through_the_fixture(project: Any) -> None:
    _project(project, {"test_built.py": TEST_BUILT})
    bundle = _bundle_of(_pytest(project, "--flaketriage"), project.store)
    [built] = load_manifest(LocalStore(project.store), bundle).data
    assert built.path.startswith(".flaketriage-data/") and built.path.endswith("/prices.csv")
    out, rows = _minimized(project, bundle, built.path)
    assert out["minimal"]["data"] == {built.path: {"kept": 1, "of": ROWS}}
    assert rows == ["sku,price", f"sku-{BAD},-3.5"]
