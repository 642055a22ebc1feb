"""`DockerSandbox`: each replay in a fresh container of its bundle's environment image.

The container has no network (``network_mode="none"``), a read-only root with only the workspace
(mounted at its own path, and at the captured root) and a private /tmp writable, memory, process and
CPU limits, every capability dropped, and runs as a non-root user: the worker's own user, or
``nobody`` (the workspace copy handed to it) when the worker is root. GPU work (a bundle whose
capture recorded GPUs) is handed the GPUs by a device request, other work none. Output is streamed
as it comes; the container is removed whatever happens. Any engine that speaks the Docker API
works (Docker, podman's ``system service``).

A limit breach is recognized from what the engine reports: the time limit by the sandbox's own
clock, memory by ``OOMKilled`` or, as podman never sets it, a SIGKILL (137) of a run with a memory
limit that the sandbox did not kill; processes, network and writes outside the workspace from what
the run printed (`limits.pids_breach`, `limits.network_breach`, `limits.filesystem_breach`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from flaketriage.dependencies import require
from flaketriage.errors import SandboxError
from flaketriage.process.child import MAX_KEPT_BYTES, Limit, ProcessResult
from flaketriage.process.hangs import HANG_DUMP_ENV, HangDump, dump_by_signal
from flaketriage.workers.sandbox.base import Sandbox, SandboxSpec
from flaketriage.workers.sandbox.images import DEFAULT_BASE_IMAGE, EnvironmentImages
from flaketriage.workers.sandbox.limits import filesystem_breach, first_limit, network_breach, pids_breach

NOBODY = 65534
API_VERSION = "1.41"
"""The Docker API version spoken (device requests need 1.40): Docker 20.10 and later, podman 4."""
CLIENT_TIMEOUT_S = 60
"""How long one call to the engine may take."""
WAIT_SLICE_S = 30.0
POLL_S = (0.02, 0.5)
"""The first and the longest pause between reads of a container's state once its output has ended."""
GRACE_S = 30.0
"""How long a killed container gets to be reported as stopped before the run is an error."""
REPLAY_LABEL = "org.flaketriage.replay"
SIGKILL_STATUS = 137


def gpu_request() -> Any:
    """Every GPU, by the Docker API's device request (what ``docker run --gpus all`` sends)."""
    docker = require("docker", "docker", "the Docker sandbox")
    return docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])


class DockerSandbox(Sandbox):
    name = "docker"
    builds_environments = True

    def __init__(
        self,
        client: Any,
        images: EnvironmentImages | None = None,
        *,
        mounts: Sequence[Path] = (),
        pids_limit: int | None = None,
        cpus: float | None = None,
        tmpfs_mb: int = 512,
    ) -> None:
        self.client = client
        self.images = images or EnvironmentImages(client)
        self.mounts = [Path(m) for m in mounts]
        """Host directories every container sees read-only at the same path."""
        self.pids_limit = pids_limit
        self.cpus = cpus
        self.tmpfs_mb = tmpfs_mb
        self._image_paths: dict[str, list[str]] = {}

    @classmethod
    def connect(
        cls,
        url: str | None = None,
        *,
        base_image: str = DEFAULT_BASE_IMAGE,
        mounts: Sequence[Path] = (),
        pids_limit: int | None = None,
        cpus: float | None = None,
        build_network: str | None = None,
    ) -> DockerSandbox:
        """A sandbox on the engine at `url` (default: ``DOCKER_HOST``, else the standard socket),
        checked by a ping so a wrong address fails here, not at the first replay."""
        docker = require("docker", "docker", "the Docker sandbox")
        import requests

        where = url or os.environ.get("DOCKER_HOST") or "the standard socket (unix:///var/run/docker.sock)"
        socket = where[len("unix://") :] if where.startswith("unix://") else None
        if socket is not None and not os.path.exists(socket):  # said before docker-py leaks a socket on it
            raise SandboxError(
                f"no Docker engine listens at {where}: {socket} does not exist; start the engine (or "
                "`podman system service`), or point FLAKETRIAGE_DOCKER_URL at its socket"
            )
        # A fixed API version: asking the engine for its own would connect before the ping below,
        # and a failure there leaves the client's connection pool behind.
        client = (
            docker.DockerClient(base_url=url, timeout=CLIENT_TIMEOUT_S, version=API_VERSION)
            if url
            else docker.from_env(timeout=CLIENT_TIMEOUT_S, version=API_VERSION)
        )
        try:
            client.ping()
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            client.close()
            raise SandboxError(
                f"cannot reach the Docker engine at {where}: {exc}; start it (or `podman system service`), "
                "or point FLAKETRIAGE_DOCKER_URL at its socket"
            ) from exc
        images = EnvironmentImages(client, base_image=base_image, build_network=build_network)
        return cls(client, images, mounts=mounts, pids_limit=pids_limit, cpus=cpus)

    def close(self) -> None:
        self.client.close()

    # -- the container's configuration ----------------------------------------------------------
    def create_options(self, spec: SandboxSpec, image: str, user: str) -> dict[str, Any]:
        """What `containers.create` is given for `spec`: the spec's intent in the engine's terms."""
        workspace = spec.workspace.resolve()
        volumes: dict[str, dict[str, str]] = {str(m): {"bind": str(m), "mode": "ro"} for m in self.mounts}
        for path in spec.support:
            volumes[str(path)] = {"bind": str(path), "mode": "ro"}
        volumes[str(workspace)] = {"bind": str(workspace), "mode": "rw"}
        binds = [f"{src}:{v['bind']}:{v['mode']}" for src, v in volumes.items()]
        original = spec.host.mount_point(workspace)
        if original is not None:
            binds.append(f"{workspace}:{original}:rw")
        tmpfs = {"/tmp": f"rw,nosuid,nodev,size={self.tmpfs_mb}m,mode=1777"}
        home = spec.env.get("HOME", "")
        if (
            home.startswith("/")
            and home != "/"
            and not any(Path(home) in (t, *t.parents) for t in (Path(b.split(":")[1]) for b in binds))
        ):
            tmpfs[home] = f"rw,nosuid,nodev,size={self.tmpfs_mb}m,mode=1777"  # caches, dotfiles
        options: dict[str, Any] = {
            "image": image,
            "command": list(spec.argv),
            "working_dir": str(spec.cwd),
            "environment": self._environment(spec, image),
            "user": user,
            "volumes": binds,
            "tmpfs": tmpfs,
            "read_only": True,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "labels": {REPLAY_LABEL: "1"},
            "detach": True,
            "stdin_open": False,
            "tty": False,
        }
        if not spec.network:
            options["network_mode"] = "none"  # network_disabled is ignored by podman's API
        if spec.memory_mb is not None:
            options["mem_limit"] = f"{spec.memory_mb}m"
            options["memswap_limit"] = f"{spec.memory_mb}m"  # no swap beyond the limit
        if self.pids_limit is not None:
            options["pids_limit"] = self.pids_limit
        if self.cpus is not None:
            options["nano_cpus"] = int(self.cpus * 1e9)
        if spec.gpu:
            options["device_requests"] = [gpu_request()]
        return options

    def _environment(self, spec: SandboxSpec, image: str) -> dict[str, str]:
        """The spec's environment, with the image's PATH entries after its own (so the image's
        interpreter is found) and TMPDIR on the private /tmp."""
        env = dict(spec.env)
        ours = [p for p in env.get("PATH", "").split(":") if p]
        env["PATH"] = ":".join([*ours, *(p for p in self._image_path(image) if p not in ours)])
        env["TMPDIR"] = "/tmp"
        return env

    def _image_path(self, image: str) -> list[str]:
        if image not in self._image_paths:
            config = self.client.images.get(image).attrs.get("Config") or {}
            path = next((e[5:] for e in config.get("Env") or [] if e.startswith("PATH=")), "")
            self._image_paths[image] = [p for p in path.split(":") if p] or [
                "/usr/local/sbin",
                "/usr/local/bin",
                "/usr/sbin",
                "/usr/bin",
                "/sbin",
                "/bin",
            ]
        return self._image_paths[image]

    def _user(self, workspace: Path) -> str:
        """Who the run is in the container: this worker's user, or nobody (given the workspace) for root."""
        if os.getuid() != 0:
            return f"{os.getuid()}:{os.getgid()}"
        for root, dirs, files in os.walk(workspace):
            for name in (*dirs, *files):
                os.lchown(os.path.join(root, name), NOBODY, NOBODY)
        os.lchown(workspace, NOBODY, NOBODY)
        return f"{NOBODY}:{NOBODY}"

    # -- one run --------------------------------------------------------------------------------
    def run(self, spec: SandboxSpec) -> ProcessResult:
        docker = require("docker", "docker", "the Docker sandbox")
        image = self.images.image_for(spec.environment)
        options = self.create_options(spec, image, self._user(spec.workspace))
        started = time.monotonic()
        try:
            container = self.client.containers.create(**options)
        except docker.errors.DockerException as exc:
            raise SandboxError(
                f"the Docker engine refused to create the replay container from {image}: {exc}; check "
                "the engine's logs and that it supports these limits (memory, pids, read-only root)"
            ) from exc
        output: _Output | None = None
        hang: list[HangDump | None] = [None]
        try:
            # Attached before it starts (with what was logged already), so no output is missed.
            output = _Output(
                container.attach_socket(params={"stdout": 1, "stderr": 1, "stream": 1, "logs": 1})
            )
            container.start()
            streams = output

            def dump() -> None:
                # Stacks before the kill (flaketriage.process.hangs): the run's faulthandler answers SIGUSR1.
                hang[0] = dump_by_signal(lambda: container.kill(signal="SIGUSR1"), streams.size, streams.tail)

            asked = spec.env.get(HANG_DUMP_ENV) == "1"  # else nothing in it would answer
            exit_code, timed_out, state = self._wait(
                container, output, spec.timeout_s, started, dump if asked else None
            )
            output.join()
        except docker.errors.DockerException as exc:
            raise SandboxError(
                f"the replay container ({image}) failed in the engine: {exc}; check the engine's logs"
            ) from exc
        finally:
            with contextlib.suppress(docker.errors.DockerException):
                container.remove(force=True, v=True)
            if output is not None:
                output.close()
        result = ProcessResult(
            exit_code=exit_code,
            stdout=output.text(0),
            stderr=output.text(1),
            timed_out=timed_out,
            duration_s=time.monotonic() - started,
            wrapped_signals=True,  # a container's main process killed by signal N exits 128 + N
            hang=hang[0],
        )
        return _with_limit(result, spec, state, self.pids_limit)

    def _wait(
        self,
        container: Any,
        output: _Output,
        timeout_s: float,
        started: float,
        before_kill: Callable[[], None] | None = None,
    ) -> tuple[int, bool, dict[str, Any]]:
        """The container's exit status, whether it was killed at the time limit, and its final state.

        The end of the run is seen as the end of its output stream (the engine closes it when the
        container stops), then read from the container's state. The engine's wait endpoint is not
        used: podman 4 answers it by polling the container without pause (more than a core for as
        long as the container runs), and with a few such services on a busy machine its waits ended
        only at podman's 20 s fallback timer ("Exceeded conmon timeout waiting for container"), 20 s
        added to every run. Reading the state costs the engine nothing while the container runs.
        """
        deadline = started + timeout_s
        killed_at: float | None = None
        pause = POLL_S[0]
        while True:
            now = time.monotonic()
            if killed_at is None and now >= deadline:
                if before_kill is not None:
                    with contextlib.suppress(Exception):  # evidence only: the kill comes regardless
                        before_kill()
                _kill(container)
                killed_at = now
            if killed_at is not None and now > killed_at + GRACE_S:
                raise SandboxError(
                    f"the replay container {container.short_id} did not stop within {GRACE_S:.0f} s of being "
                    "killed at its time limit; check the engine (it may be overloaded or stuck)"
                )
            limit = (deadline - now) if killed_at is None else (killed_at + GRACE_S - now)
            if not output.wait_closed(max(0.0, min(limit, WAIT_SLICE_S))):
                continue
            # The stream has ended (the container stopped, or the connection dropped): ask.
            state = _state(container)
            if state is not None and state.get("Status") in ("exited", "dead", "stopped"):
                return int(state.get("ExitCode", -1)), killed_at is not None, state
            time.sleep(max(0.0, min(pause, limit)))
            pause = min(pause * 2, POLL_S[1])


def _kill(container: Any) -> None:
    """SIGKILL the container without waiting for the engine's answer: podman's Docker API answers a
    SIGKILL only once the container has been cleaned up (the same wait as its wait endpoint, up to
    its 20 s fallback timer), while its state shows it stopped as soon as it is; `_wait` watches that."""

    def send() -> None:
        with contextlib.suppress(Exception):  # the state says whether it stopped
            container.kill()

    threading.Thread(target=send, name=f"kill-{container.short_id}", daemon=True).start()


def _state(container: Any) -> dict[str, Any] | None:
    """The container's state as the engine reports it now; None when the engine did not answer."""
    import requests

    try:
        container.reload()
    except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
        return None
    state: dict[str, Any] = container.attrs.get("State") or {}
    return state


def _with_limit(
    result: ProcessResult, spec: SandboxSpec, state: dict[str, Any], pids: int | None
) -> ProcessResult:
    """`result` with the limit the run broke, from the engine's report and the run's output."""
    oom = bool(state.get("OOMKilled")) or (
        spec.memory_mb is not None and result.exit_code == SIGKILL_STATUS and not result.timed_out
    )
    limit: Limit | None = first_limit(
        "pids" if pids is not None and pids_breach(result) else None,
        "memory" if oom else None,
        "timeout" if result.timed_out else None,
        "network" if network_breach(result, spec) else None,
        "filesystem" if filesystem_breach(result) else None,
    )
    return dataclasses.replace(result, limit=limit)


class _Output:
    """Reads a container's multiplexed output stream as it comes, kept per stream (the tail past
    `MAX_KEPT_BYTES`), and closes the connection when done."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self._chunks: tuple[list[bytes], list[bytes]] = ([], [])
        self._kept = [0, 0]
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        from docker.utils.socket import frames_iter

        with contextlib.suppress(Exception):  # the engine closed the stream: what came is kept
            for stream, chunk in frames_iter(self._sock, tty=False):
                if chunk and stream in (1, 2):  # stdout, stderr
                    self._add(stream - 1, chunk)

    def _add(self, index: int, chunk: bytes) -> None:
        sink = self._chunks[index]
        sink.append(chunk)
        self._kept[index] += len(chunk)
        while self._kept[index] > MAX_KEPT_BYTES and len(sink) > 1:
            self._kept[index] -= len(sink.pop(0))

    def join(self) -> None:
        """Wait for the rest of the output (the container has stopped)."""
        self._thread.join(timeout=GRACE_S)

    def wait_closed(self, timeout: float) -> bool:
        """Whether the engine has closed the stream, waiting up to `timeout` seconds for it."""
        self._thread.join(timeout=timeout)
        return not self._thread.is_alive()

    def close(self) -> None:
        for closable in (self._sock, getattr(self._sock, "_sock", None)):
            if closable is not None:
                with contextlib.suppress(OSError):
                    closable.close()

    def text(self, index: int) -> str:
        return b"".join(self._chunks[index]).decode("utf-8", "replace")

    def size(self) -> int:
        """Bytes of stderr kept so far (while the container runs)."""
        return self._kept[1]

    def tail(self, n: int) -> bytes:
        """The last `n` bytes of stderr so far."""
        return b"".join(self._chunks[1])[-n:] if n > 0 else b""
