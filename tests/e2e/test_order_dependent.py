"""A real suite under the pytest plugin, then `flaketriage triage` on what it captured.

test_a.py::test_pollutes writes a file that test_z.py::test_reads_clean_state does not expect:
the victim passes alone and fails after the polluter, and triage must say so and name it. The
same suite has an ordinary failure, which must replay as deterministic.
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


def _pytest(project: Any) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLAKETRIAGE_", "PYTEST_"))}
    env.pop("CI", None)
    env["FLAKETRIAGE_STORE"] = str(project.store)
    # Of the plugins installed here only flaketriage's, by its entry point: the others (schemathesis,
    # hypothesis...) take seconds to load, in this run and in every replay (the bundles record this
    # environment for them).
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "flaketriage", "--flaketriage", "-p", "no:cacheprovider"],
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
    assert "order-dependent: fails after test_a.py::test_pollutes" in human.stdout
