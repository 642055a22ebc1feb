"""Deterministic replay: rerun a bundle's command in a fresh copy of its workspace, in a sandbox.

Each replay gets the recorded seeds and deterministic settings, a wall-clock limit and a private
copy of the materialized workspace; its failure counts as a reproduction only when its fingerprint
equals the original's.

What a replay takes from the machine (the base environment, where temporary workspaces go, how git
runs) comes in a `ReplayContext`, never from process globals, so one worker process can run many
triages at once in threads.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from flaketriage.child_process import ProcessResult
from flaketriage.fingerprint import FailureInfo, fingerprint_failure
from flaketriage.git import Git
from flaketriage.manifest import Manifest
from flaketriage.redaction import MASK
from flaketriage.replay_env import REPLAY_SETTINGS
from flaketriage.settings import DEFAULT_REPLAY_TIMEOUT_S
from flaketriage.store import Store
from flaketriage.workers.interpreter import interpreter_paths
from flaketriage.workers.materialize import Workspace, materialize
from flaketriage.workers.sandbox import Sandbox, SandboxSpec
from flaketriage.workers.verdict import Outcome

SITECUSTOMIZE_DIR = Path(__file__).parent / "sitecustomize"
_PATHLIKE_VARS = ("PATH", "VIRTUAL_ENV", "CONDA_PREFIX")


@dataclass(frozen=True)
class ReplayResult:
    """One replay: how it ended compared with the original failure."""

    outcome: Outcome
    failure: FailureInfo | None
    process: ProcessResult


@dataclass(frozen=True)
class Variant:
    """A change to the captured run, for minimization: data subsets and argument values."""

    data: Mapping[str, Sequence[int]] | None = None
    """data path → indices of the items to keep."""
    argv: Sequence[str] | None = None


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

    @classmethod
    def from_process(cls) -> ReplayContext:
        """This process's environment, the system temp directory, and git run in that environment."""
        env = dict(os.environ)
        return cls(base_env=env, temp_root=Path(tempfile.gettempdir()), git=Git(env=env))


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
            self._interpreters = self._interpreter_dirs()
        except BaseException:
            self.close()  # a bundle that cannot be materialized leaves nothing behind
            raise

    def __enter__(self) -> Replayer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)

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
        env["PWD"] = str(ws.cwd)
        return env

    def _interpreter_dirs(self) -> list[Path]:
        """Interpreter directories the sandbox would hide: in the original workspace or under /tmp.

        A virtualenv inside the project, or one in /tmp, must stay readable (and is never moved
        into the replay's workspace) or the command could not even start. The original workspace
        itself stays hidden even when it is an editable install: the replay runs the bundle's copy.
        """
        env = self.manifest.command.env
        argv0 = self.manifest.command.argv[0] if self.manifest.command.argv else ""
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
        """One replay in a private copy of the workspace."""
        self._count += 1
        ws = self.template.copy(self._tmp / f"run-{self._count}")
        try:
            argv = list(variant.argv) if variant and variant.argv else list(self.manifest.command.argv)
            if variant and variant.data:
                self._apply_subsets(ws, variant.data)
            spec = SandboxSpec(
                argv=[self._move_arg(a, ws) for a in argv],
                workspace=ws.root,
                cwd=ws.cwd,
                env=self.environment(ws),
                timeout_s=self.timeout_s,
                memory_mb=self.memory_mb,
                hide=[Path(r) for r in _original_roots(self.manifest)],
                mount_at=self._source_root(),
                expose=self._interpreters,
            )
            result = self.sandbox.run(spec)
            return self._classify(result, ws)
        finally:
            ws.remove()

    def _apply_subsets(self, ws: Workspace, subsets: Mapping[str, Sequence[int]]) -> None:
        from flaketriage.datasets import write_subset

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
            )

        original = self.manifest.failure.fingerprint
        info = fingerprint(result.unwrapped_exit_code)
        unwrapped = result.unwrapped_exit_code != result.exit_code
        if unwrapped and info is not None and info.fingerprint != original:
            # A wrapper's 128 + N is read as signal N, but the program may have exited with that
            # status itself (and the capture, with no wrapper, saw it so): that reading counts too.
            literal = fingerprint(result.exit_code)
            if literal is not None and literal.fingerprint == original:
                info = literal
        if info is None:
            outcome = Outcome.PASSED
        elif info.fingerprint == original:
            outcome = Outcome.REPRODUCED
        else:
            outcome = Outcome.DIFFERENT
        return ReplayResult(outcome=outcome, failure=info, process=result)
