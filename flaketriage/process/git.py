"""The git runner: every git command flaketriage runs (capture, materialization, the demo) goes through `Git`.

One way to run git everywhere: an explicit executable, environment and time limit, no stdin, and one
error (`GitError`) that names the command, the tail of its stderr and what to do next.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from flaketriage.errors import GitError

STDERR_TAIL_CHARS = 2000
"""How much of a failed command's stderr an error carries (the end, where git says why)."""


def _tail(raw: bytes | str | None) -> str:
    if raw is None:
        return ""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    text = text.strip()
    return text if len(text) <= STDERR_TAIL_CHARS else "…" + text[-STDERR_TAIL_CHARS:]


@dataclass(frozen=True)
class Git:
    """Runs git: `executable`, at most `timeout_s` seconds a command, in environment `env`.

    ``env=None`` runs git in this process's environment (what a CI job's capture wants); a worker
    passes the environment it was given, so that nothing it runs reads ``os.environ`` itself.
    """

    executable: str = "git"
    timeout_s: float = 600.0
    env: Mapping[str, str] | None = field(default=None, repr=False, hash=False)

    def run(
        self, args: Sequence[str], cwd: Path, *, stdin: bytes | None = None, hint: str | None = None
    ) -> bytes:
        """Run ``git ARGS`` in `cwd` and return its stdout; `stdin` is fed to it when given.

        Raises `GitError` when git cannot start, runs past `timeout_s`, or exits non-zero; `hint`
        replaces the generic advice in that error's message.
        """
        argv = [self.executable, *args]
        command = shlex.join(argv)
        try:
            done = subprocess.run(
                argv,
                cwd=cwd,
                env=None if self.env is None else dict(self.env),
                input=stdin,
                stdin=subprocess.DEVNULL if stdin is None else None,
                capture_output=True,
                timeout=self.timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            stderr = _tail(exc.stderr)
            raise GitError(
                f"`{command}` did not finish within {self.timeout_s:g} s in {cwd} and was stopped"
                + (f": {stderr}" if stderr else "")
                + ". "
                + (
                    hint
                    or "A clone of a large or unreachable remote can take that long: check that the "
                    "remote answers, or raise the git time limit"
                ),
                command=command,
                stderr=stderr,
            ) from exc
        except OSError as exc:
            if not Path(cwd).is_dir():
                what = f"cannot run `{command}`: its working directory {cwd} does not exist"
                todo = "this is a bug in the caller; report it with the command above"
            else:
                what = f"cannot start git ({self.executable!r}): {exc.strerror or exc}"
                todo = "install git (e.g. `apt-get install git`) or put it on PATH"
            raise GitError(f"{what}; {todo}", command=command, stderr="") from exc
        if done.returncode != 0:
            stderr = _tail(done.stderr) or _tail(done.stdout)
            raise GitError(
                f"`{command}` failed in {cwd} (exit status {done.returncode}): {stderr or '(no output)'}. "
                + (
                    hint
                    or "Run it there by hand to see why, fix the repository, commit or remote it names, "
                    "and try again"
                ),
                command=command,
                returncode=done.returncode,
                stderr=stderr,
            )
        return done.stdout

    def text(self, args: Sequence[str], cwd: Path, *, hint: str | None = None) -> str:
        """`run`'s stdout as text, without surrounding whitespace."""
        return self.run(args, cwd, hint=hint).decode("utf-8", "replace").strip()

    def try_run(self, args: Sequence[str], cwd: Path) -> bytes | None:
        """`run`'s stdout, or None when the command failed for any reason (a question, not a step)."""
        try:
            return self.run(args, cwd)
        except GitError:
            return None

    def try_text(self, args: Sequence[str], cwd: Path) -> str | None:
        """`text`, or None when the command failed for any reason."""
        out = self.try_run(args, cwd)
        return out.decode("utf-8", "replace").strip() if out is not None else None

    def root(self, cwd: Path) -> Path | None:
        """The top of the work tree that holds `cwd`, or None outside one (or without git)."""
        top = self.try_text(["rev-parse", "--show-toplevel"], cwd)
        return Path(top) if top else None
