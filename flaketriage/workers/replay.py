"""Deterministic replay: rerun a bundle's command in a fresh copy of its workspace, in a sandbox.

Each replay gets the recorded seeds and deterministic settings, a wall-clock limit and a private
copy of the materialized workspace; its failure counts as a reproduction only when its fingerprint
equals the original's.

What a replay takes from the machine (the base environment, where temporary workspaces go, how git
runs) comes in a `ReplayContext`, never from process globals, so one worker process can run many
triages at once in threads.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from flaketriage.bundle.manifest import Manifest
from flaketriage.bundle.redaction import MASK
from flaketriage.errors import ReplayEnvironmentError
from flaketriage.failure.fingerprint import FailureInfo, fingerprint_failure
from flaketriage.process.child import Limit, ProcessResult
from flaketriage.process.git import Git
from flaketriage.process.hangs import HANG_DUMP_ENV
from flaketriage.process.replay_env import REPLAY_SETTINGS
from flaketriage.settings import DEFAULT_REPLAY_TIMEOUT_S, Settings
from flaketriage.store import Store
from flaketriage.workers.cost import CostMeter, RunCost
from flaketriage.workers.environment.interpreter import interpreter_paths
from flaketriage.workers.environment.key import choose_mode
from flaketriage.workers.gpus import RunnerGPUs, gpu_difference, runner_gpus
from flaketriage.workers.materialize import Workspace, materialize
from flaketriage.workers.sandbox import HostView, Sandbox, SandboxSpec
from flaketriage.workers.verdict import Outcome

if TYPE_CHECKING:  # imported where used: a replay in the worker's own interpreter needs none of it
    from flaketriage.workers.environment.cache import EnvironmentCache
    from flaketriage.workers.environment.replay import BundleEnvironment

SITECUSTOMIZE_DIR = Path(__file__).parent / "sitecustomize"
_PATHLIKE_VARS = ("PATH", "VIRTUAL_ENV", "CONDA_PREFIX")


@dataclass(frozen=True)
class ReplayResult:
    """One replay: how it ended compared with the original failure."""

    outcome: Outcome
    failure: FailureInfo | None
    process: ProcessResult
    artifacts: Mapping[str, bytes] = field(default_factory=dict)
    """The files a `Variant` asked for (its ``artifacts``) that the run wrote, by name."""
    reason: str | None = None
    """Why nothing ran, for an `Outcome.ENVIRONMENT` (the bundle's environment cannot be had here)."""
    cost: RunCost | None = None
    """What the run cost (`flaketriage.workers.cost`); None when nothing ran."""


@dataclass(frozen=True)
class Variant:
    """A change to the captured run, for minimization (data subsets and argument values) and for
    telemetry (a profiler around the command, files it writes read back)."""

    data: Mapping[str, Sequence[int]] | None = None
    """data path → indices of the items to keep."""
    argv: Sequence[str] | None = None
    env: Mapping[str, str] | None = None
    """Variables set on top of the replay's environment."""
    artifacts: Sequence[str] = ()
    """Files (relative to the run's working directory) read back into `ReplayResult.artifacts`
    before the run's copy of the workspace is removed."""


@dataclass(frozen=True)
class ReplayContext:
    """What replays take from the machine they run on, handed in by whoever starts the triage.

    The CLI builds it from its own process (`from_process`); a worker running several triages in
    one process builds one per triage.
    """

    base_env: Mapping[str, str] = field(repr=False, hash=False)
    """The environment replays start from: secrets the bundle masked are refilled from it, and a
    bundle that recorded no environment gets all of it."""
    temp_root: Path
    """Where each `Replayer` makes its temporary directory (the materialized workspace, one copy
    per replay, scratch files); created when missing, and the `Replayer` removes its own directory."""
    git: Git
    """How to run git when materializing a git source."""
    environment_mode: str = "worker"
    """``FLAKETRIAGE_ENVIRONMENT`` (`flaketriage.workers.environment.key.choose_mode`): ``worker`` runs
    replays in the interpreter the command names on this machine, ``bundle`` in the bundle's
    recorded environment, ``auto`` in the bundle's when its freeze differs from the worker's."""
    environment_cache: EnvironmentCache | None = None
    """Where bundle environments are built and kept; None: a replay that needs one is an
    `Outcome.ENVIRONMENT`, saying so."""
    gpus: Callable[[], RunnerGPUs] = field(default=runner_gpus, repr=False)
    """Reads this runner's GPUs, to compare them with a bundle's (only bundles captured on GPUs)."""

    @classmethod
    def from_process(
        cls, *, environment_mode: str = "worker", environment_cache: EnvironmentCache | None = None
    ) -> ReplayContext:
        """This process's environment, the system temp directory, and git run in that environment."""
        env = dict(os.environ)
        return cls(
            base_env=env,
            temp_root=Path(tempfile.gettempdir()),
            git=Git(env=env),
            environment_mode=environment_mode,
            environment_cache=environment_cache,
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> ReplayContext:
        """`from_process`, with the environment mode and cache the settings name
        (``FLAKETRIAGE_ENVIRONMENT``, ``FLAKETRIAGE_ENVIRONMENT_CACHE_*``)."""
        from flaketriage.workers.environment.build import EnvironmentBuilder
        from flaketriage.workers.environment.cache import EnvironmentCache

        env = dict(os.environ)
        cache = EnvironmentCache(
            settings.resolved_environment_cache_dir(),
            max_bytes=settings.environment_cache_max_mb << 20,
            builder=EnvironmentBuilder(env, timeout_s=settings.environment_build_timeout_s),
        )
        return cls.from_process(environment_mode=settings.environment, environment_cache=cache)


def _original_roots(manifest: Manifest) -> list[str]:
    roots = {manifest.command.cwd}
    if manifest.source.repo_path:
        roots.add(manifest.source.repo_path)
    return sorted(roots, key=len, reverse=True)  # the longest prefix is rewritten first


def _environment_root(path: Path, within: Path) -> Path | None:
    """The virtualenv, conda environment or Python prefix that holds `path`, below `within`."""
    for candidate in (path, *path.parents):
        if candidate == within or within not in candidate.parents:
            return None
        if (candidate / "pyvenv.cfg").is_file() or (candidate / "conda-meta").is_dir():
            return candidate
        if any((candidate / "bin").glob("python3*")):  # an installed Python prefix (pyenv, a build)
            return candidate
    return None


class Replayer:
    """Replays one bundle many times: materialized once, copied for each run.

    Everything it writes lives in one directory under ``context.temp_root``, removed by `close`.
    """

    def __init__(
        self,
        store: Store,
        manifest: Manifest,
        sandbox: Sandbox,
        *,
        context: ReplayContext,
        timeout_s: float | None = None,
        default_timeout_s: float = DEFAULT_REPLAY_TIMEOUT_S,
        memory_mb: int | None = None,
        latest: bool = False,
    ) -> None:
        self.store = store
        self.manifest = manifest
        self.sandbox = sandbox
        self.context = context
        # An explicit limit, else the one the capture recorded, else FLAKETRIAGE_REPLAY_TIMEOUT_S.
        self.timeout_s = timeout_s or manifest.command.timeout_s or default_timeout_s
        self.memory_mb = memory_mb
        self.base_env = dict(context.base_env)
        context.temp_root.mkdir(parents=True, exist_ok=True)
        self._tmp = Path(tempfile.mkdtemp(prefix="flaketriage-replay-", dir=context.temp_root)).absolute()
        try:
            self.template: Workspace = materialize(
                store, manifest, self._tmp / "template", git=context.git, latest=latest
            )
            self._count = 0
            self._moved: list[tuple[str, str]] = []
            self._moved_for: Path | None = None
            self.bundle_environment: BundleEnvironment | None = None
            self.environment_error: str | None = None
            """Why the bundle's environment cannot be had here: every run is `Outcome.ENVIRONMENT`."""
            self._prepare_environment()
            self._interpreters = self._interpreter_dirs()
            runner = context.gpus() if manifest.hardware.gpus else None
            self.hardware_difference: str | None = (
                gpu_difference(manifest.hardware, runner) if runner is not None else None
            )
            """``ran on a different GPU: ...`` when this runner's GPUs are not the bundle's."""
            self.gpus = len(runner.gpus) if runner is not None else 0
            """The GPUs each run is given: the runner's, for a bundle captured on GPUs."""
            self.meter: CostMeter | None = None
            """Counts each run's cost into a triage's phase and refuses a run past its budget."""
            self.on_run: Callable[[str, ReplayResult], None] | None = None
            """Told of every run with the phase it counts in (the meter's, else ``verdict``): the
            service records each replay of a triage that runs in one task as it ends."""
        except BaseException:
            self.close()  # a bundle that cannot be materialized leaves nothing behind
            raise

    def __enter__(self) -> Replayer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        bundle_env = getattr(self, "bundle_environment", None)
        if bundle_env is not None:
            bundle_env.release()
            self.bundle_environment = None
        shutil.rmtree(self._tmp, ignore_errors=True)

    def _prepare_environment(self) -> None:
        """Get the bundle's environment when the mode asks for it and the sandbox does not build
        its own (Docker builds an image per `EnvironmentKey`)."""
        cache = self.context.environment_cache
        mode = choose_mode(self.context.environment_mode, self.manifest, cache.root if cache else None)
        self._environment_mode = mode
        if mode != "bundle" or self.sandbox.builds_environments:
            return
        from flaketriage.workers.environment.key import EnvironmentKey
        from flaketriage.workers.environment.replay import BundleEnvironment

        try:
            key = EnvironmentKey.of(self.manifest)
            if cache is None:
                raise ReplayEnvironmentError(
                    "replays here run in the bundle's environment, but no environment cache is set up; "
                    "set FLAKETRIAGE_ENVIRONMENT_CACHE_DIR, or FLAKETRIAGE_ENVIRONMENT=worker"
                )
            self.bundle_environment = BundleEnvironment.prepare(
                self.manifest, key, cache, self.template, self._tmp / "environment"
            )
        except ReplayEnvironmentError as exc:
            self.environment_error = str(exc)

    # -- the run's environment ------------------------------------------------------------------
    def _rewrite(self, value: str, ws: Workspace) -> str:
        for root, moved in self._moves(ws):
            value = value.replace(root, moved)
        return value

    def _moves(self, ws: Workspace) -> list[tuple[str, str]]:
        """Original root → its place in `ws`, longest first (computed once per workspace)."""
        if self._moved_for != ws.root:
            cwd = self.manifest.command.cwd
            self._moved = [
                (root, str((ws.cwd / os.path.relpath(root, cwd)).resolve()))
                for root in _original_roots(self.manifest)
            ]
            self._moved_for = ws.root
        return self._moved

    def environment(self, ws: Workspace) -> dict[str, str]:
        """The recorded environment, secrets refilled from this machine, paths moved to `ws`."""
        recorded = self.manifest.command.env
        env: dict[str, str] = {}
        for name, value in recorded.items():
            if MASK in value:
                if name in self.base_env:
                    env[name] = self.base_env[name]
                continue
            # Interpreter paths keep pointing at the original environment (exposed read-only).
            env[name] = value if name in _PATHLIKE_VARS else self._rewrite(value, ws)
        if not recorded:
            env.update(self.base_env)
        seeds = self.manifest.seeds
        if seeds.python_hash_seed is not None:
            env["PYTHONHASHSEED"] = seeds.python_hash_seed
        env.update(seeds.env)
        for name, value in REPLAY_SETTINGS.items():
            env.setdefault(name, value)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITECUSTOMIZE_DIR), env.get("PYTHONPATH")) if p)
        env[HANG_DUMP_ENV] = "1"  # the sitecustomize dumps stacks on SIGUSR1 (flaketriage.process.hangs)
        env["PWD"] = str(ws.cwd)
        if self.bundle_environment is not None:
            self.bundle_environment.apply(env, ws)
        return env

    def _interpreter_dirs(self) -> list[Path]:
        """Interpreter directories the sandbox would hide: in the original workspace or under /tmp.

        A virtualenv inside the project, or one in /tmp, must stay readable (and is never moved
        into the replay's workspace) or the command could not even start. The original workspace
        itself stays hidden even when it is an editable install: the replay runs the bundle's copy.
        """
        env = self.manifest.command.env
        argv0 = self.manifest.command.argv[0] if self.manifest.command.argv else ""
        if self.bundle_environment is not None:  # the recorded interpreter does not run at all
            candidates = [*self.bundle_environment.readable(), str(SITECUSTOMIZE_DIR)]
        else:
            candidates = [p for p in env.get("PATH", "").split(os.pathsep) if p]
            candidates += [env[v] for v in ("VIRTUAL_ENV", "CONDA_PREFIX") if v in env]
            if os.path.isabs(argv0):
                candidates.append(os.path.dirname(argv0))
            candidates.append(str(SITECUSTOMIZE_DIR))
            probe_env = {**self.base_env, **{k: v for k, v in env.items() if MASK not in v}}
            candidates += [str(p) for p in interpreter_paths(argv0, probe_env, self._tmp)] if argv0 else []
        roots = [Path(r) for r in _original_roots(self.manifest)]
        out: list[Path] = []
        for c in candidates:
            path = Path(c)
            if not path.exists() or path in roots or any(path in r.parents for r in roots):
                continue
            inside = [r for r in roots if r in path.parents]
            if inside:
                # Inside the original workspace only an environment may show through.
                env_root = _environment_root(path, inside[0])
                if env_root is None:
                    continue
                path = env_root
            keep = path.parent if path.name == "bin" else path
            if keep not in out:
                out.append(keep)
        return out

    def _source_root(self) -> Path:
        """Where the workspace's root was on the capturing machine."""
        return Path(self.manifest.source.repo_path or self.manifest.command.cwd)

    def _move_arg(self, arg: str, ws: Workspace) -> str:
        if any(arg.startswith(str(d) + os.sep) for d in self._interpreters):
            return arg  # an interpreter stays where it is
        return self._rewrite(arg, ws)

    # -- one run --------------------------------------------------------------------------------
    def run(self, variant: Variant | None = None) -> ReplayResult:
        """One replay in a private copy of the workspace, told to `on_run` once it is over.

        Raises `BudgetSpentError` instead when `meter` says the triage's budget is spent.
        """
        result = self._run(variant)
        if self.on_run is not None:
            self.on_run(self.meter.phase if self.meter is not None else "verdict", result)
        return result

    def _run(self, variant: Variant | None) -> ReplayResult:
        if self.environment_error is not None:
            return self._no_environment()
        if self.meter is not None:
            self.meter.check()
        self._count += 1
        ws = self.template.copy(self._tmp / f"run-{self._count}")
        try:
            argv = list(variant.argv) if variant and variant.argv else list(self.manifest.command.argv)
            if self.bundle_environment is not None:
                argv = self.bundle_environment.command(argv)
            if variant and variant.data:
                self._apply_subsets(ws, variant.data)
            spec = SandboxSpec(
                argv=[self._move_arg(a, ws) for a in argv],
                workspace=ws.root,
                cwd=ws.cwd,
                env={**self.environment(ws), **(variant.env if variant and variant.env else {})},
                timeout_s=self.timeout_s,
                memory_mb=self.memory_mb,
                gpu=bool(self.manifest.hardware.gpus),
                environment=self.manifest.environment,
                support=[SITECUSTOMIZE_DIR],
                host=HostView(
                    hidden=[Path(r) for r in _original_roots(self.manifest)],
                    readable=self._interpreters,
                    original_root=self._source_root(),
                ),
            )
            try:
                result = self.sandbox.run(spec)
            except ReplayEnvironmentError as exc:  # a sandbox that builds environments could not
                self.environment_error = str(exc)
                return self._no_environment()
            replay = dataclasses.replace(self._classify(result, ws), cost=RunCost.of(result, self.gpus))
            if self.meter is not None and replay.cost is not None:
                self.meter.record(replay.cost)
            if variant and variant.artifacts:
                replay = dataclasses.replace(replay, artifacts=_read_artifacts(ws.cwd, variant.artifacts))
            return replay
        finally:
            ws.remove()

    def environment_summary(self) -> dict[str, object]:
        """The environment replays run in, for a triage result: ``mode`` and, in the bundle's, its
        key's digest, the Python it was built on, its pinned packages, and whether this replayer
        built it (and in how long)."""
        if self.environment_error is not None:
            return {"mode": "bundle", "error": self.environment_error}
        if self.bundle_environment is None:
            if self._environment_mode == "bundle":  # the sandbox builds it (an image per key)
                return {"mode": "bundle", "sandbox": self.sandbox.name}
            return {"mode": "worker"}
        lease = self.bundle_environment.lease
        built = lease.environment
        return {
            "mode": "bundle",
            "digest": built.key.digest,
            "python": f"{built.key.implementation} {built.python_version}",
            "packages": len(built.key.requirements),
            "local": list(built.key.local),
            "built": lease.built,
            "build_s": round(built.build_s, 3) if lease.built else None,
        }

    def _no_environment(self) -> ReplayResult:
        reason = self.environment_error or "the bundle's environment cannot be had here"
        process = ProcessResult(exit_code=0, stdout="", stderr=reason, timed_out=False, duration_s=0.0)
        return ReplayResult(outcome=Outcome.ENVIRONMENT, failure=None, process=process, reason=reason)

    def _apply_subsets(self, ws: Workspace, subsets: Mapping[str, Sequence[int]]) -> None:
        from flaketriage.bundle.datasets import write_subset

        for data in self.manifest.data:
            if data.path not in subsets:
                continue
            target = ws.cwd / data.path
            if target.is_dir():
                shutil.rmtree(target)
            else:
                target.unlink()
            write_subset(self.template.cwd / data.path, target, data.format, subsets[data.path])

    def _classify(self, result: ProcessResult, ws: Workspace) -> ReplayResult:
        def fingerprint(exit_code: int) -> FailureInfo | None:
            return fingerprint_failure(
                exit_code=exit_code,
                stdout=result.stdout,
                stderr=result.stderr,
                roots=[str(ws.cwd), str(ws.root)],
                criteria=self.manifest.criteria,
                timed_out=result.timed_out,
                metrics_dir=ws.cwd,
                hang=result.hang,
            )

        original = self.manifest.failure.fingerprint
        info = fingerprint(result.unwrapped_exit_code)
        if info is not None:
            # A bundle captured before its kind of signature changed names the earlier one.
            info = info.as_of(original) or info
        if info is not None and info.kind == "timeout" and self.manifest.failure.signature == "timeout":
            # A hang captured without its stacks (no dump could be taken, or an older capture) is
            # matched as a plain timeout; the stacks stay the evidence.
            info = dataclasses.replace(info, signature="timeout", fingerprint=original)
        unwrapped = result.unwrapped_exit_code != result.exit_code
        if unwrapped and info is not None and info.fingerprint != original:
            # A wrapper's 128 + N is read as signal N, but the program may have exited with that
            # status itself (and the capture, with no wrapper, saw it so): that reading counts too.
            literal = fingerprint(result.exit_code)
            matched = literal.as_of(original) if literal is not None else None
            if matched is not None:
                info = matched
        captured_hang = self.manifest.failure.kind == "timeout"
        outcome = outcome_of(info, original, result.limit, captured_hang=captured_hang)
        return ReplayResult(outcome=outcome, failure=info, process=result)


def outcome_of(
    info: FailureInfo | None, original: str, limit: Limit | None, *, captured_hang: bool = False
) -> Outcome:
    """How a replay ended, from its failure (None: it passed) and the sandbox limit it broke.

    A failure that matches the captured one reproduces it, even when a limit ended it (a captured
    hang that hangs again, a captured OOM kill killed again); any other failure of a run that broke
    a limit (its time, memory, processes, a network it was denied) is a `sandbox` outcome, never a
    reproduction and never a new failure of the program's own. The exception: when the captured
    failure was itself a hang (`captured_hang`), a replay that hangs in another place (its stuck
    frames differ, `flaketriage.process.hangs`) is a different failure, another hang.
    """
    if info is None:
        return Outcome.PASSED
    if info.fingerprint == original:
        return Outcome.REPRODUCED
    if limit is not None and not (limit == "timeout" and captured_hang and info.kind == "timeout"):
        return Outcome.SANDBOX
    return Outcome.DIFFERENT


def _read_artifacts(cwd: Path, names: Sequence[str]) -> dict[str, bytes]:
    """The files `names` under `cwd` that exist (one that resolves outside `cwd` is skipped)."""
    found: dict[str, bytes] = {}
    root = cwd.resolve()
    for name in names:
        path = (cwd / name).resolve()
        if root not in path.parents or not path.is_file():
            continue
        try:
            found[name] = path.read_bytes()
        except OSError:
            continue
    return found
