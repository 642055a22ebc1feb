"""The generated reference pages are what the code generates: the settings table and the CLI.

When one of these fails, a setting or a command changed without its page: run
``python -m flaketriage.cli.reference`` and commit the pages it writes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flaketriage.cli import reference
from flaketriage.settings import Settings, env_var

ROOT = Path(__file__).resolve().parents[2]


def _committed(page: Path) -> str:
    path = ROOT / page
    assert path.is_file(), f"{page} is missing: generate it with `{reference.REGENERATE}`"
    return path.read_text(encoding="utf-8")


def test_the_settings_page_is_generated_from_the_model() -> None:
    assert _committed(reference.SETTINGS_PAGE) == reference.settings_page(), (
        f"{reference.SETTINGS_PAGE} differs from the Settings model: regenerate it with "
        f"`{reference.REGENERATE}`"
    )


def test_the_cli_page_is_generated_from_the_commands() -> None:
    assert _committed(reference.CLI_PAGE) == reference.cli_page(), (
        f"{reference.CLI_PAGE} differs from the flaketriage commands: regenerate it with "
        f"`{reference.REGENERATE}`"
    )


def test_the_settings_page_names_every_setting_once() -> None:
    page = reference.settings_page()
    for field in Settings.model_fields:
        assert page.count(f"| `{env_var(field)}` |") == 1, field


def test_the_cli_page_has_every_command_and_option() -> None:
    docs = list(reference.commands())
    paths = [doc.path for doc in docs]
    assert paths[0] == "flaketriage"
    for expected in (
        "flaketriage capture",
        "flaketriage triage",
        "flaketriage bundle",
        "flaketriage bundle push",
        "flaketriage cases show",
        "flaketriage gc",
        "flaketriage serve",
    ):
        assert expected in paths
    page = reference.cli_page()
    for doc in docs:
        assert f"\n## {doc.path}\n" in page
        assert f"\n{doc.usage}\n" in page
    push = next(doc for doc in docs if doc.path == "flaketriage bundle push")
    names = [name for name, _ in push.params]
    assert any(name.startswith("--to ") for name in names) and "--help" not in names
    assert "| `--threads <int range>` | Objects sent at once. `[default: 8; 1<=x<=64]` |" in page


def test_the_pages_are_the_same_on_every_machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No terminal width, colour, working directory or environment shows in them."""
    first = reference.cli_page(), reference.settings_page()
    monkeypatch.setenv("COLUMNS", "37")
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("FLAKETRIAGE_STORE", str(tmp_path / "elsewhere"))
    monkeypatch.chdir(tmp_path)
    assert (reference.cli_page(), reference.settings_page()) == first
    for page in first:
        assert "\x1b" not in page
        assert str(ROOT) not in page and str(Path.home()) not in page


def test_help_text_is_shown_literally() -> None:
    text = reference._markdown_text("a <store>/x, *not* bold, _x_ and [y](z), A_B, `a <b> *c*`")
    assert text == r"a &lt;store&gt;/x, \*not\* bold, \_x\_ and \[y\](z), A_B, `a <b> *c*`"
    assert reference._markdown_text("a | b `c|d`", in_table=True) == r"a \| b <code>c&#124;d</code>"
    assert reference._markdown_text("`c<d`", in_table=True) == "`c<d`"


def test_check_names_the_stale_page_and_write_fixes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "mkdocs.yml").write_text("site_name: t\n")
    assert reference.main(["--check", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"{reference.SETTINGS_PAGE} is stale" in err and f"{reference.CLI_PAGE} is stale" in err
    assert reference.REGENERATE in err

    assert reference.main(["--root", str(tmp_path)]) == 0
    assert reference.main(["--check", "--root", str(tmp_path)]) == 0
    assert reference.write_pages(tmp_path) == []  # nothing to rewrite

    page = tmp_path / reference.CLI_PAGE
    page.write_text(page.read_text() + "edited by hand\n")
    assert reference.main(["--check", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert re.search(rf"^{re.escape(str(reference.CLI_PAGE))} is stale", err, re.MULTILINE)
    assert str(reference.SETTINGS_PAGE) not in err


def test_a_root_without_mkdocs_yml_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert reference.main(["--root", str(tmp_path)]) == 2
    assert "mkdocs.yml" in capsys.readouterr().err
    assert not (tmp_path / "docs").exists()
