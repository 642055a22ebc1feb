"""The documentation site builds cleanly and works offline.

``mkdocs build --strict`` turns every warning into an error: a link to a page or an anchor that does
not exist, a page left out of the navigation, a broken configuration. The built pages may load no
script, style sheet, font or image from another host (no CDN): the site must work without a network.
"""

from __future__ import annotations

import os
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

EXTERNAL = ("http://", "https://", "//")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        import material  # noqa: F401
    except ImportError:
        pytest.fail("mkdocs-material is not installed: pip install -e '.[dev]' (tests/run.sh does)")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}{done.stderr}"
    return out


class _Assets(HTMLParser):
    """Every address a page loads by itself: ``<script src>``, ``<link href>``, ``<img src>``."""

    def __init__(self) -> None:
        super().__init__()
        self.loaded: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        wanted = {"script": "src", "link": "href", "img": "src", "iframe": "src"}.get(tag)
        for name, value in attrs:
            if name == wanted and value:
                self.loaded.append(value)


def test_the_site_builds_strictly(site: Path) -> None:
    assert (site / "index.html").is_file()
    for page in ("reference/settings.html", "reference/cli.html", "architecture.html", "changelog.html"):
        assert (site / page).is_file(), page


def test_the_site_loads_nothing_from_another_host(site: Path) -> None:
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 20
    external = {}
    for page in pages:
        parser = _Assets()
        parser.feed(page.read_text(encoding="utf-8"))
        found = [url for url in parser.loaded if url.strip().lower().startswith(EXTERNAL)]
        if found:
            external[str(page.relative_to(site))] = found
    assert not external, f"pages load from other hosts (the site must work offline): {external}"
    for sheet in site.rglob("*.css"):
        text = sheet.read_text(encoding="utf-8", errors="replace")
        assert "fonts.googleapis.com" not in text and "fonts.gstatic.com" not in text, sheet


def test_the_changelog_page_is_the_changelog(site: Path) -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert "## [Unreleased]" in changelog
    assert "Unreleased" in (site / "changelog.html").read_text(encoding="utf-8")
