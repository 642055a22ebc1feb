"""A replay that hangs in the Docker sandbox has its stacks dumped before the container is killed:
SIGUSR1 through the engine, answered by faulthandler from the replay's sitecustomize (podman's
Docker API, started by the `engine` fixture)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from flaketriage.failure.fingerprint import fingerprint_failure
from flaketriage.process.hangs import HANG_DUMP_ENV, sitecustomize_dir
from flaketriage.workers.sandbox import SandboxSpec
from flaketriage.workers.sandbox.containers import DockerSandbox
from flaketriage.workers.sandbox.images import EnvironmentImages
from tests.workers.sandbox.conftest import Engine

HANGS = """\
import time

def spin():
    while True:
        time.sleep(0.05)

print("started", flush=True)
spin()
"""


@pytest.fixture
def sandbox(engine: Engine) -> Iterator[DockerSandbox]:
    client = engine.client()
    box = DockerSandbox(
        client,
        EnvironmentImages(client, base_image=engine.base_image, build_network="none"),
        mounts=engine.mounts,
    )
    try:
        yield box
    finally:
        box.close()


def test_a_hung_container_is_dumped_then_killed(sandbox: DockerSandbox, tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(HANGS)
    spec = SandboxSpec(
        argv=[sys.executable, "job.py"],
        workspace=tmp_path,
        cwd=tmp_path,
        env={
            "PATH": os.environ["PATH"],
            "HOME": "/home/replay",
            "PYTHONPATH": sitecustomize_dir(),
            HANG_DUMP_ENV: "1",
        },
        timeout_s=3.0,
        support=[Path(sitecustomize_dir())],
    )
    result = sandbox.run(spec)
    assert result.timed_out and result.limit == "timeout"
    assert result.hang is not None and result.hang.tool == "faulthandler", result.stderr
    assert [f.function for f in result.hang.stuck()] == ["spin", "<module>"]
    info = fingerprint_failure(
        exit_code=result.exit_code,
        stdout="",
        stderr="",
        timed_out=True,
        roots=[str(tmp_path)],
        hang=result.hang,
    )
    assert info is not None and info.signature == "timeout|job.py:<module>>job.py:spin"


def test_without_the_handler_a_hung_container_is_killed_as_before(
    sandbox: DockerSandbox, tmp_path: Path
) -> None:
    (tmp_path / "job.py").write_text(HANGS)
    spec = SandboxSpec(
        argv=[sys.executable, "job.py"],
        workspace=tmp_path,
        cwd=tmp_path,
        env={"PATH": os.environ["PATH"], "HOME": "/home/replay"},
        timeout_s=2.0,
    )
    result = sandbox.run(spec)
    assert result.timed_out and result.hang is None and result.stdout == "started\n"
