"""The GitHub stand-in, started per test on a free port, and sinks pointed at it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flaketriage.workers.report import IssueDraft
from flaketriage.workers.report.github_client import GitHubClient, GitHubConfig
from flaketriage.workers.report.github_sink import GitHubIssueSink
from tests.workers.github.stand_in import GitHubStandIn

REPO = "acme/models"
TOKEN = "ghp_" + "t" * 36
FP = "ab" * 32


@pytest.fixture
def github() -> Iterator[GitHubStandIn]:
    server = GitHubStandIn().start()
    server.add_repo(REPO)
    server.add_token(TOKEN)
    yield server
    server.stop()


def config(github: GitHubStandIn, **overrides: Any) -> GitHubConfig:
    """A configuration for the stand-in: no throttling, quick retries (1 s secondary-limit wait)."""
    fields: dict[str, Any] = {
        "repo": REPO,
        "api_url": github.url,
        "token": TOKEN,
        "throttle": False,
        "retries": 3,
        "backoff_factor": 0.05,
        "secondary_rate_wait_s": 1.0,
    }
    fields.update(overrides)
    return GitHubConfig(**fields)


class Clock:
    """A settable clock: each call returns `now`; `advance` moves it."""

    def __init__(self) -> None:
        self.now = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


@pytest.fixture
def make_sink(github: GitHubStandIn) -> Callable[..., GitHubIssueSink]:
    """A new sink with its own client: another "process" as far as GitHub can tell."""

    def build(
        clock: Callable[[], datetime] | None = None, interval_s: float = 600.0, **overrides: Any
    ) -> GitHubIssueSink:
        kwargs: dict[str, Any] = {"comment_interval_s": interval_s}
        if clock is not None:
            kwargs["clock"] = clock
        return GitHubIssueSink(GitHubClient(config(github, **overrides)), **kwargs)

    return build


def draft(
    bundle: str,
    *,
    key: str | None = None,
    fingerprint: str = FP,
    title: str = "[flaketriage] train.py: ZeroDivisionError: division by zero (deterministic)",
    verdict: str = "deterministic",
    body: str = "**Verdict: deterministic**\n\nevidence",
    labels: tuple[str, ...] | None = None,
) -> IssueDraft:
    return IssueDraft(
        fingerprint=fingerprint,
        title=title,
        body=body,
        labels=labels if labels is not None else ("flaketriage", verdict),
        bundle_id=bundle,
        minimal_bundle_id=None,
        verdict=verdict,
        key=key,
        evidence=f"**{verdict}**: reproduced in 5 of 5 replays",
    )
