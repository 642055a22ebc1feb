"""Settings: one pydantic-settings model, read from ``FLAKETRIAGE_*`` environment variables.

Nothing reads them at import time: the CLI builds ``Settings()`` once and passes it down.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Every flaketriage setting. Each is documented once, here; the README table is built from it."""

    model_config = SettingsConfigDict(env_prefix="FLAKETRIAGE_", extra="ignore")

    store: Path = Field(
        default=Path(".flaketriage"),
        description="Where bundles live: a directory (created on first use).",
    )
    issues_dir: Path | None = Field(
        default=None,
        description="Where Markdown issues are written. Default: `<store>/issues`.",
    )
    quarantine_file: Path | None = Field(
        default=None,
        description="The quarantine list (JSON). Default: `<store>/quarantine.json`.",
    )
    sandbox: Literal["auto", "bwrap", "process"] = Field(
        default="auto",
        description="Replay isolation: `bwrap` (bubblewrap namespaces: no network, the original "
        "workspace hidden), `process` (a plain subprocess in a fresh directory), or `auto` "
        "(bwrap when installed).",
    )
    replay_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="Wall-clock limit of one replay, when the capture recorded none.",
    )
    replay_memory_mb: int | None = Field(
        default=None,
        gt=0,
        description="Address-space limit of one replay in MiB (none by default).",
    )
    max_replays: int = Field(default=100, ge=1, description="Upper bound on replays for one verdict.")
    flaky_rate_replays: int = Field(
        default=20,
        ge=0,
        description="After a flaky verdict, replays continue until this many in all, to narrow the "
        "failure-rate interval (0: stop at the decision).",
    )
    min_flaky_rate: float = Field(
        default=0.05,
        gt=0,
        lt=1,
        description="Lowest failure rate the verdict promises to detect (sets how many clean "
        "replays mean `not_reproduced`).",
    )
    max_flaky_rate: float = Field(
        default=0.5,
        gt=0,
        lt=1,
        description="Highest failure rate still called flaky with the promised error (sets how "
        "many reproductions in a row mean `deterministic`).",
    )
    alpha: float = Field(
        default=0.05,
        gt=0,
        lt=1,
        description="Largest accepted probability of calling a flaky failure (rate within "
        "[min, max]) deterministic or not reproduced.",
    )
    snapshot_max_file_mb: float = Field(
        default=10.0,
        gt=0,
        description="Files larger than this are left out of source snapshots and untracked files.",
    )
    snapshot_max_total_mb: float = Field(
        default=200.0, gt=0, description="Cap on the total size of a source snapshot."
    )
    notify_url: str | None = Field(
        default=None,
        description="The service's events endpoint (`https://host/v1/events`); when set, captures are "
        "sent there.",
    )
    webhook_secret: SecretStr | None = Field(
        default=None, description="Shared secret for the HMAC signature of sent events."
    )
    outbox_dir: Path | None = Field(
        default=None,
        description="Events that could not be sent wait here for the next run. Default: `<store>/outbox`.",
    )
    quarantine_url: str | None = Field(
        default=None,
        description="The service's quarantine list (`https://host/v1/quarantine`), read by the pytest "
        "plugin instead of the quarantine file.",
    )
    quarantine_cache_ttl_s: float = Field(
        default=3600.0,
        ge=0,
        description="How long the pytest plugin trusts its cached copy of the service's quarantine list.",
    )
    quarantine_fetch_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="How long the pytest plugin waits for the service's quarantine list before it "
        "falls back to its cached copy (or to no list).",
    )
    output_tail_lines: int = Field(
        default=200, ge=1, description="Lines of stdout/stderr shown in reports and summaries."
    )

    def resolved_issues_dir(self) -> Path:
        return self.issues_dir or self.store / "issues"

    def resolved_quarantine_file(self) -> Path:
        return self.quarantine_file or self.store / "quarantine.json"

    def resolved_outbox_dir(self) -> Path:
        return self.outbox_dir or self.store / "outbox"
