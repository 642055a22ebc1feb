"""A git project with every secret of a corpus planted where a CI job leaks them, captured by the
real ``flaketriage capture`` and triaged by the real ``flaketriage triage``; and everything that
capture and triage stored, read back as text to search for them.

Each secret is planted in the environment (under its own secret name and under an innocuous one),
in the program's argv, stdout, stderr and log, in configuration files (YAML, TOML,
JSON, an ``.env``-like file), in a source file's uncommitted change, and in the git remote's URL.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.reliability.corpus import Secret

INNOCUOUS = "FT_PLANTED_{}"
"""The innocuous variable name each secret is planted under too."""
GIT_SHA_FILE = "git-sha.txt"

PROGRAM = """\
import json
import logging
import sys
from pathlib import Path

SECRETS = json.loads(Path("planted.json").read_text())
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
log = logging.getLogger("job")


def connect(kind, value):
    print(f"connecting with {kind}={value}")
    print(f"retrying {value} ...", file=sys.stderr)
    log.info("credential %s in use: %s", kind, value)


for kind, value in SECRETS.items():
    connect(kind, value)
print("sha256 of the data:", "@DIGEST@")
print("built from commit", Path("@SHA_FILE@").read_text().strip())
# The message is the same in replays, which see the masked copies: the failure reproduces.
raise RuntimeError(f"could not connect with {len(SECRETS)} credentials")
"""


@dataclass(frozen=True)
class PlantedRun:
    """A captured and triaged run of `PROGRAM` with `secrets` planted; its project and store."""

    project: Path
    secrets: tuple[Secret, ...]
    bundle: str
    report: str
    """The triage's output and report, ``bundle show`` and the files of ``bundle export``."""
    commit: str
    digest: str

    @property
    def store(self) -> Path:
        return self.project / ".flaketriage"


def _git(project: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=project, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def _write_project(project: Path, secrets: Sequence[Secret], by_name: bool, digest: str) -> str:
    """The git repository with the secrets committed nowhere and planted everywhere; its commit."""
    project.mkdir(parents=True, exist_ok=True)
    _git(project, "init", "-q", "-b", "main")
    _git(project, "config", "user.email", "ci@example.com")
    _git(project, "config", "user.name", "CI")
    (project / "main.py").write_text("print('placeholder')\n")
    (project / ".gitignore").write_text(".flaketriage/\n")
    _git(project, "add", "main.py", ".gitignore")
    _git(project, "commit", "-q", "-m", "initial")
    commit = _git(project, "rev-parse", "HEAD")
    remote = next(s.value for s in secrets if s.kind == "github_classic_token")
    _git(project, "remote", "add", "origin", f"https://ci_user:{remote}@github.com/acme/app.git")
    (project / GIT_SHA_FILE).write_text(commit + "\n")
    values = {s.kind: s.value for s in secrets}
    (project / "planted.json").write_text(json.dumps(values, indent=1))
    # The tracked source changed (the diff) and untracked source: literals, as code holds them.
    literals = "".join(f"{s.kind.upper()} = {json.dumps(s.value)}\n" for s in secrets)
    (project / "main.py").write_text(
        literals + PROGRAM.replace("@DIGEST@", digest).replace("@SHA_FILE@", GIT_SHA_FILE)
    )
    (project / "settings_local.py").write_text(literals)
    key = (lambda s: s.env_name.lower()) if by_name else (lambda s: f"item_{s.kind}")
    yaml = "".join(f"{key(s)}: {json.dumps(s.value)}\n" for s in secrets)
    (project / "config.yaml").write_text("service:\n  endpoint: https://api.example.com\n" + yaml)
    toml = "".join(f"{key(s)} = {json.dumps(s.value)}\n" for s in secrets)
    (project / "settings.toml").write_text("[service]\n" + toml)
    (project / "app.json").write_text(json.dumps({key(s): s.value for s in secrets}, indent=2))
    dotenv = "".join(f"{s.env_name if by_name else key(s)}={json.dumps(s.value)}\n" for s in secrets)
    (project / "deploy.env").write_text(dotenv)
    (project / ".env").write_text(dotenv)  # a credential file: never captured at all
    return commit


def _environment(secrets: Sequence[Secret], by_name: bool) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("FLAKETRIAGE_", "GITHUB_", "GH_")) and k not in ("CI", "GITHUB_ACTIONS")
    }
    for index, secret in enumerate(secrets):
        env[INNOCUOUS.format(index)] = secret.value
        if by_name:
            env[secret.env_name] = secret.value
    return env


def _flaketriage(project: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flaketriage", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def plant_and_capture(
    project: Path, secrets: Sequence[Secret], *, by_name: bool = True, triage: bool = True
) -> PlantedRun:
    """Write the project, capture its failing run (every secret also in argv), and triage the bundle.

    With `by_name` False no variable or configuration key names a secret: what is masked then was
    recognized by its shape alone."""
    digest = "9f2c" * 16
    commit = _write_project(project, secrets, by_name, digest)
    env = _environment(secrets, by_name)
    argv = [sys.executable, "main.py", *(s.value for s in secrets)]
    done = _flaketriage(project, env, "capture", "--json", "--", *argv)
    assert done.returncode == 1, done.stderr[-3000:]
    bundle = str(json.loads(done.stdout.strip().splitlines()[-1])["bundle"])
    report = ""
    if triage:
        done = _flaketriage(
            project, env, "triage", bundle, "--sandbox", "process", "--max-replays", "5", "--json"
        )
        assert done.returncode == 0, done.stderr[-3000:]
        answer = json.loads(done.stdout)
        location = project / answer["report"]["location"]
        report = done.stdout + done.stderr + location.read_text(encoding="utf-8")
        report += _shown(project, env, bundle)
    return PlantedRun(project, tuple(secrets), bundle, report, commit, digest)


def _shown(project: Path, env: dict[str, str], bundle: str) -> str:
    """What a person reads of the bundle besides the report: ``bundle show`` and every file of
    ``bundle export`` (its README and ``run.sh`` name the command and environment)."""
    shown = _flaketriage(project, env, "bundle", "show", bundle)
    assert shown.returncode == 0, shown.stderr[-3000:]
    exported = project.parent / f"{project.name}-export"
    done = _flaketriage(project, env, "bundle", "export", bundle, str(exported))
    assert done.returncode == 0, done.stderr[-3000:]
    files = sorted(p for p in exported.rglob("*") if p.is_file())
    assert files
    return shown.stdout + "".join(p.read_bytes().decode("utf-8", "replace") for p in files)


def stored_texts(store_dir: Path) -> Iterator[tuple[str, str]]:
    """(where, text) of everything in a local store: each object as the store returns it
    (decompressed), and every file on disk as it is (refs, state, the raw objects)."""
    from flaketriage.store import open_store

    store = open_store(store_dir, readonly=True)
    for key in store.keys():  # noqa: SIM118 (a store is not a dict)
        yield f"object {key}", store.get_bytes(key).decode("utf-8", "replace")
    for path in sorted(p for p in store_dir.rglob("*") if p.is_file()):
        yield f"file {path.relative_to(store_dir)}", path.read_bytes().decode("utf-8", "replace")
