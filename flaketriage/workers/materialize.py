"""Materialize a bundle: the source (git checkout + diff, or snapshot) and data, in a fresh directory.

Git runs through the `Git` the caller passes (a worker's carries the environment it was given), and
nothing here reads the process environment, changes directory or uses the system temp directory.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from flaketriage.bundle.files import restore_data_input, restore_files, safe_join
from flaketriage.bundle.manifest import Manifest
from flaketriage.bundle.safety import check_manifest
from flaketriage.errors import BundleError, GitError, SandboxError
from flaketriage.process.git import Git
from flaketriage.store import Store


@dataclass(frozen=True)
class Workspace:
    """A materialized bundle: `root` holds the source tree, `cwd` is where the command runs."""

    root: Path
    cwd: Path

    def copy(self, dest: Path) -> Workspace:
        """A private copy for one replay, so one run's writes never leak into the next."""
        shutil.copytree(self.root, dest, symlinks=True)
        return Workspace(root=dest, cwd=dest / self.cwd.relative_to(self.root))

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _checkout(manifest: Manifest, dest: Path, git: Git, latest: bool = False) -> None:
    src = manifest.source
    assert src.commit is not None
    # The branch's newest commit as the origin has it now (an isolation rerun: is it fixed yet?).
    revision = f"origin/{src.branch}" if latest and src.branch else src.commit
    origins = [o for o in (src.repo_path, src.remote) if o]
    errors: list[str] = []
    for origin in origins:
        if origin == src.repo_path and not Path(origin).is_dir():
            errors.append(f"{origin}: not a directory on this machine")
            continue
        try:
            git.run(["clone", "--quiet", "--no-checkout", "--", origin, str(dest)], dest.parent)
            git.run(["-c", "advice.detachedHead=false", "checkout", "--quiet", "--detach", revision], dest)
            return
        except GitError as exc:
            errors.append(f"`{exc.command}`: {exc.stderr or str(exc)}")
            shutil.rmtree(dest, ignore_errors=True)
    raise SandboxError(
        f"cannot check out {revision}: "
        + "; ".join(errors or ["the bundle names no repository"])
        + ". Replay where the repository (or its remote) is reachable, or capture with --snapshot"
    )


def materialize(store: Store, manifest: Manifest, dest: Path, *, git: Git, latest: bool = False) -> Workspace:
    """Lay out the bundle's source and data under `dest` (which must not exist or be empty).

    A git source is cloned and checked out with `git`; a recorded diff that does not apply raises
    `GitError`, a commit that cannot be checked out from anywhere `SandboxError`. With `latest`, a
    git source that recorded its branch is checked out at that branch's newest commit instead,
    without the recorded diff (it belonged to the old commit): the code as it is now.
    """
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise SandboxError(f"{dest} is not empty; materialize into a new directory")
    check_manifest(manifest)  # a hostile manifest is refused before anything is written
    src = manifest.source
    if src.kind == "git":
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists():
            dest.rmdir()
        _checkout(manifest, dest, git, latest)
        if src.diff is not None and not (latest and src.branch):
            git.run(
                ["apply", "--binary", "--whitespace=nowarn", "-"],
                dest,
                stdin=store.get_bytes(src.diff.sha256, max_size=src.diff.size),
                hint=f"The bundle's recorded diff does not apply to commit {src.commit}, so the two do "
                "not belong together; re-capture the failure, or capture it with --snapshot",
            )
    else:
        dest.mkdir(parents=True, exist_ok=True)
    restore_files(store, src.files, dest)
    cwd = safe_join(dest, src.subdir)
    try:
        cwd.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BundleError(
            f"cannot create the working directory {src.subdir!r:.120} under {dest}: {exc.strerror or exc}; "
            "re-capture the failure if the bundle's paths clash"
        ) from exc
    for data in manifest.data:
        restore_data_input(store, data, cwd, workspace=dest)
    return Workspace(root=dest.resolve(), cwd=cwd)
