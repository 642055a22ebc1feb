"""The connection to GitHub: credentials (a token, or a GitHub App's installation token), PyGithub
with its retries, and every GitHub failure translated into one `IssueTrackerError`.

Issues go to `GitHubConfig.repo`; check runs go to the repository each CI run came from, any one
the same credentials reach (`GitHubClient.repository`).

PyGithub (``pip install 'flaketriage[github]'``) is imported when a client first connects, never
at import. Secondary rate limits (403 or 429 with ``retry-after``) and 5xx answers are retried by
`github.GithubRetry`, waiting what GitHub asks; a primary rate limit that would need a longer wait
than `GitHubConfig.max_rate_limit_wait_s` fails instead of stalling a worker for an hour.
"""

from __future__ import annotations

import inspect
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from flaketriage.dependencies import require
from flaketriage.errors import ConfigError, IssueTrackerError
from flaketriage.settings import Settings

if TYPE_CHECKING:
    from github import Github
    from github.Repository import Repository

_EXTRA = "github"
_NEEDED_FOR = "reporting to GitHub issues"
MAX_OPEN_REPOS = 256
"""Repositories a client keeps open for check runs (one ``GET /repos/...`` each, then reused)."""

Access = Literal["issues", "checks"]
"""What a call needs the credentials to write: a 403 names that permission."""


@dataclass(frozen=True)
class GitHubConfig:
    """Where issues go and how to sign in; `from_settings` reads the ``FLAKETRIAGE_GITHUB_*`` settings."""

    repo: str
    api_url: str = "https://api.github.com"
    token: str | None = None
    app_id: str | None = None
    app_private_key: str | None = None
    """PEM text (the settings may name a file instead; `from_settings` reads it)."""
    app_installation_id: int | None = None
    retries: int = 6
    backoff_factor: float = 0.5
    """Seconds before the second retry of a 5xx, doubling after (the first is immediate)."""
    secondary_rate_wait_s: float = 60.0
    max_rate_limit_wait_s: float = 300.0
    timeout_s: int = 30
    throttle: bool = True
    """PyGithub's pauses between requests (0.25 s) and writes (1 s), which keep a busy reporter
    under GitHub's secondary rate limits; tests against a stand-in turn them off."""

    @classmethod
    def from_settings(cls, settings: Settings) -> GitHubConfig | None:
        """The configuration, or None when no repository is set (issues stay Markdown files).

        A repository without credentials, or half an App (an id without a key), is a `ConfigError`.
        With both a token and an App, the App is used.
        """
        if settings.github_repo is None:
            return None
        app_id = (settings.github_app_id or "").strip() or None
        key = settings.github_app_private_key.get_secret_value() if settings.github_app_private_key else None
        token = settings.github_token.get_secret_value().strip() if settings.github_token else None
        if (app_id is None) != (key is None):
            have, missing = (
                ("FLAKETRIAGE_GITHUB_APP_ID", "FLAKETRIAGE_GITHUB_APP_PRIVATE_KEY")
                if key is None
                else ("FLAKETRIAGE_GITHUB_APP_PRIVATE_KEY", "FLAKETRIAGE_GITHUB_APP_ID")
            )
            raise ConfigError(f"{have} is set but {missing} is not: a GitHub App needs both")
        if app_id is None and not token:
            raise ConfigError(
                f"FLAKETRIAGE_GITHUB_REPO={settings.github_repo} is set but there are no GitHub "
                "credentials: set FLAKETRIAGE_GITHUB_TOKEN, or FLAKETRIAGE_GITHUB_APP_ID and "
                "FLAKETRIAGE_GITHUB_APP_PRIVATE_KEY (or unset FLAKETRIAGE_GITHUB_REPO to write "
                "Markdown issues)"
            )
        return cls(
            repo=settings.github_repo,
            api_url=settings.github_api_url,
            token=None if app_id else token,
            app_id=app_id,
            app_private_key=_private_key(key) if key is not None else None,
            app_installation_id=settings.github_app_installation_id,
        )

    @property
    def owner(self) -> str:
        return self.repo.partition("/")[0]

    @property
    def name(self) -> str:
        return self.repo.partition("/")[2]


def _private_key(value: str) -> str:
    """The PEM text of `value`: the text itself, or the file it names."""
    if value.lstrip().startswith("-----BEGIN"):
        return value.strip() + "\n"
    path = Path(value.strip()).expanduser()
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"FLAKETRIAGE_GITHUB_APP_PRIVATE_KEY is neither PEM text (-----BEGIN ...) nor a readable "
            f"file ({path}: {getattr(exc, 'strerror', None) or exc}); give the key's text or its path"
        ) from exc
    if "-----BEGIN" not in text:
        raise ConfigError(
            f"FLAKETRIAGE_GITHUB_APP_PRIVATE_KEY names {path}, which holds no PEM key; download the "
            "App's private key (.pem) from its settings page"
        )
    return text


class GitHubClient:
    """PyGithub signed in for one repository; `calling` translates whatever goes wrong inside it.

    Connects on first use and is shared by the threads of one process (PyGithub's requester is).
    """

    def __init__(self, config: GitHubConfig) -> None:
        require("github", _EXTRA, _NEEDED_FOR)  # a missing PyGithub fails now, before any replay
        self.config = config
        self._github: Github | None = None
        self._repo: Repository | None = None
        self._repos: dict[str, Repository] = {}
        self._lock = threading.Lock()

    @property
    def github(self) -> Github:
        with self._lock:
            if self._github is None:
                self._github = self._connect()
            return self._github

    def repo(self) -> Repository:
        """The repository (``GET /repos/{owner}/{name}``, once): a wrong name or token fails here."""
        gh = self.github
        with self._lock:
            if self._repo is None:
                with self.calling(f"opening the repository {self.config.repo}"):
                    self._repo = gh.get_repo(self.config.repo)
                if not self._repo.has_issues:
                    raise IssueTrackerError(
                        f"issues are disabled on {self.config.repo}: enable Issues in the repository's "
                        "settings (General → Features), or unset FLAKETRIAGE_GITHUB_REPO to write "
                        "Markdown issues",
                        status=410,
                    )
            return self._repo

    def repository(self, full_name: str) -> Repository:
        """`full_name` (``owner/name``) through the same sign-in, for check runs: a token reaches
        what it was granted, a GitHub App's installation token every repository of the installation
        found for `GitHubConfig.repo`. Opened once (``GET /repos/{owner}/{name}``: a wrong name or a
        repository out of reach fails here, saying which) and kept; issues need not be enabled."""
        key = full_name.lower()  # GitHub's names are not case sensitive
        gh = self.github
        with self._lock:
            found = self._repos.get(key)
        if found is not None:
            return found
        with self.calling(f"opening the repository {full_name}", repo=full_name, access="checks"):
            opened = gh.get_repo(full_name)
        with self._lock:
            if len(self._repos) >= MAX_OPEN_REPOS:
                self._repos.pop(next(iter(self._repos)))  # the oldest: a service sees few at once
            return self._repos.setdefault(key, opened)

    def _retry(self) -> Any:
        github = require("github", _EXTRA, _NEEDED_FOR)
        c = self.config
        cap: dict[str, Any] = {}
        if "max_rate_limit_wait" in inspect.signature(github.GithubRetry.__init__).parameters:
            cap["max_rate_limit_wait"] = c.max_rate_limit_wait_s  # newer PyGithub; older ones wait it out
        return github.GithubRetry(
            total=c.retries,
            backoff_factor=c.backoff_factor,
            secondary_rate_wait=c.secondary_rate_wait_s,
            # PATCH (an edit sets fields: safe to repeat) and 429 (GitHub's other "slow down").
            allowed_methods={"GET", "POST", "PATCH", "PUT", "DELETE", "HEAD"},
            status_forcelist=[429, *range(500, 600)],
            raise_on_status=False,
            **cap,
        )

    def _connect(self) -> Github:
        github = require("github", _EXTRA, _NEEDED_FOR)
        c = self.config
        common: dict[str, Any] = {
            "base_url": c.api_url,
            "timeout": c.timeout_s,
            "retry": self._retry(),
        }
        pauses: dict[str, Any] = {}
        if not c.throttle:
            pauses = {"seconds_between_requests": 0, "seconds_between_writes": 0}
        if c.app_id is None:
            assert c.token is not None  # from_settings guarantees one or the other
            return github.Github(auth=github.Auth.Token(c.token), **common, **pauses)  # type: ignore[no-any-return]
        app_auth = github.Auth.AppAuth(c.app_id, c.app_private_key)
        installation = c.app_installation_id
        if installation is None:
            integration = github.GithubIntegration(auth=app_auth, **common, **pauses)
            with self.calling(f"looking up the GitHub App {c.app_id}'s installation on {c.repo}", app=True):
                installation = int(integration.get_repo_installation(c.owner, c.name).id)
        auth = app_auth.get_installation_auth(installation)
        client = github.Github(auth=auth, **common, **pauses)
        # The installation token is fetched now, so a refused JWT fails here with its own message.
        with self.calling(f"getting an installation token for the GitHub App {c.app_id}", app=True):
            auth.token  # noqa: B018
        return client  # type: ignore[no-any-return]

    @contextmanager
    def calling(
        self, doing: str, *, app: bool = False, repo: str | None = None, access: Access = "issues"
    ) -> Iterator[None]:
        """Run GitHub calls; any failure becomes an `IssueTrackerError` saying what `doing` needed.

        `repo` is the repository the calls are about (default `GitHubConfig.repo`) and `access` what
        they write there, so a 403 or 404 names the right repository and permission."""
        github = require("github", _EXTRA, _NEEDED_FOR)
        requests = require("requests", _EXTRA, _NEEDED_FOR)
        try:
            yield
        except github.GithubException as exc:
            raise translate(
                exc.status, exc.data, exc.headers, doing, self.config, app=app, repo=repo, access=access
            ) from exc
        except requests.exceptions.RetryError as exc:
            raise IssueTrackerError(
                f"GitHub kept failing while {doing} ({_reason(exc)}), also after {self.config.retries} "
                f"retries; GitHub (or {self.config.api_url}) is probably having an outage or holding "
                "back this client: try again later",
                status=_status_in(exc),
            ) from exc
        except (requests.exceptions.RequestException, OSError) as exc:
            raise IssueTrackerError(
                f"cannot reach GitHub at {self.config.api_url} while {doing} ({_reason(exc)}); check "
                "FLAKETRIAGE_GITHUB_API_URL and the network (a proxy, a firewall)"
            ) from exc


def translate(
    status: int | None,
    data: Any,
    headers: Any,
    doing: str,
    config: GitHubConfig,
    *,
    app: bool = False,
    repo: str | None = None,
    access: Access = "issues",
) -> IssueTrackerError:
    """GitHub's answer `status`/`data` to the request behind `doing`, as one error saying what to check.

    `repo` is the repository the request was about (default `config.repo`), `access` what it writes.
    """
    data = data if isinstance(data, dict) else {"message": str(data or "")}
    said = str(data.get("message") or "").strip()
    answer = f"{status} {said!r}" if said else str(status)
    repo, api = repo or config.repo, config.api_url
    headers = {str(k).lower(): str(v) for k, v in dict(headers or {}).items()}
    if status == 401:
        who = (
            f"the GitHub App {config.app_id}'s JWT: check FLAKETRIAGE_GITHUB_APP_ID and that "
            "FLAKETRIAGE_GITHUB_APP_PRIVATE_KEY is that App's current private key (and the clock)"
            if app or config.app_id
            else "the token: FLAKETRIAGE_GITHUB_TOKEN is wrong, expired or revoked; create a new one"
        )
        message = f"GitHub refused the credentials ({answer}) while {doing} at {api}; check {who}"
    elif status in (403, 429) and (_rate_limited(said) or headers.get("x-ratelimit-remaining") == "0"):
        reset = headers.get("x-ratelimit-reset")
        when = f" (the limit resets at unix time {reset})" if reset else ""
        message = (
            f"GitHub's rate limit stopped {doing} ({answer}){when}, after waiting as long as allowed; "
            "try again later, or give flaketriage its own token or App so it has its own limit"
        )
    elif status == 403 and access == "checks":
        message = (
            f"GitHub forbade {doing} ({answer}): the credentials cannot write check runs on {repo}. "
            "Check runs need the Checks: write permission, which only a GitHub App's token carries: "
            "give the App Checks: write (read and write) and accept the new permission on its "
            "installation, or in GitHub Actions grant GITHUB_TOKEN `permissions: checks: write` (a "
            "pull request from a fork gets a read-only token). Personal access tokens and OAuth "
            "tokens cannot create check runs"
        )
    elif status == 403:
        message = (
            f"GitHub forbade {doing} ({answer}): the credentials cannot write issues on {repo}. A "
            "fine-grained token needs Issues read/write and Metadata read on it, a classic token the "
            "`repo` scope (`public_repo` for a public repository), and a GitHub App the Issues "
            "permission and an installation on it"
        )
    elif status == 404:
        if app:
            what = (
                f"no installation of the GitHub App {config.app_id} on {repo}: install the App on the "
                "repository (or set FLAKETRIAGE_GITHUB_APP_INSTALLATION_ID)"
            )
        elif access == "checks":
            reach = (
                f"the App's installation on {config.repo} must include it"
                if config.app_id
                else "the token must have access to it"
            )
            what = (
                f"the repository {repo} does not exist at {api}, or the credentials cannot see it ({reach})"
            )
        else:
            what = (
                f"the repository {repo} does not exist at {api}, or the credentials cannot see it (a "
                "private repository needs a token or App with access to it); check "
                "FLAKETRIAGE_GITHUB_REPO (owner/name) and FLAKETRIAGE_GITHUB_API_URL"
            )
        message = f"GitHub found nothing while {doing} ({answer}): {what}"
    elif status == 410:
        message = (
            f"issues are disabled on {repo} ({answer} while {doing}): enable Issues in the "
            "repository's settings (General → Features), or unset FLAKETRIAGE_GITHUB_REPO to write "
            "Markdown issues"
        )
    elif status == 422:
        errors = "; ".join(_validation(e) for e in data.get("errors") or [])
        cause = (
            f"the commit must be one of {repo}'s (a pull request's head commit is, forks included)"
            if access == "checks"
            else f"a repository rule on {repo} may forbid it"
        )
        message = (
            f"GitHub refused {doing} as invalid ({answer}{': ' + errors if errors else ''}); {cause}, "
            "or this is a flaketriage bug: report it with this message"
        )
    elif status is not None and status >= 500:
        message = (
            f"GitHub failed while {doing} ({answer}), also after retries; it is probably having an "
            "outage: try again later"
        )
    else:
        message = f"GitHub answered {answer} while {doing} on {repo} at {api}; check the settings and retry"
    return IssueTrackerError(message, status=status)


def _rate_limited(message: str) -> bool:
    return "rate limit" in message.lower()


def _validation(error: Any) -> str:
    if not isinstance(error, dict):
        return str(error)
    parts = [str(error[k]) for k in ("resource", "field", "code") if error.get(k)]
    text = " ".join(parts)
    return f"{text} ({error['message']})" if error.get("message") else text


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    # urllib3 repeats the whole URL and pool in its messages: keep the cause.
    match = re.search(r"\(Caused by (\w+\(.*?)\)?\)?$", text)
    text = match.group(1) if match else text
    return text if len(text) <= 300 else text[:297] + "..."


def _status_in(exc: BaseException) -> int | None:
    match = re.search(r"too many (\d{3}) error", str(exc))
    return int(match.group(1)) if match else None
