"""Environment images for the Docker sandbox: one image per bundle environment, built once and kept.

An image is named by its environment's key (`flaketriage.workers.environment.key.EnvironmentKey`, the
same key that names a local sandbox's virtualenv: Python ``X.Y``, implementation and the normalized
pins), so every bundle captured in the same environment replays in the same image, built the first
time one is needed: the base image for that Python version (``python:3.11-slim`` by default) with
the key's pins installed by pip (``--no-deps``: a freeze is already the complete set). Projects
installed from a local directory and flaketriage itself are not pins of the key: the replay finds
them in its workspace. An environment that cannot be built (a pin no index has, a base image the
engine cannot get) is a `ReplayEnvironmentError`: the replay is an ``environment`` outcome.
"""

from __future__ import annotations

import io
import platform
import tarfile
import threading
from typing import Any

from flaketriage.bundle.manifest import Environment
from flaketriage.errors import ReplayEnvironmentError, SandboxError
from flaketriage.workers.environment.key import EnvironmentKey

IMAGE_REPO = "flaketriage-env"
DEFAULT_BASE_IMAGE = "python:{python}-slim"
KEY_LABEL = "org.flaketriage.environment"
BUILD_TIMEOUT_S = 1800.0


def environment_key(environment: Environment | None) -> EnvironmentKey:
    """The key of the software a run needs; with none recorded, this interpreter's version alone."""
    if environment is None:
        environment = Environment(
            python=platform.python_version(),
            implementation=platform.python_implementation(),
            platform=platform.platform(),
            machine=platform.machine(),
        )
    return EnvironmentKey.of_environment(environment)


def dockerfile(base_image: str, key: EnvironmentKey) -> str:
    """The build file of an environment's image."""
    lines = [f"FROM {base_image.format(python=key.python)}"]
    if key.installs:
        lines += [
            "COPY requirements.txt /flaketriage/requirements.txt",
            "RUN python -m pip install --no-cache-dir --no-deps -r /flaketriage/requirements.txt",
        ]
    lines.append(f"LABEL {KEY_LABEL}={key.digest}")
    return "\n".join(lines) + "\n"


def build_context(base_image: str, key: EnvironmentKey) -> bytes:
    """The build context (a tar): the build file, and the requirements when there are any."""
    files = {"Dockerfile": dockerfile(base_image, key)}
    if key.installs:
        files["requirements.txt"] = "\n".join(key.installs) + "\n"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class EnvironmentImages:
    """Finds or builds the image of an environment on one Docker engine; safe to share across threads."""

    def __init__(
        self,
        client: Any,
        *,
        base_image: str = DEFAULT_BASE_IMAGE,
        repo: str = IMAGE_REPO,
        build_network: str | None = None,
    ) -> None:
        self.client = client
        self.base_image = base_image
        self.repo = repo
        self.build_network = build_network
        """The network build steps use (``host``, ``none``); None: the engine's default."""
        self._ready: dict[str, str] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()

    def tag(self, key: EnvironmentKey) -> str:
        return f"{self.repo}:{key.digest[:32]}"

    def image_for(self, environment: Environment | None) -> str:
        """The image's tag, built first when the engine does not have it (one build per key at once).

        Raises `ReplayEnvironmentError` when the environment cannot be built."""
        key = environment_key(environment)
        tag = self.tag(key)
        with self._lock:
            if key.digest in self._ready:
                return self._ready[key.digest]
            lock = self._locks.setdefault(key.digest, threading.Lock())
        with lock:
            if key.digest not in self._ready:
                if not self._exists(tag):
                    self._build(tag, key)
                with self._lock:
                    self._ready[key.digest] = tag
        return tag

    def _exists(self, tag: str) -> bool:
        from docker.errors import ImageNotFound

        try:
            self.client.images.get(tag)
        except ImageNotFound:
            return False
        return True

    def _build(self, tag: str, key: EnvironmentKey) -> None:
        from docker.errors import APIError, BuildError

        base = self.base_image.format(python=key.python)
        try:
            self.client.images.build(
                fileobj=io.BytesIO(build_context(self.base_image, key)),
                custom_context=True,
                tag=tag,
                rm=True,
                forcerm=True,
                network_mode=self.build_network,
                timeout=BUILD_TIMEOUT_S,
            )
        except BuildError as exc:
            log = " ".join(str(line.get("stream", line.get("error", ""))).strip() for line in exc.build_log)
            raise ReplayEnvironmentError(
                f"cannot build the replay image {tag} ({key.describe()}) from {base}: {exc.msg}; "
                f"{log[-400:]}. Check that the engine has {base} or can pull it (else set "
                "FLAKETRIAGE_DOCKER_BASE_IMAGE to an image it has) and that pip in it can reach an index "
                "with these pins"
            ) from exc
        except APIError as exc:
            raise SandboxError(
                f"the Docker engine refused to build the replay image {tag} from {base}: "
                f"{exc.explanation or exc}; "
                "check that the engine can reach the base image, or set FLAKETRIAGE_DOCKER_BASE_IMAGE"
            ) from exc
