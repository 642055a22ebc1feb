"""A real Docker API for the sandbox tests: podman's ``system service`` on a socket of its own.

Podman needs no daemon and builds images locally; no registry is reachable here, so the base image
is made from a rootfs tar (busybox-static, 2 MB, imported in a fraction of a second) and Python
runs from this machine's interpreter, mounted read-only into each container (``/usr``, the
interpreter's prefix and the virtualenv): a container starts Python in ~0.3 s, where a debootstrapped
Debian would cost ~25 s to make and a copy of the interpreter in every image much more.

Its configuration (runc, default ulimits this machine allows, storage under the session's temp
directory, the unreachable localhost registry blocked) is named through ``CONTAINERS_CONF``,
``CONTAINERS_STORAGE_CONF`` and ``CONTAINERS_REGISTRIES_CONF`` from the first podman command on;
teardown stops the service and runs ``podman system reset -f`` with the same files.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from flaketriage.workers.sandbox.containers import API_VERSION

BASE_IMAGE = "localhost/flaketriage-test-base:latest"
PIP_SHIM = """#!/bin/sh
# Stands in for pip at image build time: records what it was asked to install.
mkdir -p /flaketriage
echo "$@" >> /flaketriage/pip-calls
for arg in "$@"; do
    case "$arg" in *requirements.txt) cat "$arg" >> /flaketriage/pip-installed ;; esac
done
"""
APPLETS = ("sh", "cat", "echo", "ls", "sleep", "id", "true", "mkdir", "touch", "env", "wc")


@dataclass(frozen=True)
class Engine:
    """The podman service: its Docker API URL, and what every replay container needs mounted."""

    url: str
    base_image: str
    mounts: tuple[Path, ...]
    podman_env: dict[str, str]

    def client(self) -> Any:
        import docker

        # A fixed API version, as the sandbox's own clients use: asking the engine for its version
        # costs ~0.3 s a client on podman (its /version runs dpkg to name its components' packages).
        return docker.DockerClient(base_url=self.url, timeout=60, version=API_VERSION)


def host_python_mounts() -> tuple[Path, ...]:
    """This interpreter as a container needs it: /usr (libc, via /lib → usr/lib), its prefix, the venv."""
    found = [Path("/usr"), Path(sys.base_prefix), Path(sys.prefix)]
    return tuple(dict.fromkeys(p for p in found if not any(q in p.parents for q in found if q != p)))


def _rootfs_tar(dest: Path) -> Path:
    """A minimal root: static busybox, /lib pointing into the mounted /usr, users, a pip stand-in."""
    busybox = shutil.which("busybox")
    if busybox is None or b"ld-linux" in Path(busybox).read_bytes()[:4096]:  # a dynamic one names its loader
        pytest.fail("a static busybox is not installed: run tests/run.sh (it installs busybox-static)")
    root = dest / "rootfs"
    for name in ("bin", "etc", "tmp", "usr/local/bin", "proc", "dev", "sys"):
        (root / name).mkdir(parents=True, exist_ok=True)
    shutil.copy2(busybox, root / "bin" / "busybox")
    for applet in APPLETS:
        (root / "bin" / applet).symlink_to("busybox")
    (root / "lib").symlink_to("usr/lib")
    (root / "lib64").symlink_to("usr/lib64")
    (root / "etc" / "passwd").write_text(
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n"
    )
    (root / "etc" / "group").write_text("root:x:0:\nnogroup:x:65534:\n")
    shim = root / "usr" / "local" / "bin" / "python"
    shim.write_text(PIP_SHIM)
    shim.chmod(0o755)
    tar = dest / "rootfs.tar"
    with tarfile.open(tar, "w") as out:
        out.add(root, arcname=".")
    return tar


def _podman(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="session")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    if shutil.which("podman") is None or shutil.which("runc") is None:
        pytest.fail("podman and runc are not installed: run tests/run.sh (it installs them with apt)")
    root = tmp_path_factory.mktemp("podman")
    (root / "containers.conf").write_text(
        "[containers]\n"
        'default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]\n'
        "[engine]\n"
        'runtime = "runc"\n'
        'cgroup_manager = "cgroupfs"\n'
        'events_logger = "file"\n'
        f'tmp_dir = "{root / "tmp"}"\n'
    )
    (root / "storage.conf").write_text(
        f'[storage]\ndriver = "overlay"\ngraphroot = "{root / "graph"}"\nrunroot = "{root / "run"}"\n'
    )
    # No registry is reachable here: a pull of a localhost/ image fails at once instead of being
    # retried three times, 2 s apart, against a port nothing listens on.
    (root / "registries.conf").write_text(
        'unqualified-search-registries = []\n[[registry]]\nlocation = "localhost"\nblocked = true\n'
    )
    env = {
        **os.environ,
        "CONTAINERS_CONF": str(root / "containers.conf"),
        "CONTAINERS_STORAGE_CONF": str(root / "storage.conf"),
        "CONTAINERS_REGISTRIES_CONF": str(root / "registries.conf"),
    }
    env.pop("DOCKER_HOST", None)
    socket = root / "podman.sock"
    log = (root / "service.log").open("wb")
    # In its own directory: conmon writes an ``oom`` file into its working directory when a
    # container is killed for memory.
    service = subprocess.Popen(
        ["podman", "system", "service", "--time=0", f"unix://{socket}"],
        env=env,
        stdout=log,
        stderr=log,
        cwd=root,
    )
    try:
        imported = _podman(env, "import", str(_rootfs_tar(root)), BASE_IMAGE)
        assert imported.returncode == 0, imported.stderr
        url = f"unix://{socket}"
        engine = Engine(url=url, base_image=BASE_IMAGE, mounts=host_python_mounts(), podman_env=env)
        deadline = time.monotonic() + 60
        while True:
            try:
                client = engine.client()
                client.ping()
                client.close()
                break
            except Exception:
                if service.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"podman service did not start: {(root / 'service.log').read_text()}"
                    ) from None
                time.sleep(0.1)
        yield engine
    finally:
        service.terminate()
        try:
            service.wait(timeout=30)
        except subprocess.TimeoutExpired:
            service.kill()
            service.wait()
        log.close()
        _podman(env, "system", "reset", "-f", timeout=300)
