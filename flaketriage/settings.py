"""Settings: one pydantic-settings model, read from ``FLAKETRIAGE_*`` environment variables.

Nothing reads them at import time: an entry point (the CLI, the pytest plugin, a guard) calls
`load_settings` once and passes the result down. A bad value is a `ConfigError` that names the
variable and what it accepts. The README's settings table is `settings_table`'s output.
"""

from __future__ import annotations

import os
import re
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings, SettingsConfigDict

from flaketriage.errors import ConfigError
from flaketriage.store.registry import local_path

ENV_PREFIX = "FLAKETRIAGE_"
DEFAULT_REPLAY_TIMEOUT_S = 600.0
"""The default of `Settings.replay_timeout_s`, and of the library calls it is passed down to."""
DEFAULT_OUTPUT_TAIL_LINES = 200
"""The default of `Settings.output_tail_lines`, and of the library calls it is passed down to."""


class Settings(BaseSettings):
    """Every flaketriage setting. Each is documented once, here; the README table is built from it."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    store: str = Field(
        default=".flaketriage",
        description="Where bundles live: a directory (created on first use), `file:///absolute/path` "
        "or `memory://NAME` (one store per name, shared within a process); `s3://bucket/prefix` once "
        "the S3 backend ships (until then opening it is an error that says so).",
    )
    store_shared: bool = Field(
        default=False,
        description="Whether a local store is shared by a team: objects and directories it creates are "
        "then readable by the group (files 0640, directories 2770) instead of by their owner only "
        "(0600, 0700). Set it the same for every process that writes to the store.",
    )
    issues_dir: Path | None = Field(
        default=None,
        description="Where Markdown issues are written (set it when the store is not a directory). "
        "Default: `<store>/issues`.",
    )
    quarantine_file: Path | None = Field(
        default=None,
        description="The quarantine list (JSON; set it when the store is not a directory). "
        "Default: `<store>/quarantine.json`.",
    )
    sandbox: Literal["auto", "bwrap", "process"] = Field(
        default="auto",
        description="Replay isolation: `bwrap` (bubblewrap namespaces: no network, the original "
        "workspace hidden), `process` (a plain subprocess in a fresh directory), or `auto` "
        "(bwrap when installed, else `process` with a warning at every triage).",
    )
    replay_timeout_s: float = Field(
        default=DEFAULT_REPLAY_TIMEOUT_S,
        gt=0,
        description="Wall-clock limit of one replay in seconds, when the capture recorded none (a "
        "capture records 10× its run time, at least 60 s) and `triage --timeout` is not given.",
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
        description="Files larger than this (MB) are left out of source snapshots and untracked files "
        "(listed as skipped).",
    )
    snapshot_max_total_mb: float = Field(
        default=200.0, gt=0, description="Cap on the total size of a source snapshot (MB)."
    )
    notify_url: str | None = Field(
        default=None,
        description="The service's events endpoint (`https://host/v1/events`); when set, the pytest "
        "plugin sends each capture there, and `flaketriage notify` sends there without `--to`.",
    )
    webhook_secret: SecretStr | None = Field(
        default=None, description="Shared secret for the HMAC signature of sent events."
    )
    outbox_dir: Path | None = Field(
        default=None,
        description="Events that could not be sent wait here for the next run (set it when the store "
        "is not a directory). Default: `<store>/outbox`.",
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
        default=DEFAULT_OUTPUT_TAIL_LINES,
        ge=1,
        description="Lines of a failure's stderr shown at the end of an issue.",
    )
    # -- the service ----------------------------------------------------------------------------
    database_url: str | None = Field(
        default=None,
        description="The service's records: `sqlite:///path.db` or `postgresql://user@host:5432/db`. "
        "Default: `sqlite:///<store>/service.db`.",
    )
    broker_url: str | None = Field(
        default=None,
        description="The Celery broker: `redis://host:6379/0`. Default: a durable local broker in "
        "`<store>/broker.db` (SQLite, for one machine).",
    )
    allowed_stores: list[str] | None = Field(
        default=None,
        description="Stores the service may read bundles from, as a JSON list of URLs; an event naming "
        "any other is refused with 422. Default: `[FLAKETRIAGE_STORE]`.",
    )
    github_webhook_secret: SecretStr | None = Field(
        default=None,
        description="The secret of the GitHub webhook (`X-Hub-Signature-256`); unset: GitHub "
        "deliveries are refused.",
    )
    sentry_client_secret: SecretStr | None = Field(
        default=None,
        description="The Sentry integration's client secret (`Sentry-Hook-Signature`); unset: Sentry "
        "hooks are refused.",
    )
    api_token: SecretStr | None = Field(
        default=None,
        description="When set, the service's reads (`/v1/cases`, `/v1/quarantine`) need "
        "`Authorization: Bearer <token>`, and the CI side sends it.",
    )
    max_body_kb: int = Field(
        default=1024, ge=1, description="Largest request body the service accepts (larger: 413)."
    )
    retriage_after_h: float = Field(
        default=168.0,
        gt=0,
        description="A known failure is triaged again when its last triage is older than this.",
    )
    storm_window_s: float = Field(
        default=3600.0,
        ge=0,
        description="Failures of one cause (same exception and message, any test) reported within "
        "this long of a triage share it instead of starting their own.",
    )
    replay_batch: int = Field(
        default=6,
        ge=1,
        description="Replays the service sends out at once for one triage (they run in parallel on "
        "the workers).",
    )
    sweep_after_s: float = Field(
        default=300.0,
        gt=0,
        description="Work recorded as sent but not started after this long is sent again (its "
        "message was lost).",
    )
    broker_visibility_timeout_s: float = Field(
        default=3600.0,
        gt=0,
        description="With Redis: a task a worker took but never acknowledged (the worker died) is handed "
        "to another after this long. Steps hold their work by a lease, so a slow task handed out twice "
        "still runs once.",
    )
    rerun_every_s: float = Field(
        default=21600.0,
        gt=0,
        description="How often quarantined failures are replayed in isolation to see whether they are fixed.",
    )
    telemetry_every_s: float = Field(
        default=86400.0,
        gt=0,
        description="How often `not_reproduced` cases get a longer telemetry run.",
    )
    gc_every_s: float = Field(
        default=86400.0, gt=0, description="How often the service collects unreferenced store objects."
    )
    gc_older_than_days: float = Field(
        default=30.0,
        gt=0,
        description="The service's garbage collection drops bundles older than this that no open case "
        "or quarantine entry references.",
    )

    @field_validator("store", mode="before")
    @classmethod
    def _store_path(cls, value: object) -> object:
        return os.fspath(value) if isinstance(value, os.PathLike) else value  # a Path is a location too

    @field_validator("store")
    @classmethod
    def _store_location(cls, value: str) -> str:
        try:
            local_path(value)  # checks the scheme without importing (or needing) its backend
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return value.strip()

    def local_store(self) -> Path | None:
        """The store's directory (relative to the current directory when the setting is), or None
        when the store is not local (``memory://``, ``s3://``)."""
        return local_path(self.store)

    def resolved_issues_dir(self) -> Path:
        return self._beside_store(self.issues_dir, "issues", "issues_dir")

    def resolved_quarantine_file(self) -> Path:
        return self._beside_store(self.quarantine_file, "quarantine.json", "quarantine_file")

    def resolved_outbox_dir(self) -> Path:
        return self._beside_store(self.outbox_dir, "outbox", "outbox_dir")

    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return "sqlite:///" + str(self._beside_store(None, "service.db", "database_url").absolute())

    def resolved_broker_url(self) -> str:
        """The broker URL; the embedded default is ``sqla+sqlite:///<store>/broker.db``."""
        if self.broker_url:
            return self.broker_url
        return "sqla+sqlite:///" + str(self._beside_store(None, "broker.db", "broker_url").absolute())

    def resolved_allowed_stores(self) -> list[str]:
        return list(self.allowed_stores) if self.allowed_stores is not None else [self.store]

    def _beside_store(self, explicit: Path | None, name: str, field: str) -> Path:
        """`explicit`, else ``<store>/<name>``, which only a local store has."""
        if explicit is not None:
            return explicit
        root = self.local_store()
        if root is None:
            raise ConfigError(
                f"the store {self.store} is not a directory, so there is no <store>/{name}: "
                f"set {env_var(field)} to a local path"
            )
        return root / name


def env_var(field: str) -> str:
    """The environment variable of a setting: ``alpha`` → ``FLAKETRIAGE_ALPHA``."""
    return ENV_PREFIX + field.upper()


def load_settings(**overrides: Any) -> Settings:
    """The settings from the environment, with `overrides` (field names) on top.

    Raises `ConfigError`, one line for all bad values (``; ``-separated), each naming the variable
    (or the override's field), the value and what it accepts:
    ``FLAKETRIAGE_ALPHA=2 is not valid: must be less than 1 (a number in (0, 1))``.
    """
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        lines = [_problem(error, overrides) for error in exc.errors()]
        raise ConfigError("; ".join(dict.fromkeys(lines))) from None


def _problem(error: Any, overrides: dict[str, Any]) -> str:
    field = str(error["loc"][0]) if error["loc"] else ""
    info = Settings.model_fields.get(field)
    name = field if field in overrides else env_var(field)
    value = "***" if info is not None and _is_secret(info.annotation) else _shown(error.get("input"))
    accepts = _accepts(info) if info is not None else ""
    message = str(error["msg"])
    if error["type"] in ("value_error", "assertion_error"):
        reason = re.sub(r"^(Value|Assertion) error, ", "", message)
    elif error["type"].endswith("_parsing") or error["type"] in ("literal_error", "enum", "missing"):
        reason = f"must be {accepts}" if accepts else message
        accepts = ""
    else:
        reason = re.sub(r"^Input should ", "must ", message)
    return f"{name}={value} is not valid: {reason}" + (f" ({accepts})" if accepts else "")


def _shown(value: object) -> str:
    text = str(value)
    if len(text) > 100:  # shown by its ends, so the message stays one readable line
        return repr(f"{text[:60]}…{text[-20:]}") + f" ({len(text)} characters)"
    return text if text and text.strip() == text and " " not in text else repr(text)


def _is_secret(annotation: object) -> bool:
    return annotation is SecretStr or SecretStr in get_args(annotation)


def _accepts(info: FieldInfo) -> str:
    """What a setting accepts, in words, from its type and bounds: ``an integer >= 1``,
    ``a number in (0, 1)``, ``one of auto, bwrap, process``."""
    annotation = info.annotation
    optional = get_origin(annotation) in (Union, types.UnionType) and type(None) in get_args(annotation)
    if optional:
        annotation = next(a for a in get_args(annotation) if a is not type(None))
    if get_origin(annotation) is Literal:
        return "one of " + ", ".join(str(a) for a in get_args(annotation))
    kinds: dict[object, str] = {int: "an integer", float: "a number", bool: "true or false", Path: "a path"}
    kind = kinds.get(annotation, "")
    if not kind:
        return ""
    low = high = None
    for meta in info.metadata:
        if isinstance(meta, annotated_types.Gt | annotated_types.Ge):
            low = ("(" if isinstance(meta, annotated_types.Gt) else "[", _number(meta))
        elif isinstance(meta, annotated_types.Lt | annotated_types.Le):
            high = (")" if isinstance(meta, annotated_types.Lt) else "]", _number(meta))
    if low and high:
        kind += f" in {low[0]}{low[1]}, {high[1]}{high[0]}"
    elif low:
        kind += (" > " if low[0] == "(" else " >= ") + low[1]
    elif high:
        kind += (" < " if high[0] == ")" else " <= ") + high[1]
    return kind


def _number(meta: object) -> str:
    for attr in ("gt", "ge", "lt", "le"):
        if hasattr(meta, attr):
            return f"{getattr(meta, attr):g}"
    return "?"


_DEFAULT_IN_TEXT = re.compile(r"\s*Default: (`[^`]+`)\.?$")


def settings_table() -> str:
    """The README's settings table (Markdown): variable, default and meaning of every setting,
    straight from the model's fields and their descriptions."""
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    for field, info in Settings.model_fields.items():
        meaning = " ".join((info.description or "").split())
        default = _default_text(info)
        derived = _DEFAULT_IN_TEXT.search(meaning)
        if derived is not None and info.default is None:
            default, meaning = derived.group(1), meaning[: derived.start()]
        meaning = meaning.replace("|", "\\|")
        rows.append(f"| `{env_var(field)}` | {default} | {meaning} |")
    return "\n".join(rows) + "\n"


def _default_text(info: FieldInfo) -> str:
    default = info.default
    if default is None or default is PydanticUndefined:
        return "none"
    if isinstance(default, float) and default.is_integer():
        default = int(default)
    return f"`{default}`"
