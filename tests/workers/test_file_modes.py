"""What the CLI and the service write in and beside a store has the store's modes: issues, comment
replies, the quarantine list and SQLite databases are their owner's alone (0600, directories 0700),
or the group's too for a shared store (0640, 2770), whatever the umask."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from flaketriage.file_modes import OWNER_ONLY, FileModes
from flaketriage.quarantine import FailureRate, QuarantineEvidence
from flaketriage.records import Database
from flaketriage.records.database import create_sqlite_file
from flaketriage.settings import Settings
from flaketriage.workers.comments import MarkdownCommenter, open_commenter
from flaketriage.workers.quarantine import Quarantine
from flaketriage.workers.report.backend import open_issue_sink
from flaketriage.workers.report.base import IssueDraft
from flaketriage.workers.report.markdown import MarkdownIssueSink

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
    written = {name: mode for name, mode in _modes_under(issues).items() if not name.endswith(".lock")}
    expected_dir = modes.directory
    assert written == {
        ".": expected_dir,
        f"{FP[:16]}.md": modes.file,
        "comments": expected_dir,
        "comments/o__r__7.md": modes.file,
    }


def test_the_settings_choose_the_modes(tmp_path: Path) -> None:
    settings = Settings(store=str(tmp_path / "store"), store_shared=True)
    open_issue_sink(settings).upsert(_draft())
    open_commenter(settings).comment("o/r", 1, "x")
    issues = tmp_path / "store" / "issues"
    assert _mode(issues / f"{FP[:16]}.md") == 0o640 and _mode(issues / "comments" / "o__r__1.md") == 0o640


def test_the_quarantine_list_is_the_owners(tmp_path: Path) -> None:
    path = tmp_path / "store" / "quarantine.json"
    Quarantine(path).add(FP, test_id="t", command="c", bundle_id="b", evidence=EVIDENCE, reason="flaky")
    assert _mode(path) == 0o600 and _mode(path.parent) == 0o700


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
