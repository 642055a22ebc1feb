"""Settings: the store is a URL, bad values are one-line `ConfigError`s, every field is documented.

That docs/reference/settings.md is the generated table is checked in tests/docs/test_reference_pages.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from flaketriage.cli.reference import settings_table
from flaketriage.errors import ConfigError
from flaketriage.settings import Settings, load_settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("FLAKETRIAGE_"):
            monkeypatch.delenv(name)


def test_every_setting_is_documented_once_in_its_field() -> None:
    table = settings_table()
    for name, info in Settings.model_fields.items():
        assert info.description, f"{name} has no description"
        assert table.count(f"`FLAKETRIAGE_{name.upper()}`") == 1


def test_the_table_shows_defaults_and_derived_defaults() -> None:
    rows = {line.split(" | ")[0].strip("| `"): line for line in settings_table().splitlines()[2:]}
    assert "| `.flaketriage` |" in rows["FLAKETRIAGE_STORE"]
    assert "| `600` |" in rows["FLAKETRIAGE_REPLAY_TIMEOUT_S"]
    assert "| `<store>/issues` |" in rows["FLAKETRIAGE_ISSUES_DIR"]
    assert "Default:" not in rows["FLAKETRIAGE_ISSUES_DIR"]
    assert "| none |" in rows["FLAKETRIAGE_NOTIFY_URL"]


def test_the_store_is_a_url_not_a_path(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings().store == ".flaketriage"
    assert load_settings().local_store() == Path(".flaketriage")
    assert load_settings(store="memory://ci").store == "memory://ci"
    assert load_settings(store="file:///srv/ft").local_store() == Path("/srv/ft")
    monkeypatch.setenv("FLAKETRIAGE_STORE", "s3://bucket/prefix")
    assert load_settings().store == "s3://bucket/prefix"  # not the path s3:/bucket/prefix


def test_paths_beside_a_local_store(tmp_path: Path) -> None:
    settings = load_settings(store=str(tmp_path / "st"))
    assert settings.resolved_issues_dir() == tmp_path / "st" / "issues"
    assert settings.resolved_quarantine_file() == tmp_path / "st" / "quarantine.json"
    assert settings.resolved_outbox_dir() == tmp_path / "st" / "outbox"
    assert load_settings().resolved_outbox_dir() == Path(".flaketriage") / "outbox"
    url = load_settings(store=(tmp_path / "u").as_uri())
    assert url.resolved_issues_dir() == tmp_path / "u" / "issues"


def test_a_store_that_is_not_a_directory_needs_the_paths_set(tmp_path: Path) -> None:
    for store in ("s3://bucket/prefix", "memory://ci"):
        settings = load_settings(store=store)
        assert settings.local_store() is None
        with pytest.raises(ConfigError, match="FLAKETRIAGE_OUTBOX_DIR") as caught:
            settings.resolved_outbox_dir()
        assert store in str(caught.value)
        with pytest.raises(ConfigError, match="FLAKETRIAGE_ISSUES_DIR"):
            settings.resolved_issues_dir()
        with pytest.raises(ConfigError, match="FLAKETRIAGE_QUARANTINE_FILE"):
            settings.resolved_quarantine_file()
    explicit = load_settings(store="memory://ci", outbox_dir=tmp_path / "out")
    assert explicit.resolved_outbox_dir() == tmp_path / "out"


@pytest.mark.parametrize(
    ("variable", "value", "line"),
    [
        (
            "FLAKETRIAGE_MAX_REPLAYS",
            "abc",
            "FLAKETRIAGE_MAX_REPLAYS=abc is not valid: must be an integer >= 1",
        ),
        (
            "FLAKETRIAGE_ALPHA",
            "2",
            "FLAKETRIAGE_ALPHA=2 is not valid: must be less than 1 (a number in (0, 1))",
        ),
        (
            "FLAKETRIAGE_SANDBOX",
            "nope",
            "FLAKETRIAGE_SANDBOX=nope is not valid: must be one of auto, bwrap, process",
        ),
        (
            "FLAKETRIAGE_REPLAY_TIMEOUT_S",
            "0",
            "FLAKETRIAGE_REPLAY_TIMEOUT_S=0 is not valid: must be greater than 0 (a number > 0)",
        ),
        ("FLAKETRIAGE_STORE", "", "FLAKETRIAGE_STORE='' is not valid: the store location is empty: use a"),
        ("FLAKETRIAGE_STORE", "ftp://host/x", "FLAKETRIAGE_STORE=ftp://host/x is not valid: the store"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, line: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    message = str(caught.value)
    assert message.startswith(line), message
    assert "\n" not in message and "pydantic" not in message


def test_several_bad_values_are_all_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLAKETRIAGE_ALPHA", "x")
    monkeypatch.setenv("FLAKETRIAGE_MAX_REPLAYS", "0")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    message = str(caught.value)
    assert "FLAKETRIAGE_ALPHA=x" in message and "FLAKETRIAGE_MAX_REPLAYS=0" in message
    assert "\n" not in message


def test_an_override_is_named_by_its_field() -> None:
    with pytest.raises(ConfigError, match=r"^store='' is not valid"):
        load_settings(store="")


def test_a_secret_is_never_shown() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(webhook_secret=12345)
    assert "12345" not in str(caught.value) and "webhook_secret=***" in str(caught.value)
