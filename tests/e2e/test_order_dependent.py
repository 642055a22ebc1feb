"""A real suite under the pytest plugin, then `flaketriage triage` on what it captured.

test_a.py::test_pollutes writes a file that test_z.py::test_reads_clean_state does not expect:
the victim passes alone and fails after the polluter, and triage must say so and name it. The
same suite has an ordinary failure, which must replay as deterministic. A second suite has the two
other shapes of order dependence: a test that fails on its second run in one process (its own
polluter), and a brittle test that fails alone and passes after the test that sets up its state.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

pytestmark = pytest.mark.slow

SUITE = {
    "test_a.py": """
import json
def test_before():
    pass
def test_pollutes():
    with open("settings.json", "w") as f:
        json.dump({"mode": "debug"}, f)
def test_after():
    pass
""",
    "test_b.py": "\n".join(f"def test_{i}():\n    assert {i} >= 0\n" for i in range(5)),
    "test_z.py": """
import json, os
def test_reads_clean_state():
    mode = json.load(open("settings.json"))["mode"] if os.path.exists("settings.json") else "release"
    assert mode == "release", f"unexpected mode {mode!r}"
def test_real_bug():
    assert sum([0.1] * 3) == 0.3
""",
}


def _pytest(project: Any, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLAKETRIAGE_", "PYTEST_"))}
    env.pop("CI", None)
    env["FLAKETRIAGE_STORE"] = str(project.store)
    # Of the plugins installed here only flaketriage's, by its entry point: the others (schemathesis,
    # hypothesis...) take seconds to load, in this run and in every replay (the bundles record this
    # environment for them).
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "flaketriage",
            "--flaketriage",
            "-p",
            "no:cacheprovider",
            *args,
        ],
        cwd=project.root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_polluter_is_found_and_ordinary_failure_is_deterministic(project: Any) -> None:
    for name, text in SUITE.items():
        project.write(name, text)
    project.git_init()
    run = _pytest(project)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "flaketriage: captured 2 failure(s): " in run.stdout
    listed = project.run("bundle", "list", "--json")
    bundles = {b["test_id"]: b["id"] for b in json.loads(listed.stdout)}
    assert set(bundles) == {"test_z.py::test_reads_clean_state", "test_z.py::test_real_bug"}

    victim = project.run_json("triage", bundles["test_z.py::test_reads_clean_state"])
    assert victim["verdict"] == "order_dependent", victim
    assert victim["polluters"] == ["test_a.py::test_pollutes"]
    assert victim["passes"] == 5 and victim["polluter_search"]["preceding"] == 8
    assert victim["report"]["kind"] == "markdown"

    bug = project.run_json("triage", bundles["test_z.py::test_real_bug"])
    assert bug["verdict"] == "deterministic", bug
    assert bug["polluters"] == [] and bug["polluter_search"] is None

    # The human form, with a policy that decides after 2 runs each way to keep this quick.
    human = project.run(
        "triage", bundles["test_z.py::test_reads_clean_state"], env={"FLAKETRIAGE_MAX_FLAKY_RATE": "0.2"}
    )
    assert human.returncode == 0, human.stderr
    assert "order-dependent: passes alone; fails after test_a.py::test_pollutes" in human.stdout


SHAPES = {
    "test_c.py": """
SEEN = []
def test_registers_once():
    SEEN.append("plugin")
    assert SEEN.count("plugin") == 1, f"registered {SEEN.count('plugin')} times"
""",
    "test_d.py": """
import os
def test_needs_setup():
    assert os.environ.get("SERVICE_READY") == "1", "the service was never set up"
""",
    "test_e.py": """
import os
def test_unrelated():
    pass
def test_sets_up():
    os.environ["SERVICE_READY"] = "1"
""",
}


def _captured(project: Any, files: dict[str, str], *args: str) -> dict[str, str]:
    """Write the suite into a git project, run it under the plugin (it must fail): test id -> bundle."""
    for name, text in files.items():
        project.write(name, text)
    project.git_init()
    run = _pytest(project, *args)
    assert run.returncode == 1, run.stdout + run.stderr
    return {b["test_id"]: b["id"] for b in json.loads(project.run("bundle", "list", "--json").stdout)}


QUICK = {"FLAKETRIAGE_MAX_FLAKY_RATE": "0.2"}
"""Decide after 2 replays each way (and confirm once): the verdicts are the same, in fewer runs."""


def test_a_test_run_twice_is_its_own_polluter_and_a_brittle_test_names_its_setter(project: Any) -> None:
    # The file run twice (as a CI step that reruns a module would); the brittle test before its setter.
    bundles = _captured(
        project, SHAPES, "--keep-duplicates", "test_c.py", "test_d.py", "test_e.py", "test_c.py"
    )
    assert set(bundles) == {"test_c.py::test_registers_once", "test_d.py::test_needs_setup"}

    twice = project.run_json("triage", bundles["test_c.py::test_registers_once"], env=QUICK)
    assert twice["verdict"] == "order_dependent", twice
    assert twice["polluters"] == ["test_c.py::test_registers_once"]
    assert twice["polluter_search"]["itself"] is True
    assert twice["order_cause"].startswith("fails when run twice in one process")
    issue = project.root.joinpath(twice["report"]["location"]).read_text()
    assert (
        "fails when it runs twice in one process" in issue
        and "--count 2 test_c.py::test_registers_once" in issue
    )

    brittle = project.run_json("triage", bundles["test_d.py::test_needs_setup"], env=QUICK)
    assert brittle["verdict"] == "order_dependent", brittle
    assert brittle["polluters"] == ["test_e.py::test_sets_up"]
    assert brittle["polluter_search"]["kind"] == "setters"
    assert brittle["failures"] == brittle["replays"]  # it failed alone every time
    issue = project.root.joinpath(brittle["report"]["location"]).read_text()
    assert "passes once these tests ran first" in issue and "test_e.py::test_sets_up" in issue


def test_pytest_repeat_repetitions_replay_with_the_plugin_that_made_them(project: Any) -> None:
    bundles = _captured(
        project, {"test_c.py": SHAPES["test_c.py"]}, "-p", "repeat", "--count", "3", "test_c.py"
    )
    assert set(bundles) == {"test_c.py::test_registers_once[2-3]", "test_c.py::test_registers_once[3-3]"}
    result = project.run_json("triage", bundles["test_c.py::test_registers_once[2-3]"], env=QUICK)
    assert result["verdict"] == "order_dependent", result
    assert result["passes"] == result["replays"]  # alone (its own id, under --count 3) it passes
    assert result["polluters"] == ["test_c.py::test_registers_once[1-3]"]
    assert result["polluter_search"]["itself"] is True
