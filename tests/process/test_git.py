"""The git runner: answers, errors that say which command failed and why, limits, environment."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import pytest

from flaketriage.errors import FlaketriageError, GitError
from flaketriage.process.git import STDERR_TAIL_CHARS, Git

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


@pytest.fixture
def git(tmp_path: Path) -> Git:
    # Never find a repository above tmp_path, whatever the machine's /tmp sits in.
    return Git(env={**os.environ, "GIT_CEILING_DIRECTORIES": str(tmp_path)})


@pytest.fixture
def repo(tmp_path: Path, git: Git) -> Path:
    path = tmp_path / "repo"
    (path / "sub").mkdir(parents=True)
    git.run(["init", "-q"], path)
    return path


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "fake-git"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_answers_and_the_work_tree_root(tmp_path: Path, git: Git, repo: Path) -> None:
    assert git.text(["rev-parse", "--is-inside-work-tree"], repo / "sub") == "true"
    assert git.root(repo / "sub") == repo.resolve()
    assert git.root(tmp_path) is None
    assert git.try_text(["rev-parse", "--verify", "HEAD"], repo) is None  # no commit yet


def test_stdin_is_fed_to_the_command(git: Git, repo: Path) -> None:
    out = git.run(["hash-object", "--stdin"], repo, stdin=b"hello\n")
    assert out.decode().strip() == "ce013625030ba8dba906f756967f9e9ca394464a"


def test_runs_in_the_environment_it_was_given(git: Git, repo: Path) -> None:
    env = {**(git.env or {}), "GIT_AUTHOR_NAME": "Ada Lovelace", "GIT_AUTHOR_EMAIL": "ada@example.invalid"}
    assert (
        Git(env=env).text(["var", "GIT_AUTHOR_IDENT"], repo).startswith("Ada Lovelace <ada@example.invalid>")
    )


def test_a_failed_command_names_itself_its_stderr_and_what_to_do(git: Git, repo: Path) -> None:
    with pytest.raises(GitError) as caught:
        git.run(["checkout", "--quiet", "no-such-ref"], repo)
    exc = caught.value
    assert isinstance(exc, FlaketriageError)
    assert exc.command == "git checkout --quiet no-such-ref" and exc.returncode not in (0, None)
    assert "no-such-ref" in exc.stderr
    message = str(exc)
    assert message.startswith(f"`git checkout --quiet no-such-ref` failed in {repo} (exit status ")
    assert exc.stderr in message and "Run it there by hand" in message
    assert git.try_run(["checkout", "--quiet", "no-such-ref"], repo) is None
    with pytest.raises(GitError, match="re-capture it") as hinted:
        git.run(["checkout", "--quiet", "no-such-ref"], repo, hint="The commit is gone; re-capture it")
    assert "Run it there by hand" not in str(hinted.value)


def test_the_error_keeps_the_tail_of_a_long_stderr(tmp_path: Path) -> None:
    fake = _script(
        tmp_path,
        'i=0; while [ $i -lt 500 ]; do echo "line $i of noise" >&2; i=$((i+1)); done\n'
        "echo 'fatal: the real reason' >&2; exit 128\n",
    )
    with pytest.raises(GitError) as caught:
        Git(executable=fake).run(["fetch"], tmp_path)
    assert caught.value.stderr.endswith("fatal: the real reason")
    assert len(caught.value.stderr) <= STDERR_TAIL_CHARS + 1 and "line 0 of noise" not in caught.value.stderr


def test_a_missing_git_says_to_install_it(tmp_path: Path) -> None:
    with pytest.raises(GitError, match=r"cannot start git .*install git") as caught:
        Git(executable=str(tmp_path / "no-git-here")).run(["status"], tmp_path)
    assert caught.value.returncode is None
    assert Git(executable=str(tmp_path / "no-git-here")).root(tmp_path) is None


def test_a_missing_working_directory_is_named(tmp_path: Path, git: Git) -> None:
    with pytest.raises(GitError, match=r"working directory .*does not exist"):
        git.run(["status"], tmp_path / "gone")


def test_a_command_past_its_time_limit_is_stopped(tmp_path: Path) -> None:
    fake = _script(tmp_path, "exec sleep 30\n")
    with pytest.raises(GitError, match=r"did not finish within 0\.3 s") as caught:
        Git(executable=fake, timeout_s=0.3).run(["clone", "https://example.invalid/x"], tmp_path)
    assert caught.value.returncode is None


def test_the_error_survives_pickling_and_the_runner_hides_its_environment() -> None:
    exc = GitError("`git x` failed", command="git x", returncode=1, stderr="fatal: x")
    back = pickle.loads(pickle.dumps(exc))
    assert (str(back), back.command, back.returncode, back.stderr) == (str(exc), "git x", 1, "fatal: x")
    assert "SECRET" not in repr(Git(env={"API_TOKEN": "SECRET"}))
