"""Real flaky tests from other people's projects: capture in a CI-like session, triage, judge the verdict.

Each case in `cases.toml` (beside this file) names a released project, a flaky test of it from the
International Dataset of Flaky Tests, the pytest session that shows the flakiness, and the verdict that
is right. For each case this script

1. downloads the release's source distribution from the package index
   (`pip download --no-deps --no-binary :all: NAME==VERSION`, cached),
2. unpacks it into a fresh work directory and makes it a git repository (one commit, as a CI checkout),
3. creates a virtualenv outside the checkout (cached), installs flaketriage from this checkout
   (`pip install -e <repo root>`, so every run uses the checkout's current code), the case's test
   requirements, and the project as its CI does (`pip install -e .`),
4. runs `python -m pytest --flaketriage <session>` in the checkout, finds the victim's bundle,
5. runs `flaketriage triage BUNDLE --json` and compares the verdict and the polluters or setters it
   names with the expected ones.

It prints one table (project, test, category, expected, verdict, culprits named, replays, seconds) and
the share right, and exits 1 under 90%. It needs the package index and minutes per case, so it is not
part of the test suite (`bench/all.py` does not run this folder). Downloads and virtualenvs are cached
under `--cache` (default /tmp/flaketriage-real-projects); the checkout and the store are made anew every
run. `--only NAME` runs the cases of one project (or one `NAME@CATEGORY`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
GOAL_SHARE = 0.90


@dataclass(frozen=True)
class Case:
    """One flaky test of a released project, as cases.toml lists it."""

    name: str
    version: str
    test: str
    category: str
    session: list[str]
    extra: list[str]
    expected: str
    expected_culprits: list[str]
    idoft: str
    why: str
    attempts: int = 1

    @property
    def key(self) -> str:
        return f"{self.name}@{self.category}"


@dataclass
class Outcome:
    """What one case's run gave."""

    case: Case
    verdict: str = "-"
    culprits: list[str] = field(default_factory=list)
    itself: bool = False
    replays: int = 0
    sessions: int = 0
    seconds: float = 0.0
    right: bool = False
    note: str = ""
    triage_json: dict[str, object] | None = None


def load_cases(path: Path) -> list[Case]:
    data = tomllib.loads(path.read_text())
    return [Case(**entry) for entry in data["case"]]


def run(
    cmd: list[str], cwd: Path, env: dict[str, str], timeout: float, log: Path
) -> subprocess.CompletedProcess[str]:
    """Run one command, its output appended to the case's log."""
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    with log.open("a") as f:
        f.write(f"$ {' '.join(cmd)}  (cwd {cwd}, exit {proc.returncode})\n{proc.stdout}\n{proc.stderr}\n")
    return proc


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    # The outer shell's flaketriage and pytest settings must not reach the case's session.
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("FLAKETRIAGE_", "PYTEST_", "VIRTUAL_ENV"))
    }
    env.pop("PYTHONPATH", None)
    env.update(extra or {})
    return env


def fetch_sdist(case: Case, cache: Path, log: Path) -> Path:
    dl = cache / "sdists" / f"{case.name}-{case.version}"
    found = sorted(p for p in dl.glob("*") if p.suffix in (".gz", ".zip")) if dl.is_dir() else []
    if found:
        return found[0]
    dl.mkdir(parents=True, exist_ok=True)
    spec = f"{case.name}=={case.version}"
    proc = run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", spec, "-d", str(dl)],
        cwd=dl,
        env=clean_env(),
        timeout=300,
        log=log,
    )
    found = sorted(p for p in dl.glob("*") if p.suffix in (".gz", ".zip"))
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"pip download {spec} failed (exit {proc.returncode}): see {log}")
    return found[0]


def unpack(archive: Path, work: Path) -> Path:
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    if archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as z:
            z.extractall(work)
    else:
        with tarfile.open(archive) as t:
            t.extractall(work, filter="data")
    (top,) = [p for p in work.iterdir() if p.is_dir()]
    return top


def git_init(src: Path, log: Path) -> None:
    env = clean_env(
        {
            "GIT_AUTHOR_NAME": "ci",
            "GIT_AUTHOR_EMAIL": "ci@localhost",
            "GIT_COMMITTER_NAME": "ci",
            "GIT_COMMITTER_EMAIL": "ci@localhost",
        }
    )
    for cmd in (
        ["git", "init", "-q", "-b", "main"],
        ["git", "add", "-A"],
        ["git", "commit", "-q", "-m", "release"],
    ):
        proc = run(cmd, cwd=src, env=env, timeout=120, log=log)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed in {src}: see {log}")


def make_venv(case: Case, cache: Path, log: Path) -> Path:
    """A virtualenv per project release, outside the checkout; flaketriage editable from this checkout."""
    venv = cache / "venvs" / f"{case.name}-{case.version}-{'-'.join(sorted(case.extra)) or 'plain'}"
    py = venv / "bin" / "python"
    marker = venv / ".ready"
    if not marker.exists():
        if venv.exists():
            shutil.rmtree(venv)
        run([sys.executable, "-m", "venv", str(venv)], cwd=cache, env=clean_env(), timeout=300, log=log)
        steps = [
            [str(py), "-m", "pip", "install", "-q", "--upgrade", "pip", "setuptools", "wheel"],
            [str(py), "-m", "pip", "install", "-q", "-e", str(REPO_ROOT), "pytest", *case.extra],
        ]
        for cmd in steps:
            proc = run(cmd, cwd=cache, env=clean_env(), timeout=900, log=log)
            if proc.returncode != 0:
                raise RuntimeError(f"installing into {venv} failed: see {log}")
        marker.write_text("ok\n")
    return venv


def install_project(venv: Path, src: Path, log: Path) -> None:
    # As the project's CI installs it: editable, from the checkout.
    proc = run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-e", "."],
        cwd=src,
        env=clean_env(),
        timeout=900,
        log=log,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"pip install -e . failed in {src}: see {log}")


def venv_env(venv: Path, store: Path) -> dict[str, str]:
    return clean_env(
        {
            "VIRTUAL_ENV": str(venv),
            "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
            "FLAKETRIAGE_STORE": str(store),
        }
    )


def find_bundle(
    venv: Path, src: Path, env: dict[str, str], case: Case, log: Path
) -> tuple[str | None, list[str]]:
    proc = run(
        [str(venv / "bin" / "flaketriage"), "bundle", "list", "--json"],
        cwd=src,
        env=env,
        timeout=120,
        log=log,
    )
    try:
        bundles = json.loads(proc.stdout or "[]")
    except json.JSONDecodeError:
        return None, []
    tests = [b.get("test_id") or "" for b in bundles]
    for b in bundles:
        if (b.get("test_id") or "") == case.test:
            return b.get("id") or b.get("bundle"), tests
    return None, tests


def culprits_match(expected: list[str], named: list[str]) -> bool:
    """The named set is exactly the expected one: as many, each expected entry in a different named id."""
    if len(expected) != len(named):
        return False
    unused = list(named)
    for want in expected:
        hit = next((n for n in unused if want in n), None)
        if hit is None:
            return False
        unused.remove(hit)
    return True


def judge(case: Case, out: Outcome) -> bool:
    if out.verdict != case.expected:
        return False
    if case.expected_culprits == ["itself"]:
        return out.itself
    return culprits_match(case.expected_culprits, [] if out.itself else out.culprits)


def run_case(case: Case, cache: Path, timeout: float) -> Outcome:
    out = Outcome(case)
    slot = cache / "runs" / case.key.replace("/", "_")
    slot.mkdir(parents=True, exist_ok=True)
    log = slot / "log.txt"
    log.write_text(f"# {case.key} {case.test}\n")
    started = time.monotonic()
    deadline = started + timeout
    try:
        archive = fetch_sdist(case, cache, log)
        src = unpack(archive, slot / "work")
        git_init(src, log)
        venv = make_venv(case, cache, log)
        install_project(venv, src, log)
        store = slot / "store"
        if store.exists():
            shutil.rmtree(store)
        env = venv_env(venv, store)
        session = [str(venv / "bin" / "python"), "-m", "pytest", "--flaketriage", *case.session]
        # A flake that is not order-dependent fails only some CI runs: the CI runs again (a new push,
        # a nightly), up to `attempts` times, until a run fails and captures the victim.
        attempt = 0
        for attempt in range(1, case.attempts + 1):  # noqa: B007 (read after the loop)
            proc = run(session, cwd=src, env=env, timeout=max(60.0, deadline - time.monotonic()), log=log)
            bundle, tests = find_bundle(venv, src, env, case, log)
            if bundle is not None:
                break
        out.sessions = attempt
        if bundle is None:
            out.note = f"session exit {proc.returncode} ({case.attempts} runs): no bundle for {case.test}" + (
                f" (captured: {', '.join(tests)})" if tests else " (nothing captured)"
            )
            return out
        triage = [str(venv / "bin" / "flaketriage"), "triage", bundle, "--json"]
        tproc = run(triage, cwd=src, env=env, timeout=max(60.0, deadline - time.monotonic()), log=log)
        try:
            result = json.loads(tproc.stdout)
        except json.JSONDecodeError:
            out.note = (
                f"triage exit {tproc.returncode}, no JSON: {(tproc.stderr or tproc.stdout).strip()[-300:]}"
            )
            return out
        out.triage_json = result
        (slot / "triage.json").write_text(json.dumps(result, indent=2))
        search = result.get("polluter_search") or {}
        out.verdict = str(result.get("verdict"))
        out.culprits = list(result.get("polluters") or [])
        out.itself = bool(search.get("itself"))
        out.replays = int(result.get("replays") or 0) + int(search.get("replays") or 0)
        out.right = judge(case, out)
        if not out.right:
            findings = result.get("findings") or []
            out.note = "; ".join(
                str(f.get("summary") or f) if isinstance(f, dict) else str(f) for f in findings
            )[:400]
    except subprocess.TimeoutExpired as exc:
        out.note = f"timed out after {timeout:.0f} s in: {' '.join(map(str, exc.cmd))[:200]}"
    except RuntimeError as exc:
        out.note = str(exc)
    finally:
        out.seconds = time.monotonic() - started
    return out


def table(outcomes: list[Outcome]) -> str:
    rows = [
        (
            "project",
            "test",
            "category",
            "expected",
            "verdict",
            "polluters / setters named",
            "CI runs",
            "replays",
            "s",
            "right",
        )
    ]
    for o in outcomes:
        c = o.case
        expected = c.expected + (f" ({', '.join(c.expected_culprits)})" if c.expected_culprits else "")
        named = "itself" if o.itself else (", ".join(o.culprits) or "-")
        rows.append(
            (
                f"{c.name} {c.version}",
                c.test,
                c.category,
                expected,
                o.verdict,
                named,
                str(o.sessions),
                str(o.replays),
                f"{o.seconds:.0f}",
                "yes" if o.right else "NO",
            )
        )
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + " --- |" * len(rows[0])]
    lines += ["| " + " | ".join(r).replace("\n", " ") + " |" for r in rows[1:]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path("/tmp/flaketriage-real-projects"),
        help="downloads, virtualenvs and each case's run (default: %(default)s)",
    )
    parser.add_argument(
        "--only", action="append", default=[], help="run only this project (or NAME@CATEGORY); repeatable"
    )
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds per case, all steps (default: %(default)s)"
    )
    parser.add_argument("--cases", type=Path, default=HERE / "cases.toml")
    parser.add_argument("--json", type=Path, help="also write every outcome with its triage JSON here")
    args = parser.parse_args(argv)

    cases = load_cases(args.cases)
    if args.only:
        cases = [c for c in cases if c.name in args.only or c.key in args.only]
        if not cases:
            parser.error(f"no case matches {args.only}")
    args.cache.mkdir(parents=True, exist_ok=True)
    outcomes = []
    for case in cases:  # one at a time: each case's replays want the machine's cores to themselves
        print(f"== {case.key}: {case.test}", flush=True)
        o = run_case(case, args.cache.resolve(), args.timeout)
        print(
            f"   {o.verdict} {'right' if o.right else 'WRONG'} in {o.seconds:.0f} s"
            + (f": {o.note}" if o.note else ""),
            flush=True,
        )
        outcomes.append(o)
    print()
    print(table(outcomes))
    for o in outcomes:
        if not o.right and o.note:
            print(f"- {o.case.key} {o.case.test}: {o.note}")
    right = sum(o.right for o in outcomes)
    share = right / len(outcomes)
    ok = share >= GOAL_SHARE
    print(f"\nright: {right} of {len(outcomes)} ({share:.0%})")
    print(f"goal: share right {share:.0%} >= {GOAL_SHARE:.0%}: {'ok' if ok else 'MISSED'}")
    if args.json:
        args.json.write_text(
            json.dumps(
                [
                    {
                        "case": o.case.__dict__,
                        "verdict": o.verdict,
                        "culprits": o.culprits,
                        "itself": o.itself,
                        "sessions": o.sessions,
                        "replays": o.replays,
                        "seconds": round(o.seconds, 1),
                        "right": o.right,
                        "note": o.note,
                        "triage": o.triage_json,
                    }
                    for o in outcomes
                ],
                indent=2,
            )
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
