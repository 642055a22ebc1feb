"""End to end: ``flaketriage triage`` of a real captured deterministic bundle, with the GitHub
settings pointing at the stand-in, files one issue carrying the marker and the minimal data inline;
triaging it again updates that issue."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from flaketriage.workers.report import IssueRecord
from tests.workers.github.conftest import REPO, TOKEN
from tests.workers.github.stand_in import GitHubStandIn, iter_markers

pytestmark = pytest.mark.slow

LOAD = """
import csv
seen = {}
for row in csv.DictReader(open("data/users.csv")):
    if row["email"] in seen:
        raise ValueError(f"duplicate email {row['email']} in rows {seen[row['email']]} and {row['id']}")
    seen[row["email"]] = row["id"]
print("loaded", len(seen))
"""


def flaketriage(root: Path, *args: str, env: dict[str, str]) -> dict[str, Any]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("FLAKETRIAGE_")}
    full.update(env, FLAKETRIAGE_STORE=str(root / ".flaketriage"), NO_PROXY="127.0.0.1")
    proc = subprocess.run(
        [sys.executable, "-m", "flaketriage", *args],
        cwd=root,
        env=full,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode in (0, 1), proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr
    data: dict[str, Any] = json.loads(lines[-1])
    data["_stderr"] = proc.stderr
    return data


def test_triage_files_one_github_issue_with_the_marker_and_the_minimal_data(
    github: GitHubStandIn, tmp_path: Path
) -> None:
    root = tmp_path / "project"
    (root / "data").mkdir(parents=True)
    (root / "load.py").write_text(LOAD)
    rows = ["id,email"] + [f"{i},user{i}@example.com" for i in range(200)]
    rows[1 + 150] = "150,user33@example.com"
    (root / "data" / "users.csv").write_text("\n".join(rows) + "\n")
    env = {
        "FLAKETRIAGE_GITHUB_REPO": REPO,
        "FLAKETRIAGE_GITHUB_TOKEN": TOKEN,
        "FLAKETRIAGE_GITHUB_API_URL": github.url,
        "FLAKETRIAGE_SANDBOX": "process",
    }
    cap = flaketriage(
        root, "capture", "--json", "--data", "data/users.csv", "--", sys.executable, "load.py", env=env
    )
    assert cap["bundle"], cap["_stderr"]
    out = flaketriage(root, "triage", cap["bundle"], "--minimize", "--json", env=env)
    assert out["verdict"] == "deterministic", out
    assert out["report"]["kind"] == "github" and out["report"]["created"] is True
    [issue] = github.issues()
    assert out["report"]["location"] == issue["html_url"]
    assert list(iter_markers(issue["body"])) == [cap["fingerprint"]]
    assert [label["name"] for label in issue["labels"]] == ["flaketriage", "deterministic"]
    assert issue["title"] == (
        "[flaketriage] load.py: ValueError: duplicate email user33@\u200bexample.com in rows 33 and 150 "
        "(deterministic)"
    )
    body = issue["body"]
    # The minimal data itself, inline: the header and exactly the two rows that collide.
    assert "## Minimal data" in body
    assert "```csv\nid,email\n33,user33@example.com\n150,user33@example.com\n```" in body
    assert f"flaketriage bundle export {out['minimal_bundle']} repro && cd repro && bash run.sh" in body
    assert not (root / ".flaketriage" / "issues").exists()  # no Markdown issue beside it
    record = IssueRecord.parse(body, "the issue")
    assert record.occurrences == 1 and record.minimal_bundle_id == out["minimal_bundle"]

    again = flaketriage(root, "triage", cap["bundle"], "--json", env=env)
    assert again["report"] == {**out["report"], "created": False}
    [issue] = github.issues()
    assert IssueRecord.parse(issue["body"], "the issue").occurrences == 2
    assert len(github.comments(1)) == 1


def test_triage_with_a_wrong_token_fails_before_replaying_in_one_line(
    github: GitHubStandIn, tmp_path: Path
) -> None:
    root = tmp_path / "project"
    root.mkdir()
    runs = tmp_path / "runs.txt"  # every run of the job, the capture's and any replay's, adds a line
    (root / "job.py").write_text(
        f"open({str(runs)!r}, 'a').write('run\\n')\nraise ZeroDivisionError('boom')\n"
    )
    env = {
        "FLAKETRIAGE_GITHUB_REPO": REPO,
        "FLAKETRIAGE_GITHUB_API_URL": github.url,
        "FLAKETRIAGE_SANDBOX": "process",
    }
    cap = flaketriage(root, "capture", "--json", "--", sys.executable, "job.py", env=env)
    full = {k: v for k, v in os.environ.items() if not k.startswith("FLAKETRIAGE_")}
    full.update(env, FLAKETRIAGE_STORE=str(root / ".flaketriage"), FLAKETRIAGE_GITHUB_TOKEN="ghp_revoked")
    proc = subprocess.run(
        [sys.executable, "-m", "flaketriage", "triage", cap["bundle"]],
        cwd=root, env=full, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    [line] = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert line.startswith("error: GitHub refused the credentials (401 'Bad credentials')")
    assert [c.path for c in github.calls] == [f"/repos/{REPO}"]
    assert runs.read_text() == "run\n"  # the capture ran it; no replay did
