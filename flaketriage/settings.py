"""Settings: one pydantic-settings model, read from ``FLAKETRIAGE_*`` environment variables.

Nothing reads them at import time: an entry point (the CLI, the pytest plugin, a guard) calls
`load_settings` once and passes the result down. A bad value is a `ConfigError` that names the
variable and what it accepts. The settings reference (``docs/reference/settings.md``) is generated
from the fields' descriptions by `flaketriage.cli.reference`.
"""

from __future__ import annotations

import os
import re
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin
from urllib.parse import urlsplit

import annotated_types
from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, SettingsConfigDict

from flaketriage.errors import ConfigError
from flaketriage.store.registry import local_path
from flaketriage.variant import KEY_PATTERN

ENV_PREFIX = "FLAKETRIAGE_"
DEFAULT_REPLAY_TIMEOUT_S = 600.0
"""The default of `Settings.replay_timeout_s`, and of the library calls it is passed down to."""
DEFAULT_OUTPUT_TAIL_LINES = 200
"""The default of `Settings.output_tail_lines`, and of the library calls it is passed down to."""
_GITHUB_LOGIN = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9]|-(?=[A-Za-z0-9])){0,38}")
"""A GitHub user or organization name: letters, digits and single inner hyphens, 39 at most."""


class Settings(BaseSettings):
    """Every flaketriage setting. Each is documented once, here; the settings reference is built from it."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    store: str = Field(
        default=".flaketriage",
        description="Where bundles live: a directory (created on first use), `file:///absolute/path`, "
        "`memory://NAME` (one store per name, shared within a process) or `s3://bucket/prefix` "
        "(`pip install 'flaketriage[s3]'`).",
    )
    store_shared: bool = Field(
        default=False,
        description="Whether a local store is shared by a team: objects and directories it creates are "
        "then readable by the group (files 0640, directories 2770) instead of by their owner only "
        "(0600, 0700). Set it the same for every process that writes to the store.",
    )
    s3_endpoint_url: str | None = Field(
        default=None,
        description="The endpoint of an S3-compatible server for `s3://` stores (MinIO, Ceph, R2: "
        "`https://minio.internal:9000`); unset: AWS S3. Credentials and region come from boto3's "
        "usual chain (`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`, `AWS_PROFILE`, an instance role).",
    )
    s3_presign_expiry_s: int = Field(
        default=3600,
        ge=1,
        le=604800,
        description="How long a presigned download link to an object in an `s3://` store stays valid "
        "(at most 7 days, S3's limit).",
    )
    issues_dir: Path | None = Field(
        default=None,
        description="Where Markdown issues are written. A store that is not a directory (`s3://`) has "
        "none: the service needs it set; `flaketriage triage` and `telemetry` write under the working "
        "directory's `.flaketriage/issues` and say so in a `note:` line. Default: `<store>/issues`.",
    )
    quarantine_file: Path | None = Field(
        default=None,
        description="The quarantine list (JSON). For a store that is not a directory, as above: "
        "`.flaketriage/quarantine.json` under the working directory for `triage` and `telemetry`. "
        "Default: `<store>/quarantine.json`.",
    )
    quarantine_order_dependent: bool = Field(
        default=True,
        description="Whether an order-dependent test is quarantined (its entry naming its polluters, "
        "linked to its issue) so that it stops failing builds until it is fixed; off: it only gets the "
        "issue and keeps failing builds.",
    )
    quarantine_variant_keys: str = Field(
        default="gpu",
        description="Which parts of the variant a failure was captured on (`os`, `python`, `gpu`, and "
        "the keys of the runner's `FLAKETRIAGE_VARIANT`), comma-separated, its quarantine entry is "
        "limited to: with `gpu`, a test quarantined for flaking on one GPU model still fails builds "
        "on other models and on CPU runners. Empty: an entry covers every variant.",
    )
    quarantine_match_signature: bool = Field(
        default=False,
        description="Whether a quarantine entry forgives only the failure it was made for (its "
        "fingerprint), so that a new way for a quarantined test to fail is reported. Off by default: "
        "a flaky test's messages often vary from run to run (a timing, a tensor's values), and each "
        "variation would then fail the build until it was triaged too.",
    )
    sandbox: Literal["auto", "bwrap", "process", "docker"] = Field(
        default="auto",
        description="Replay isolation: `bwrap` (bubblewrap namespaces: no network, the original "
        "workspace hidden), `process` (a plain subprocess in a fresh directory, without network where "
        "it may make a network namespace), `docker` (a container of the bundle's environment image "
        "per replay: `pip install 'flaketriage[docker]'`), or `auto` (bwrap when installed, else "
        "`process` with a warning at every triage).",
    )
    environment: Literal["auto", "bundle", "worker"] = Field(
        default="auto",
        description="Which Python environment replays run in: `bundle` (the bundle's Python version "
        "and package freeze, built once per environment key and cached), `worker` (the worker's own "
        "interpreter and packages), or `auto` (`bundle` when the bundle recorded a freeze that differs "
        "from the worker's in the Python version or any pin, else `worker`).",
    )
    environment_cache_dir: Path | None = Field(
        default=None,
        description="Where built replay environments are cached, one virtualenv per environment key. "
        "Default: `$XDG_CACHE_HOME/flaketriage/environments` (`~/.cache/...` without it).",
    )
    environment_cache_max_mb: int = Field(
        default=20480,
        ge=1,
        description="Size bound of the environment cache (MiB): after a build, the least recently used "
        "environments not in use are removed until the cache fits.",
    )
    environment_build_timeout_s: float = Field(
        default=1800.0,
        gt=0,
        description="Wall-clock limit for building one environment (creating it and installing its "
        "packages); a build that passes it is an `environment` outcome.",
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
        description="Memory limit of one replay in MiB (none by default): a cgroup (the run is "
        "killed past it, a `sandbox` outcome) or the container's limit; an address-space limit only "
        "where no cgroup can be made.",
    )
    replay_pids_limit: int | None = Field(
        default=4096,
        gt=0,
        description="Most processes and threads one replay may have at once (a fork bomb stops "
        "there): a pids cgroup, or the container's limit.",
    )
    replay_cpus: float | None = Field(
        default=None,
        gt=0,
        description="CPUs one replay may use (`1.5`: one and a half cores' time), by a cpu cgroup or "
        "the container's limit (none by default).",
    )
    docker_url: str | None = Field(
        default=None,
        description="The Docker engine of the `docker` sandbox: `unix:///run/podman/podman.sock`, "
        "`tcp://host:2376`. Default: `DOCKER_HOST`, else the standard socket.",
    )
    docker_base_image: str = Field(
        default="python:{python}-slim",
        description="The image each environment image is built from; `{python}` becomes the "
        "bundle's Python version (`3.11`). The engine must have it or be able to pull it.",
    )
    docker_mounts: list[Path] = Field(
        default=[],
        description="Host directories every replay container sees read-only at the same path, as a "
        "JSON list: a toolchain shared by the images, or the host's Python for a base image without one.",
    )
    max_replays: int = Field(default=100, ge=1, description="Upper bound on replays for one verdict.")
    triage_budget_s: float | None = Field(
        default=None,
        gt=0,
        description="Most CPU plus GPU seconds the replays of one triage may use (a GPU second is a "
        "second of wall time on each GPU a replay is given); checked before each replay (in the service, "
        "before each batch), and a triage that runs out ends undecided with its evidence so far and "
        "reports nothing. Unset: no cap. `triage --budget` sets it for one triage.",
    )
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
    service_url: str | None = Field(
        default=None,
        description="The service's base URL (`https://host`), whose API `flaketriage cases` reads (with "
        "the API token when set); with neither it nor the events endpoint set, `cases` reads the "
        "embedded database. Default: the origin of FLAKETRIAGE_NOTIFY_URL (`https://host/v1/events` → "
        "`https://host`; a path before `/v1/events` is kept).",
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
        default=86400.0,
        ge=0,
        description="How old the pytest plugin's cached copy of the service's quarantine list may be "
        "(since the service last gave or confirmed it) to stand in when the service does not answer; "
        "an older copy is not used (0: never). While the service answers, every session uses its "
        "current list, asked conditionally (`If-None-Match`, answered 304 while unchanged).",
    )
    quarantine_fetch_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="How long the pytest plugin waits, in all, for the service's quarantine list "
        "before it falls back to its cached copy (or to no list).",
    )
    output_tail_lines: int = Field(
        default=DEFAULT_OUTPUT_TAIL_LINES,
        ge=1,
        description="Lines of a failure's stderr shown at the end of an issue.",
    )
    # -- GitHub issues ----------------------------------------------------------------------------
    github_repo: str | None = Field(
        default=None,
        description="The repository issues are filed in, as `owner/name`. With credentials "
        "(a token or an App) `flaketriage triage` and the workers report there instead of writing "
        "Markdown files; without any, setting it is an error that says what to add.",
    )
    github_token: SecretStr | None = Field(
        default=None,
        description="A GitHub token for that repository: fine-grained with Issues "
        "read/write (and Metadata read), or classic with the `repo` scope (`public_repo` for a "
        "public repository).",
    )
    github_app_id: str | None = Field(
        default=None,
        description="A GitHub App's id (or client id), used instead of a token together with the App's "
        "private key: flaketriage signs a JWT with the key and trades it for an installation token, "
        "renewed before it expires.",
    )
    github_app_private_key: SecretStr | None = Field(
        default=None,
        description="The GitHub App's private key: the PEM text itself, or the path of the `.pem` file.",
    )
    github_app_installation_id: int | None = Field(
        default=None,
        gt=0,
        description="The App's installation on the repository's account. Default: looked up from "
        "the repository.",
    )
    github_api_url: str = Field(
        default="https://api.github.com",
        description="The GitHub REST API: `https://HOST/api/v3` for GitHub Enterprise Server, or a "
        "stand-in's URL.",
    )
    github_comment_interval_s: float = Field(
        default=600.0,
        ge=0,
        description="At most one flaketriage comment per issue in this long: newer evidence within it "
        "is added to the last comment (edited) instead of posting another.",
    )
    # -- the service ----------------------------------------------------------------------------
    database_url: str | None = Field(
        default=None,
        description="The service's records: `sqlite:///path.db` or `postgresql://user@host:5432/db`. "
        "Default: `sqlite:///<store>/service.db`.",
    )
    database_wait_s: float = Field(
        default=60.0,
        ge=0,
        description="How long `serve` and `worker` wait at start for a database that does not answer "
        "yet (a restart, a database started beside them), trying again every few seconds, before they "
        "give up with an error.",
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
        description="When set, the service's reads (`/v1/cases`, `/v1/runners`, `/v1/quarantine`) need "
        "`Authorization: Bearer <token>`, and the CI side sends it. `/readyz` says what is down (hosts, "
        "users, addresses) only to a request with it; to others, `unavailable`.",
    )
    max_body_kb: int = Field(
        default=1024, ge=1, description="Largest request body the service accepts (larger: 413)."
    )
    max_bundles_per_delivery: int = Field(
        default=50,
        ge=1,
        description="Most bundles one GitHub or Sentry delivery may have triaged (bundle lines of a "
        "check run or an issue, `/flaketriage triage` commands): the first this many different ids "
        "are read, the others left out and counted in the answer's notes.",
    )
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="A connection whose request headers are not complete this long after it opened "
        "(or after its previous answer) is answered 408 and closed: a client sending them a byte at a "
        "time holds nothing for long.",
    )
    body_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="A request body not received whole within this long of its headers is answered "
        "408 and its connection closed.",
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
    telemetry_interval_s: float = Field(
        default=1.0,
        gt=0,
        description="How often a telemetry run samples the host (CPU, load, memory) and the GPUs "
        "(NVML: utilization, memory, temperature, power, clocks, ECC and XID errors).",
    )
    telemetry_replays_factor: float = Field(
        default=3.0,
        ge=1,
        description="A telemetry run looks for flakes this many times rarer than triage does (the "
        "minimum flaky rate divided by it: 179 clean replays before `not_reproduced` instead of 59 at "
        "3), and may spend this many times the replays.",
    )
    telemetry_timeout_factor: float = Field(
        default=2.0,
        ge=1,
        description="A telemetry run's time limit per replay, as a multiple of the usual one (the "
        "capture's, else the replay timeout).",
    )
    runner_host: str | None = Field(
        default=None,
        description="The host part of this worker's runner id (the id is the host plus a digest of "
        "its GPUs' UUIDs), when the host name is not the machine's: a Kubernetes pod sets it to its "
        "node's name. Default: the host name.",
    )
    runner_suspect_after: int = Field(
        default=3,
        ge=1,
        description="A runner counted in this many `environment_specific` verdicts (the failure "
        "reproduced on it and not on other hardware) is flagged as suspect (`GET /v1/runners`, "
        "`flaketriage_runner_suspect`), to be drained and checked.",
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
    repository: str | None = Field(
        default=None,
        description="The repository (OWNER/NAME) CI results are recorded under. Default: the CI "
        "provider's (GITHUB_REPOSITORY, CI_PROJECT_PATH ...), else git's origin.",
    )
    send_results: bool = Field(
        default=True,
        description="The pytest plugin sends every test's outcome (duration, rerun attempts) to the "
        "service's CI history at the end of the session, when FLAKETRIAGE_NOTIFY_URL (or "
        "FLAKETRIAGE_SERVICE_URL) and FLAKETRIAGE_WEBHOOK_SECRET are set.",
    )
    max_results_mb: int = Field(
        default=64,
        ge=1,
        description="Largest results upload (`POST /v1/results`) the service accepts, and largest "
        "JUnit XML file `flaketriage results upload` reads (larger: refused, nothing recorded).",
    )
    storm_share: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="A CI run in which more than this share of its tests failed is recorded as one "
        "storm (an outage), not as flakiness of each test: its failures open no cases and leave the "
        "tests' totals alone.",
    )
    storm_min_tests: int = Field(
        default=20, ge=1, description="Runs of fewer tests than this are never storms."
    )
    flip_threshold: float = Field(
        default=0.3,
        gt=0,
        le=1,
        description="A test whose outcome changes between pass and fail in more than this share of "
        "its last 50 results (given enough of them) is suspected flaky.",
    )
    flip_min_runs: int = Field(
        default=10, ge=2, description="Results a test needs before its flip rate can make it suspect."
    )
    resolve_branches: list[str] = Field(
        default=["main", "master"],
        description="Branches on which a test that passes again resolves its deterministic case, "
        "once the sequential test says its failure no longer reproduces (the quarantine lift's test; "
        "never because time passed).",
    )
    results_keep_days: float = Field(
        default=90.0,
        gt=0,
        description="Test results older than this are rolled up into daily totals per test.",
    )
    failure_days_every_s: float = Field(
        default=300.0,
        gt=0,
        description="How often beat rolls up the failures of the last 30 complete days by verdict for "
        "the dashboard's overview chart (a case decided since shows its earlier days under its new "
        "verdict from the next roll-up; today is always counted live).",
    )
    checks_dir: Path | None = Field(
        default=None,
        description="Where pull request check runs are written as Markdown files when GitHub is not "
        "configured. Default: `checks/` beside the store.",
    )
    # -- the dashboard --------------------------------------------------------------------------
    dashboard_read: Literal["anonymous", "login"] = Field(
        default="anonymous",
        description="Who may read the dashboard's pages: `anonymous` (anyone who reaches the service, "
        "or only those of FLAKETRIAGE_DASHBOARD_TRUSTED_NETWORKS when set) or `login` (signed-in "
        "people only; others are sent to the sign-in page). Acting (re-triage, quarantine, lift) "
        "always needs a signed-in person.",
    )
    dashboard_trusted_networks: list[str] = Field(
        default=[],
        description="The networks anonymous readers may read the dashboard from, as a JSON list of "
        'CIDR blocks (`["10.0.0.0/8", "2001:db8::/32"]`); a reader elsewhere is sent to the sign-in '
        "page. Empty: any network. The address is the connection's, or the one a proxy forwards "
        "(`X-Forwarded-For`) when the proxy's address is in uvicorn's `FORWARDED_ALLOW_IPS` "
        "(default `127.0.0.1`).",
    )
    dashboard_token: SecretStr | None = Field(
        default=None,
        description="The token people sign in to the dashboard with. Unset: FLAKETRIAGE_API_TOKEN "
        "signs in instead (CI jobs hold that one: give people a token of their own when CI jobs must "
        "not act). Neither set and no GitHub login: nobody can sign in, and the dashboard is read-only.",
    )
    dashboard_secret: SecretStr | None = Field(
        default=None,
        description="The key the dashboard's cookies (sessions, form tokens) are signed with (HMAC-"
        "SHA256); at least 32 characters, the same for every process that serves the dashboard. "
        "Unset: a random key of each process, with a warning in the log: sessions end when it "
        "restarts and are not shared by other processes.",
    )
    dashboard_session_h: float = Field(
        default=12.0,
        gt=0,
        le=720,
        description="How long a dashboard session lasts after signing in (hours).",
    )
    dashboard_quarantine_max_days: int = Field(
        default=90,
        ge=1,
        le=3650,
        description="The furthest expiry of a quarantine made by hand on the dashboard (days ahead).",
    )
    github_oauth_client_id: str | None = Field(
        default=None,
        description="The client id of a GitHub OAuth App people sign in to the dashboard with (its "
        "callback URL: `<service>/dashboard/login/github/callback`). Needs the client secret, and "
        "FLAKETRIAGE_DASHBOARD_GITHUB_USERS or FLAKETRIAGE_DASHBOARD_GITHUB_ORG to say who may.",
    )
    github_oauth_client_secret: SecretStr | None = Field(
        default=None, description="The GitHub OAuth App's client secret."
    )
    github_oauth_url: str = Field(
        default="https://github.com",
        description="Where GitHub's OAuth web flow is (`/login/oauth/authorize`, "
        "`/login/oauth/access_token`): `https://HOST` for GitHub Enterprise Server, or a stand-in's "
        "URL. The signed-in user is read from FLAKETRIAGE_GITHUB_API_URL.",
    )
    dashboard_github_users: list[str] = Field(
        default=[],
        description="GitHub logins that may sign in to the dashboard, as a JSON list "
        '(`["octocat", "hubot"]`, any case).',
    )
    dashboard_github_org: str | None = Field(
        default=None,
        description="A GitHub organization (`acme`) or team (`acme/ml-infra`) whose active members may "
        "sign in to the dashboard too (asked with the `read:org` scope).",
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

    @field_validator("quarantine_variant_keys")
    @classmethod
    def _variant_keys(cls, value: str) -> str:
        keys = [k.strip() for k in value.split(",") if k.strip()]
        bad = [k for k in keys if not KEY_PATTERN.fullmatch(k)]
        if bad:
            raise ValueError(
                f"{bad[0]!r} is not a variant key: comma-separated keys such as gpu,os,python "
                "(lowercase letters, digits, '_', '.', '-')"
            )
        return ",".join(sorted(dict.fromkeys(keys)))

    @field_validator("github_repo")
    @classmethod
    def _github_repo(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        value = value.strip()
        shape = re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9-]*/[A-Za-z0-9._-]+", value)
        if shape is None or value.endswith((".", "/..")):
            raise ValueError("must be owner/name, as in https://github.com/owner/name (e.g. acme/models)")
        return value

    @field_validator("service_url")
    @classmethod
    def _service_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        value = value.strip().rstrip("/")
        if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", value):
            raise ValueError("must be the service's http(s) base URL, such as https://flaketriage.acme.dev")
        return value

    @field_validator("github_api_url")
    @classmethod
    def _github_api_url(cls, value: str) -> str:
        value = value.strip().rstrip("/")
        if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", value):
            raise ValueError(
                "must be an http(s) URL: https://api.github.com, or https://HOST/api/v3 for GitHub "
                "Enterprise Server"
            )
        return value

    @field_validator("dashboard_trusted_networks")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        import ipaddress

        out = []
        for text in value:
            try:
                out.append(str(ipaddress.ip_network(text.strip(), strict=False)))
            except ValueError:
                raise ValueError(
                    f"{text!r} is not a network: CIDR blocks such as 10.0.0.0/8 or 2001:db8::/32"
                ) from None
        return out

    @field_validator("dashboard_secret")
    @classmethod
    def _secret_length(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 32:
            raise ValueError(
                "must be at least 32 characters: make one with "
                "python -c 'import secrets; print(secrets.token_urlsafe(32))'"
            )
        return value

    @field_validator("github_oauth_url")
    @classmethod
    def _github_oauth_url(cls, value: str) -> str:
        value = value.strip().rstrip("/")
        if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", value):
            raise ValueError(
                "must be an http(s) URL: https://github.com, or https://HOST for GitHub Enterprise Server"
            )
        return value

    @field_validator("dashboard_github_users")
    @classmethod
    def _github_users(cls, value: list[str]) -> list[str]:
        logins = [v.strip() for v in value if v.strip()]
        bad = [v for v in logins if not _GITHUB_LOGIN.fullmatch(v)]
        if bad:
            raise ValueError(f"{bad[0]!r} is not a GitHub login (letters, digits and single hyphens)")
        return sorted({v.lower() for v in logins})

    @field_validator("dashboard_github_org")
    @classmethod
    def _github_org(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        value = value.strip()
        org, _, team = value.partition("/")
        if not _GITHUB_LOGIN.fullmatch(org) or (team and not re.fullmatch(r"[A-Za-z0-9_.-]{1,100}", team)):
            raise ValueError(
                "must be an organization (acme) or an organization and team slug (acme/ml-infra)"
            )
        return value

    def dashboard_tokens(self) -> list[str]:
        """The tokens that sign in to the dashboard: its own, else the API token; none: nobody signs
        in with a token."""
        token = self.dashboard_token or self.api_token
        return [token.get_secret_value()] if token is not None and token.get_secret_value() else []

    def github_login_ready(self) -> bool:
        """Whether the GitHub sign-in is set up: the OAuth App, and who may sign in."""
        return bool(
            self.github_oauth_client_id
            and self.github_oauth_client_secret
            and (self.dashboard_github_users or self.dashboard_github_org)
        )

    def local_store(self) -> Path | None:
        """The store's directory (relative to the current directory when the setting is), or None
        when the store is not local (``memory://``, ``s3://``)."""
        return local_path(self.store)

    def resolved_issues_dir(self) -> Path:
        return self._beside_store(self.issues_dir, "issues", "issues_dir")

    def resolved_checks_dir(self) -> Path:
        return self._beside_store(self.checks_dir, "checks", "checks_dir")

    def resolved_quarantine_file(self) -> Path:
        return self._beside_store(self.quarantine_file, "quarantine.json", "quarantine_file")

    def resolved_quarantine_variant_keys(self) -> tuple[str, ...]:
        return tuple(k for k in self.quarantine_variant_keys.split(",") if k)

    def resolved_outbox_dir(self) -> Path:
        return self._beside_store(self.outbox_dir, "outbox", "outbox_dir")

    def resolved_environment_cache_dir(self) -> Path:
        """The environment cache: the setting, else ``$XDG_CACHE_HOME/flaketriage/environments``."""
        if self.environment_cache_dir is not None:
            return self.environment_cache_dir
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return Path(base) / "flaketriage" / "environments"

    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return "sqlite:///" + str(self._beside_store(None, "service.db", "database_url").absolute())

    def resolved_broker_url(self) -> str:
        """The broker URL; the embedded default is ``sqla+sqlite:///<store>/broker.db``."""
        if self.broker_url:
            return self.broker_url
        return "sqla+sqlite:///" + str(self._beside_store(None, "broker.db", "broker_url").absolute())

    def resolved_service_url(self) -> str | None:
        """The service `flaketriage cases` reads: the setting, else the base of the events endpoint
        (``https://host/v1/events`` → ``https://host``: its origin, and a path prefix the service sits
        under); None when neither is set (the embedded database is read instead)."""
        if self.service_url:
            return self.service_url
        if not self.notify_url:
            return None
        parts = urlsplit(self.notify_url.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return None  # not a URL the CLI can read from; `notify` and `doctor` say what is wrong
        path = parts.path.rstrip("/")
        prefix = path.removesuffix("/v1/events") if path.endswith("/v1/events") else ""
        return f"{parts.scheme}://{parts.netloc}{prefix}"

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
