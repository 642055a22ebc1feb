"""A real browser on the dashboard: Debian's Chromium driven by Playwright, against the receiver
served by uvicorn on loopback over the seeded world (`seed`), on SQLite.

Screenshots of every page are written to ``FLAKETRIAGE_SCREENSHOTS`` (default: ``build/screenshots``
under the repository); the manual's pictures are these files, copied (docs/service/dashboard.md).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.ci.live_service import served

__all__ = ["chromium", "screenshots_dir", "served"]

CHROMIUM = "/usr/bin/chromium"
REPOSITORY = Path(__file__).resolve().parents[3]


def screenshots_dir() -> Path:
    folder = Path(os.environ.get("FLAKETRIAGE_SCREENSHOTS") or REPOSITORY / "build" / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@contextmanager
def chromium() -> Iterator[Any]:
    """Headless Chromium from Debian's package (no browser download)."""
    from playwright.sync_api import sync_playwright

    if shutil.which(CHROMIUM) is None:
        raise RuntimeError(f"{CHROMIUM} is missing: run tests/run.sh (it installs Debian's chromium)")
    # As root, Chromium's own sandbox cannot start; the pages it opens are our own, on loopback.
    args = ["--no-sandbox"] if os.geteuid() == 0 else []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=args)
        try:
            yield browser
        finally:
            browser.close()
