"""What the CLI and the service write in and beside a store has the store's modes: issues, comment
replies, the quarantine list and SQLite databases are their owner's alone (0600, directories 0700),
or the group's too for a shared store (0640, 2770), whatever the umask."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from flaketriage.files.modes import OWNER_ONLY, FileModes
from flaketriage.quarantine import FailureRate, QuarantineEvidence
from flaketriage.records import Database
from flaketriage.records.database import create_sqlite_file
from flaketriage.settings import Settings
from flaketriage.workers.comments import MarkdownCommenter, open_commenter
from flaketriage.workers.quarantine.file import Quarantine
from flaketriage.workers.report.backend import open_issue_sink
from flaketriage.workers.report.base import IssueDraft
from flaketriage.workers.report.markdown import MarkdownIssueSink
from tests.conftest import wait_for

FP = "ab" * 32
EVIDENCE = QuarantineEvidence(
    verdict="flaky", decided=True, replays=2, reproductions=1, passes=1, different=0,
    rate=FailureRate(estimate=0.5, low=0.01, high=0.99),
)  # fmt: skip
SHARED = FileModes.of(shared=True)


@pytest.fixture(autouse=True)
def open_umask() -> Iterator[None]:
    old = os.umask(0o022)  # the usual one: what it would let through is world-readable
    yield
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _modes_under(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): _mode(p) for p in [root, *root.rglob("*")]}


def _draft() -> IssueDraft:
    return IssueDraft(
        fingerprint=FP, title="t", body="b", labels=("flaketriage",), bundle_id="1" * 64,
        minimal_bundle_id=None, verdict="flaky",
    )  # fmt: skip


@pytest.mark.parametrize("modes", [OWNER_ONLY, SHARED], ids=["owner", "shared"])
def test_issues_and_comment_replies_have_the_stores_modes(tmp_path: Path, modes: FileModes) -> None:
    issues = tmp_path / "store" / "issues"
    sink = MarkdownIssueSink(issues, modes=modes)
    sink.upsert(_draft())
    sink.upsert(_draft())  # rewritten in place: still the same modes
    MarkdownCommenter(issues / "comments", modes=modes).comment("o/r", 7, "triaged")
    expected_dir = modes.directory
    assert _modes_under(issues) == {
        ".": expected_dir,
        f"{FP[:16]}.md": modes.file,
        ".flaketriage-issues.lock": modes.file,  # empty, but the store's like the rest
        "comments": expected_dir,
        "comments/o__r__7.md": modes.file,
        "comments/.comments.lock": modes.file,
    }


UPSERT_AGAIN = """
import sys
from pathlib import Path
from flaketriage.files.modes import FileModes
from flaketriage.workers.report.base import IssueDraft
from flaketriage.workers.report.markdown import MarkdownIssueSink
draft = IssueDraft(
    fingerprint="ab" * 32, title="t", body="b", labels=("flaketriage",), bundle_id="1" * 64,
    minimal_bundle_id=None, verdict="flaky",
)
MarkdownIssueSink(Path(sys.argv[1]), modes=FileModes.of(shared=True)).upsert(draft)
"""


def test_a_shared_stores_lock_files_are_taken_by_the_group_too(tmp_path: Path) -> None:
    """A lock file another member of the group created (0640) is opened read-only: flock needs no more."""
    issues = tmp_path / "store" / "issues"
    MarkdownIssueSink(issues, modes=SHARED).upsert(_draft())
    lock = issues / ".flaketriage-issues.lock"
    lock.chmod(0o440)  # as a member of the group who did not create it sees it: not writable
    # Root opens any file; without these two capabilities it obeys the mode bits like anyone.
    prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"] if os.geteuid() == 0 else []
    again = subprocess.run(
        [*prefix, sys.executable, "-c", UPSERT_AGAIN, str(issues)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert _mode(lock) == 0o440


def test_the_settings_choose_the_modes(tmp_path: Path) -> None:
    settings = Settings(store=str(tmp_path / "store"), store_shared=True)
    open_issue_sink(settings).upsert(_draft())
    open_commenter(settings).comment("o/r", 1, "x")
    issues = tmp_path / "store" / "issues"
    assert _mode(issues / f"{FP[:16]}.md") == 0o640 and _mode(issues / "comments" / "o__r__1.md") == 0o640


def test_the_quarantine_list_is_the_owners(tmp_path: Path) -> None:
    path = tmp_path / "store" / "quarantine.json"
    Quarantine(path).add(FP, test_id="t", command="c", bundle_id="b", evidence=EVIDENCE, reason="flaky")
    assert _modes_under(path.parent) == {".": 0o700, "quarantine.json": 0o600, ".quarantine.json.lock": 0o600}


def test_a_sqlite_database_and_its_wal_are_the_owners(tmp_path: Path) -> None:
    path = tmp_path / "store" / "service.db"
    db = Database(f"sqlite:///{path}")
    db.upgrade()
    files = {p.name: _mode(p) for p in path.parent.iterdir()}
    assert files["service.db"] == 0o600 and _mode(path.parent) == 0o700
    assert all(mode == 0o600 for mode in files.values()), files  # -wal and -shm too
    db.engine.dispose()


def test_an_existing_database_and_other_urls_are_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    path.write_bytes(b"")
    path.chmod(0o644)
    create_sqlite_file(f"sqlite:///{path}")
    assert _mode(path) == 0o644
    for url in ("sqlite://", "sqlite:///:memory:", "postgresql://u@h/db", None):
        create_sqlite_file(url)  # nothing to create, nothing raised


def test_beat_on_a_new_store_makes_it_the_owners(tmp_path: Path) -> None:
    """`flaketriage beat` may be the first process to touch the store: the directory it creates for
    its schedule is the store's, 0700, as the store itself makes it (it was 0755 under umask 022)."""
    store = tmp_path / "store"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLAKETRIAGE_")}
    env.update(FLAKETRIAGE_STORE=str(store), FLAKETRIAGE_BROKER_URL="memory://")
    beat = subprocess.Popen(
        [sys.executable, "-m", "flaketriage", "beat"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: os.umask(0o022),
    )
    try:
        wait_for(lambda: any(store.glob("beat-schedule*")), 60, "beat's schedule")
    finally:
        beat.terminate()
        beat.wait(timeout=30)
    modes = _modes_under(store)
    assert modes.pop(".") == 0o700
    assert modes and set(modes.values()) == {0o600}, modes


@pytest.mark.slow
def test_what_capture_and_triage_write_in_the_store_is_the_owners(tmp_path: Path) -> None:
    """The real CLI under umask 022: the store, its objects and refs, the issue the triage writes,
    and its lock file (0644 before) are the owner's alone."""
    (tmp_path / "job.py").write_text("raise ValueError('always')\n")
    store = tmp_path / ".flaketriage"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLAKETRIAGE_", "GITHUB_"))}
    env.update(FLAKETRIAGE_STORE=str(store), FLAKETRIAGE_SANDBOX="process")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "flaketriage", *args],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
            preexec_fn=lambda: os.umask(0o022),
        )  # fmt: skip

    captured = cli("capture", "--json", "--", sys.executable, "job.py")
    bundle = json.loads(captured.stdout.strip().splitlines()[-1])["bundle"]
    triaged = cli("triage", bundle, "--max-replays", "2")
    assert triaged.returncode == 0, triaged.stderr
    modes = _modes_under(store)
    assert any(name.startswith("issues/") and name.endswith(".md") for name in modes), modes
    wrong = {name: oct(mode) for name, mode in modes.items() if mode not in (0o600, 0o700)}
    assert wrong == {}
