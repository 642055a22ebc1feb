"""The GitHub composite action: its metadata, and its shell steps run for real on captured bundles.

The steps are run the way the runner runs them (bash -e -o pipefail, with the step's env and
working directory, outputs passed through GITHUB_OUTPUT); the install step and actions/setup-python
are replaced by this checkout's flaketriage. Uploads go to a real S3-compatible server (moto); `aws`
is a stub that records any call, since the action must not need the AWS CLI. The results step sends
JUnit files the real tools wrote (tests/results/fixtures) to the real receiver served on loopback.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from sqlalchemy import select

from flaketriage.bundle.io import list_bundles, verify_bundle
from flaketriage.records.models import UploadRow
from flaketriage.settings import load_settings
from flaketriage.store import LocalStore, open_store
from tests.ci.live_service import SERVICE_SECRET, live_service
from tests.conftest import S3Server

ACTION = Path(__file__).parents[2] / ".github" / "actions" / "capture" / "action.yml"
_EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")

if TYPE_CHECKING:
    from conftest import Receiver  # tests/ci/conftest.py

pytestmark = pytest.mark.usefixtures("clean_env")


def _action() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(ACTION.read_text())
    return data


def test_metadata_is_a_valid_composite_action() -> None:
    action = _action()
    assert action["name"] and action["description"]
    assert action["runs"]["using"] == "composite"
    steps = action["runs"]["steps"]
    assert steps
    declared = set(action["inputs"])
    ids = [s["id"] for s in steps if "id" in s]
    assert len(ids) == len(set(ids))
    for step in steps:
        assert ("run" in step) != ("uses" in step), step
        if "run" in step:
            assert step["shell"] == "bash", step.get("id")
            # Inputs reach scripts through env only: nothing can inject shell through an input.
            assert "${{" not in step["run"], step.get("id")
        text = yaml.safe_dump(step)
        for name in re.findall(r"inputs\.([A-Za-z0-9_-]+)", text):
            assert name in declared, name
        for ref in re.findall(r"steps\.([A-Za-z0-9_-]+)\.outputs", text):
            assert ref in ids[: ids.index(step["id"])] if "id" in step else ref in ids, ref
    for name, spec in action["inputs"].items():
        assert spec.get("description"), name
        assert "default" in spec or spec.get("required"), name
    for output in action["outputs"].values():
        assert _EXPR.search(output["value"])


# -- running the steps ---------------------------------------------------------------------------
class Runner:
    """Runs the action's `run:` steps in order, like the GitHub runner does."""

    def __init__(self, tmp_path: Path, inputs: dict[str, str], env: dict[str, str]) -> None:
        self.workspace = Path(env["GITHUB_WORKSPACE"])
        action = _action()
        self.inputs = {k: str(v.get("default", "")) for k, v in action["inputs"].items()} | inputs
        self.steps: list[dict[str, Any]] = action["runs"]["steps"]
        self.outputs: dict[str, dict[str, str]] = {}
        self.tmp = tmp_path
        self.env = env
        self.logs: dict[str, str] = {}

    def _eval(self, text: str) -> str:
        def one(match: re.Match[str]) -> str:
            expr = match.group(1)
            if m := re.fullmatch(r"inputs\.([\w-]+)", expr):
                return self.inputs[m.group(1)]
            if m := re.fullmatch(r"steps\.([\w-]+)\.outputs\.([\w-]+)", expr):
                return self.outputs.get(m.group(1), {}).get(m.group(2), "")
            raise AssertionError(f"the test runner cannot evaluate {expr!r}")

        return _EXPR.sub(one, text)

    def run(self, replace: dict[str, dict[str, str]]) -> None:
        for step in self.steps:
            sid = step.get("id", "")
            if sid in replace or "uses" in step:
                self.outputs[sid] = replace.get(sid, {})
                continue
            out_file = self.tmp / f"output-{sid}"
            out_file.write_text("")
            script = self.tmp / f"step-{sid}.sh"
            script.write_text(step["run"])
            env = self.env | {k: self._eval(str(v)) for k, v in step.get("env", {}).items()}
            env["GITHUB_OUTPUT"] = str(out_file)
            cwd = Path(self._eval(step.get("working-directory", ".")))
            proc = subprocess.run(
                ["bash", "--noprofile", "--norc", "-e", "-o", "pipefail", str(script)],
                cwd=self.workspace / cwd,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            self.logs[sid] = proc.stdout + proc.stderr
            assert proc.returncode == 0, f"step {sid} failed:\n{proc.stdout}\n{proc.stderr}"
            self.outputs[sid] = dict(
                line.split("=", 1) for line in out_file.read_text().splitlines() if "=" in line
            )


@pytest.fixture
def workspace(tmp_path: Path, captured: tuple[Path, list[str]]) -> tuple[Path, list[str]]:
    ws = tmp_path / "ws"
    shutil.copytree(captured[0], ws / ".flaketriage")
    return ws, captured[1]


def _env(tmp_path: Path, ws: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    aws = bin_dir / "aws"
    aws.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/aws-calls\n')
    aws.chmod(aws.stat().st_mode | stat.S_IEXEC)
    ft = bin_dir / "flaketriage"
    ft.write_text(f'#!/bin/sh\nexec {sys.executable} -m flaketriage "$@"\n')
    ft.chmod(ft.stat().st_mode | stat.S_IEXEC)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLAKETRIAGE_", "GITHUB_"))}
    env.pop("CI", None)
    return env | {
        "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        "RUNNER_TEMP": str(tmp_path / "runner-temp"),
        "GITHUB_WORKSPACE": str(ws),
        "GITHUB_ACTIONS": "true",
        "GITHUB_SERVER_URL": "https://github.com",
        "GITHUB_REPOSITORY": "acme/models",
        "GITHUB_RUN_ID": "4242",
        "GITHUB_JOB": "train",
        "GITHUB_RUN_ATTEMPT": "2",
        "RUNNER_NAME": "gpu-runner-3",
        "NO_PROXY": "127.0.0.1,localhost",
    }


def _installed(tmp_path: Path) -> dict[str, dict[str, str]]:
    return {"install": {"bin": str(tmp_path / "bin" / "flaketriage"), "python": sys.executable}}


def test_s3_upload_then_signed_events_with_the_run_as_provenance(
    tmp_path: Path,
    workspace: tuple[Path, list[str]],
    receiver: Receiver,
    s3_url: str,
    s3_server: S3Server,
) -> None:
    ws, bundles = workspace
    runner = Runner(
        tmp_path,
        {
            "store": s3_url + "/",
            "notify-url": receiver.url,
            "webhook-secret": receiver.secret.decode(),
        },
        _env(tmp_path, ws) | s3_server.env,
    )
    runner.run(_installed(tmp_path))

    assert runner.outputs["bundles"]["count"] == "2"
    assert set(runner.outputs["bundles"]["ids"].split()) == set(bundles)
    assert not (tmp_path / "aws-calls").exists()  # no AWS CLI needed
    assert "pushed 2 bundle(s)" in runner.logs["upload"]
    uploaded = open_store(s3_url, readonly=True, settings=load_settings())
    assert sorted(s.id for s in list_bundles(uploaded)) == sorted(bundles)
    for bundle_id in bundles:
        assert verify_bundle(uploaded, bundle_id).problems == []
    assert sorted(e.bundle_id for e in receiver.events) == sorted(bundles)
    for event in receiver.events:
        assert event.store.kind == "s3" and event.store.location == s3_url
        p = event.provenance
        assert p.ci_provider == "github-actions"
        assert p.run_url == "https://github.com/acme/models/actions/runs/4242"
        assert (p.job, p.attempt, p.runner) == ("train", "2", "gpu-runner-3")

    # A rerun of the action (a later step, a re-run job) sends nothing twice.
    runner.run(_installed(tmp_path))
    assert len(receiver.events) == 2 and len(receiver.requests) == 2
    assert "0 object(s) sent (0 bytes)" in runner.logs["upload"]


def test_the_endpoint_input_points_at_an_s3_compatible_server(
    tmp_path: Path, workspace: tuple[Path, list[str]], s3_url: str, s3_server: S3Server
) -> None:
    ws, bundles = workspace
    env = _env(tmp_path, ws) | s3_server.env
    del env["FLAKETRIAGE_S3_ENDPOINT_URL"]
    runner = Runner(tmp_path, {"store": s3_url, "s3-endpoint-url": s3_server.endpoint}, env)
    runner.run(_installed(tmp_path))
    assert sorted(
        s.id for s in list_bundles(open_store(s3_url, readonly=True, settings=load_settings()))
    ) == sorted(bundles)


def test_directory_store_copy_is_a_readable_store(tmp_path: Path, workspace: tuple[Path, list[str]]) -> None:
    ws, bundles = workspace
    runner = Runner(tmp_path, {"store": str(tmp_path / "shared-store")}, _env(tmp_path, ws))
    runner.run(_installed(tmp_path))
    copied = LocalStore(tmp_path / "shared-store", readonly=True)
    assert sorted(s.id for s in list_bundles(copied)) == sorted(bundles)
    assert "no notify-url" in runner.logs["notify"]


def test_a_missing_secret_or_store_warns_and_passes(
    tmp_path: Path,
    workspace: tuple[Path, list[str]],
    receiver: Receiver,
) -> None:
    ws, _ = workspace
    runner = Runner(tmp_path, {"notify-url": receiver.url}, _env(tmp_path, ws))
    runner.run(_installed(tmp_path))
    assert "::warning::" in runner.logs["upload"] and "::warning::" in runner.logs["notify"]
    assert receiver.requests == []


def test_no_bundles_no_upload(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    runner = Runner(tmp_path, {"store": "s3://bucket/x"}, _env(tmp_path, ws))
    runner.run(_installed(tmp_path))
    assert runner.outputs["bundles"]["count"] == "0"
    assert not (tmp_path / "aws-calls").exists()


def test_results_are_sent_with_the_run_from_github_variables(tmp_path: Path) -> None:
    fixtures = Path(__file__).parents[1] / "results" / "fixtures"
    ws = tmp_path / "ws"
    (ws / "reports").mkdir(parents=True)
    shutil.copy(fixtures / "pytest-reruns.xml", ws / "reports" / "unit.xml")
    shutil.copy(fixtures / "gotestsum.xml", ws / "reports" / "go.xml")
    with live_service(tmp_path / "service") as service:
        inputs = {
            "notify-url": service.events_url,
            "webhook-secret": SERVICE_SECRET,
            "results": "reports/*.xml missing-*.xml",
        }
        env = _env(tmp_path, ws) | {"GITHUB_SHA": "c" * 40, "GITHUB_REF_NAME": "main"}
        runner = Runner(tmp_path, inputs, env)
        runner.run(_installed(tmp_path))
        with service.service.database.session() as session:
            [upload] = session.scalars(select(UploadRow)).all()
    assert "accepted:" in runner.logs["results"] and "24 tests" in runner.logs["results"]
    assert (upload.repository, upload.run_id, upload.job, upload.attempt) == (
        "acme/models",
        "4242",
        "train",
        2,
    )
    assert (upload.commit, upload.branch) == ("c" * 40, "main")
    assert upload.run_url == "https://github.com/acme/models/actions/runs/4242"
    assert (upload.tests, upload.passed_on_retry, upload.source) == (24, 2, "junit")


def test_results_without_a_matching_file_warn_and_pass(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    inputs = {"notify-url": "http://127.0.0.1:9/v1/events", "webhook-secret": "s", "results": "none/*.xml"}
    runner = Runner(tmp_path, inputs, _env(tmp_path, ws))
    runner.run(_installed(tmp_path))
    assert "::warning::flaketriage: no file matches results 'none/*.xml'" in runner.logs["results"]
