"""Where the service's commands keep their own files when the store is no directory."""

from __future__ import annotations

from pathlib import Path

from flaketriage.cli.service import _beside_store
from flaketriage.settings import Settings


def test_beats_of_two_s3_stores_keep_two_schedules(tmp_path: Path) -> None:
    one = _beside_store(Settings(store="s3://team-a/bundles"), "beat-schedule")
    other = _beside_store(Settings(store="s3://team-b/bundles"), "beat-schedule")
    again = _beside_store(Settings(store="s3://team-a/bundles"), "beat-schedule")

    assert one != other and one == again  # a restarted beat finds its own last run times
    assert one.name.startswith("flaketriage-beat-schedule-")


def test_a_directory_store_keeps_its_schedule_inside(tmp_path: Path) -> None:
    path = _beside_store(Settings(store=str(tmp_path / "store")), "beat-schedule")
    assert path == tmp_path / "store" / "beat-schedule" and path.parent.is_dir()
