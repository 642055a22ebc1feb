"""The Docker sandbox against a real Docker API (podman's service, started by the `engine` fixture)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flaketriage.bundle.io import load_manifest
from flaketriage.bundle.manifest import Environment
from flaketriage.capture.record import CaptureRequest, run_and_capture
from flaketriage.capture.source import SourceLimits
from flaketriage.errors import ReplayEnvironmentError, SandboxError
from flaketriage.settings import load_settings
from flaketriage.store import LocalStore
from flaketriage.workers.environment.key import EnvironmentKey
from flaketriage.workers.replay import ReplayContext, Replayer
from flaketriage.workers.sandbox import SandboxSpec, make_sandbox
from flaketriage.workers.sandbox.containers import REPLAY_LABEL, DockerSandbox, gpu_request
from flaketriage.workers.sandbox.images import EnvironmentImages, dockerfile, environment_key
from flaketriage.workers.verdict import Outcome
from tests.workers.sandbox.conftest import Engine

ENV_311 = Environment(python="3.11.7", implementation="CPython", platform="Linux", machine="x86_64")


def _spec(ws: Path, code: str, **kw: Any) -> SandboxSpec:
    fields: dict[str, Any] = {
        "argv": [sys.executable, "-c", code],
        "workspace": ws,
        "cwd": ws,
        "env": {"PATH": os.environ["PATH"], "HOME": "/home/replay"},
        "timeout_s": 60.0,
    }
    fields.update(kw)
    return SandboxSpec(**fields)


def _leftovers(client: Any) -> list[Any]:
    return list(client.containers.list(all=True, filters={"label": REPLAY_LABEL}))


@pytest.fixture
def sandbox(engine: Engine) -> Iterator[DockerSandbox]:
    client = engine.client()
    images = EnvironmentImages(client, base_image=engine.base_image, build_network="none")
    box = DockerSandbox(client, images, mounts=engine.mounts, pids_limit=128)
    try:
        yield box
        assert _leftovers(client) == [], "a replay container was left behind"
    finally:
        box.close()


@pytest.fixture
def create_bodies(sandbox: DockerSandbox) -> list[dict[str, Any]]:
    """The bodies of the container-create requests the sandbox sends, as the engine received them."""
    bodies: list[dict[str, Any]] = []

    def record(response: Any, *args: Any, **kwargs: Any) -> None:
        request = response.request
        if request.method == "POST" and "/containers/create" in request.url:
            bodies.append(json.loads(request.body))

    sandbox.client.api.hooks["response"].append(record)
    return bodies


def test_runs_in_the_workspace_as_nobody_with_a_read_only_root(
    sandbox: DockerSandbox, tmp_path: Path
) -> None:
    (tmp_path / "input.txt").write_text("hello")
    code = (
        "import os, sys, tempfile\n"
        "print(os.getcwd(), os.getuid(), open('input.txt').read())\n"
        "open('out.txt', 'w').write('written')\n"
        "open(os.path.join(tempfile.gettempdir(), 'scratch'), 'w').write('x')\n"
        "open(os.path.expanduser('~/.cache'), 'w').write('x')\n"
        "for p in ('/etc/pwned', '/usr/pwned'):\n"
        "    try:\n"
        "        open(p, 'w'); print('wrote', p)\n"
        "    except OSError as e:\n"
        "        print('refused', e.errno)\n"
        "sys.stderr.write('err'); sys.exit(3)\n"
    )
    result = sandbox.run(_spec(tmp_path, code))
    assert result.exit_code == 3, result.stderr
    assert result.stdout.splitlines() == [f"{tmp_path} 65534 hello", "refused 30", "refused 30"]
    assert result.stderr == "err"
    assert (tmp_path / "out.txt").read_text() == "written"
    assert not Path("/usr/pwned").exists() and result.limit is None and not result.timed_out


def test_the_spec_becomes_the_container_configuration(
    sandbox: DockerSandbox, create_bodies: list[dict[str, Any]], tmp_path: Path
) -> None:
    """Checked in the request the engine received: limits, no network, non-root, read-only root."""
    sandbox.cpus = 0.5
    result = sandbox.run(_spec(tmp_path, "print('ok')", memory_mb=256))
    assert result.stdout == "ok\n"
    host = create_bodies[-1]["HostConfig"]
    assert host["NetworkMode"] == "none" and host["ReadonlyRootfs"] is True
    assert (host["Memory"], host["MemorySwap"], host["PidsLimit"]) == (256 << 20, 256 << 20, 128)
    assert host["NanoCpus"] == 500_000_000 and host["CapDrop"] == ["ALL"]
    assert f"{tmp_path}:{tmp_path}:rw" in host["Binds"] and "/usr:/usr:ro" in host["Binds"]
    assert create_bodies[-1]["User"] == "65534:65534"


def test_gpu_work_gets_the_device_request_and_cpu_work_none(
    sandbox: DockerSandbox, create_bodies: list[dict[str, Any]], tmp_path: Path
) -> None:
    """No GPU here: podman accepts the request and runs the container without one (its inspect
    does not echo it back), so the request is checked as the engine received it."""
    gpu = sandbox.run(_spec(tmp_path, "print('gpu work')", gpu=True))
    cpu = sandbox.run(_spec(tmp_path, "print('cpu work')"))
    assert (gpu.stdout, cpu.stdout) == ("gpu work\n", "cpu work\n")
    gpu_host, cpu_host = create_bodies[0]["HostConfig"], create_bodies[1]["HostConfig"]
    assert gpu_host["DeviceRequests"] == [dict(gpu_request())]
    assert gpu_host["DeviceRequests"][0]["Count"] == -1
    assert gpu_host["DeviceRequests"][0]["Capabilities"] == [["gpu"]]
    assert not cpu_host.get("DeviceRequests")


def test_time_limit_kills_and_removes_the_container(sandbox: DockerSandbox, tmp_path: Path) -> None:
    result = sandbox.run(
        _spec(tmp_path, "import time; print('started', flush=True); time.sleep(120)", timeout_s=2)
    )
    assert result.timed_out and result.limit == "timeout"
    assert result.stdout == "started\n"  # what came before the kill is kept
    # Well under the 120 s sleep: killed at its limit (the engine's own calls, slow on a loaded
    # machine, take the rest, the container's removal included).
    assert result.duration_s < 60


def test_memory_limit_is_a_memory_breach(sandbox: DockerSandbox, tmp_path: Path) -> None:
    result = sandbox.run(_spec(tmp_path, "x = bytearray(b'1') * (1 << 30)", memory_mb=128))
    assert result.exit_code == 137 and result.limit == "memory" and not result.timed_out


def test_output_is_kept_in_order_per_stream(sandbox: DockerSandbox, tmp_path: Path) -> None:
    code = "import sys\nfor i in range(2000):\n    print(i)\n    sys.stderr.write(f'e{i}\\n')\n"
    result = sandbox.run(_spec(tmp_path, code))
    assert result.stdout.split() == [str(i) for i in range(2000)]
    assert result.stderr.split() == [f"e{i}" for i in range(2000)]


def test_one_image_per_environment(sandbox: DockerSandbox, tmp_path: Path) -> None:
    a = ENV_311.model_copy(update={"packages": ("attrs==23.1.0", "six==1.16.0")})
    same = ENV_311.model_copy(update={"python": "3.11.9", "packages": ("six==1.16.0", "attrs==23.1.0")})
    other = a.model_copy(update={"python": "3.12.1"})
    assert environment_key(a).digest == environment_key(same).digest != environment_key(other).digest
    assert "FROM python:3.11-slim" in dockerfile("python:{python}-slim", environment_key(a))
    result = sandbox.run(_spec(tmp_path, "", argv=["/bin/cat", "/flaketriage/pip-installed"], environment=a))
    assert result.stdout.split() == ["attrs==23.1.0", "six==1.16.0"], result.stderr
    tag = sandbox.images.image_for(same)
    labels = sandbox.client.images.get(tag).labels
    assert (
        labels["org.flaketriage.environment"]
        == environment_key(a).digest
        == EnvironmentKey.of_environment(a).digest
    )


def test_an_environment_that_cannot_be_built_is_an_environment_error(
    sandbox: DockerSandbox, tmp_path: Path
) -> None:
    sandbox.images.base_image = "localhost/flaketriage-no-such-base:{python}"
    with pytest.raises(ReplayEnvironmentError, match="FLAKETRIAGE_DOCKER_BASE_IMAGE"):
        sandbox.run(_spec(tmp_path, "print(1)", environment=ENV_311.model_copy(update={"python": "3.10.1"})))


def test_an_unreachable_engine_says_what_to_set(tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="FLAKETRIAGE_DOCKER_URL"):
        DockerSandbox.connect(f"unix://{tmp_path}/no-engine.sock")


def test_make_sandbox_builds_it_from_settings(engine: Engine, tmp_path: Path) -> None:
    settings = load_settings(
        sandbox="docker",
        docker_url=engine.url,
        docker_base_image=engine.base_image,
        docker_mounts=list(engine.mounts),
        replay_pids_limit=64,
    )
    box = make_sandbox(settings.sandbox, settings=settings)
    try:
        assert isinstance(box, DockerSandbox) and box.pids_limit == 64
        assert box.run(_spec(tmp_path, "print('from settings')")).stdout == "from settings\n"
    finally:
        box.close()


LIMITS = SourceLimits(max_file_bytes=1 << 20, max_total_bytes=10 << 20)


def _capture(root: Path, code: str) -> tuple[LocalStore, str]:
    root.mkdir(parents=True)
    (root / "job.py").write_text(code)
    store = LocalStore(root.parent / "store")
    request = CaptureRequest(argv=[sys.executable, "job.py"], cwd=root, limits=LIMITS, echo=False)
    result = run_and_capture(store, request)
    assert result.bundle_id, result.process.stderr
    return store, result.bundle_id


JOB = "import os, sys\nprint('seed', os.environ['PYTHONHASHSEED'])\nsys.exit(1 // 0)\n"


def test_a_captured_failure_reproduces_in_its_environment_image(
    sandbox: DockerSandbox, tmp_path: Path
) -> None:
    store, bundle = _capture(tmp_path / "proj", JOB)
    manifest = load_manifest(store, bundle)
    with Replayer(store, manifest, sandbox, context=ReplayContext.from_process()) as replayer:
        result = replayer.run()
    assert result.outcome is Outcome.REPRODUCED, result.process.stderr
    assert result.process.stdout == f"seed {manifest.seeds.python_hash_seed}\n"
    assert sandbox.images.image_for(manifest.environment).startswith("flaketriage-env:")


def test_triage_accepts_the_docker_sandbox(engine: Engine, tmp_path: Path) -> None:
    store, bundle = _capture(tmp_path / "proj", JOB)
    client = engine.client()
    try:  # built without a network, as no registry is reachable here (the CLI builds with the engine's)
        EnvironmentImages(client, base_image=engine.base_image, build_network="none").image_for(
            load_manifest(store, bundle).environment
        )
    finally:
        client.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLAKETRIAGE_")}
    env.update(
        FLAKETRIAGE_STORE=str(store.root),
        FLAKETRIAGE_DOCKER_URL=engine.url,
        FLAKETRIAGE_DOCKER_BASE_IMAGE=engine.base_image,
        FLAKETRIAGE_DOCKER_MOUNTS=json.dumps([str(m) for m in engine.mounts]),
    )
    done = subprocess.run(
        [sys.executable, "-m", "flaketriage", "triage", bundle, "--sandbox", "docker", "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["verdict"] == "deterministic"
