"""A GitHub REST API stand-in: a real HTTP server (a thread) that answers the calls flaketriage makes
the way GitHub documents them, and enforces what GitHub enforces.

Covered: ``GET /repos/{o}/{r}``; issues create/get/edit/list (labels, state, since, sort,
pagination with ``Link`` headers); comments create/list/get/edit; labels list/create; ``GET
/search/issues`` (``total_count``/``incomplete_results``/``items``, with an index that lags behind
new issues by `search_lag_s`); a GitHub App's ``GET /repos/{o}/{r}/installation`` and ``POST
/app/installations/{id}/access_tokens`` behind an RS256 JWT checked with the App's public key;
check runs: ``POST /repos/{o}/{r}/check-runs``, ``GET`` and ``PATCH .../check-runs/{id}``, ``GET
/repos/{o}/{r}/commits/{ref}/check-runs`` (``check_name``, ``status``, ``filter``, pagination).

Enforced: ``Authorization: token ...`` or ``Bearer ...`` on every call (401 ``Bad credentials``),
404 for repositories the credentials cannot see and for unknown issues, 410 when issues are
disabled, 403 for a read-only token's writes, 422 validation errors (a missing title, a body over
65,536 characters, a label that exists, a bad state), the ``x-ratelimit-*`` headers on every
answer, and scripted faults: secondary rate limits (403 with ``retry-after``, or 429), 5xx.
Bodies follow GitHub's documented examples (url, html_url, number, state, labels, user, dates).

Check runs follow GitHub's documentation (docs.github.com/rest/checks/runs): writes need the Checks
permission (403 ``You must authenticate via a GitHub App.`` for a token that is not an App's, 403
``Resource not accessible by integration`` for an App's token without Checks: write); 422 for a
missing ``name`` or ``head_sha``, a commit the repository lacks, a status GitHub reserves for Actions,
status ``completed`` (or a ``completed_at``) without a conclusion, ``stale``, an ``output`` without
title or summary, an ``output.summary`` or ``output.text`` over 65,535 characters, more than 50
annotations, a ``details_url`` that is not http(s); 404 for an unknown check run. A conclusion
completes the run, a status of queued or in_progress reopens it. Responses have the shape of the
documented example recorded in ``check_run_example.json`` (the "Get a check run" response).
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import jwt

DOCS = "https://docs.github.com/rest"
MAX_BODY = 65536
MAX_TITLE = 256
BOT = "flaketriage-bot"
MAX_CHECK_OUTPUT = 65535
MAX_ANNOTATIONS = 50
CHECK_STATUSES = ("queued", "in_progress", "completed")
ACTIONS_STATUSES = ("waiting", "requested", "pending")
"""Statuses GitHub reserves for GitHub Actions' own check runs."""
CHECK_CONCLUSIONS = ("action_required", "cancelled", "failure", "neutral", "success", "skipped", "timed_out")
"""What an App may conclude (``stale`` is GitHub's alone)."""
CHECK_RUN_EXAMPLE: dict[str, Any] = json.loads(
    (Path(__file__).with_name("check_run_example.json")).read_text(encoding="utf-8")
)
"""GitHub's documented check run (the example response of "Get a check run")."""


def _now() -> datetime:
    return datetime.now(UTC)


def _iso(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Token:
    """A credential: which repositories it sees (None: all) and whether it may write issues."""

    repos: set[str] | None = None
    write: bool = True
    expires_at: datetime | None = None
    checks: str | None = "write"
    """The Checks permission of an App's token (``write``, ``read``); None: not an App's token (a
    personal access token), which GitHub never lets write check runs."""


@dataclass
class App:
    app_id: str
    public_key: str
    installations: dict[int, set[str]] = field(default_factory=dict)
    """Installation id → the repositories it is installed on."""
    checks: str | None = "write"
    """The App's Checks permission, which its installation tokens carry."""


@dataclass
class Repo:
    full_name: str
    id: int
    has_issues: bool = True
    private: bool = True
    issues: dict[int, dict[str, Any]] = field(default_factory=dict)
    comments: dict[int, dict[str, Any]] = field(default_factory=dict)
    labels: dict[str, dict[str, Any]] = field(default_factory=dict)
    indexed_at: dict[int, datetime] = field(default_factory=dict)
    """When each issue became searchable (its creation plus the index lag)."""
    check_runs: dict[int, dict[str, Any]] = field(default_factory=dict)
    commits: set[str] | None = None
    """The commits check runs may name; None: any 40-hex SHA."""


@dataclass
class Fault:
    method: str
    path: re.Pattern[str]
    status: int
    body: dict[str, Any]
    headers: dict[str, str]
    times: int


@dataclass
class Call:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any
    status: int = 0


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, errors: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body: dict[str, Any] = {"message": message, "documentation_url": DOCS}
        if errors is not None:
            self.body["errors"] = errors
        self.body["status"] = str(status)


class GitHubStandIn:
    """The server and its state; `url` is the API base (``http://127.0.0.1:PORT/api/v3``)."""

    def __init__(self, prefix: str = "/api/v3") -> None:
        self.prefix = prefix
        self.lock = threading.RLock()
        self.repos: dict[str, Repo] = {}
        self.tokens: dict[str, Token] = {}
        self.apps: dict[str, App] = {}
        self.faults: list[Fault] = []
        self.calls: list[Call] = []
        self.search_lag_s = 0.0
        self._ids = iter(range(1000, 10**9))
        self._barriers: list[tuple[str, re.Pattern[str], threading.Barrier]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    # -- lifecycle ------------------------------------------------------------------------------
    @property
    def origin(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def url(self) -> str:
        return self.origin + self.prefix

    def start(self) -> GitHubStandIn:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- set-up ---------------------------------------------------------------------------------
    def add_repo(self, full_name: str, *, has_issues: bool = True) -> Repo:
        with self.lock:
            repo = Repo(full_name=full_name, id=next(self._ids), has_issues=has_issues)
            self.repos[full_name] = repo
            return repo

    def add_token(
        self, token: str, *, repos: set[str] | None = None, write: bool = True, checks: str | None = "write"
    ) -> None:
        """A token; `checks` is its Checks permission (``write``, ``read``: an App's token such as
        GitHub Actions' ``GITHUB_TOKEN``), None for a personal access token."""
        self.tokens[token] = Token(repos=repos, write=write, checks=checks)

    def add_app(
        self,
        app_id: str,
        public_key_pem: str,
        installations: dict[int, set[str]],
        *,
        checks: str | None = "write",
    ) -> None:
        self.apps[app_id] = App(app_id, public_key_pem, installations, checks=checks)

    def fail(
        self,
        method: str,
        path: str,
        status: int,
        *,
        times: int = 1,
        message: str = "Server Error",
        headers: dict[str, str] | None = None,
    ) -> None:
        """Answer the next `times` calls of `method` on a path matching `path` (a regex, prefix
        left out) with `status` instead."""
        body = {"message": message, "documentation_url": DOCS}
        self.faults.append(Fault(method, re.compile(path), status, body, dict(headers or {}), times))

    def secondary_rate_limit(
        self, method: str, path: str, *, times: int = 1, status: int = 403, retry_after: int = 1
    ) -> None:
        """GitHub's secondary rate limit, as documented: 403 (or 429) with ``retry-after``."""
        self.fail(
            method,
            path,
            status,
            times=times,
            message="You have exceeded a secondary rate limit. Please wait a few minutes before you try "
            "again. If you reach out to GitHub Support for help, please include the request ID "
            "ABCD:1234:5678.",
            headers={"retry-after": str(retry_after), "x-ratelimit-remaining": "4990"},
        )

    def hold(self, method: str, path: str, parties: int) -> None:
        """Hold calls of `method` on `path` until `parties` of them arrived (to make a race certain)."""
        self._barriers.append((method, re.compile(path), threading.Barrier(parties, timeout=20)))

    def unhold(self) -> None:
        self._barriers.clear()

    # -- reading the state ----------------------------------------------------------------------
    def issues(self, full_name: str = "acme/models") -> list[dict[str, Any]]:
        with self.lock:
            return [dict(i) for _, i in sorted(self.repos[full_name].issues.items())]

    def comments(self, number: int, full_name: str = "acme/models") -> list[dict[str, Any]]:
        with self.lock:
            repo = self.repos[full_name]
            return [dict(c) for _, c in sorted(repo.comments.items()) if c["_issue"] == number]

    def check_runs(self, full_name: str = "acme/models", head_sha: str | None = None) -> list[dict[str, Any]]:
        """The check runs of `full_name` (of the commit `head_sha`), oldest first."""
        with self.lock:
            runs = [copy.deepcopy(r) for _, r in sorted(self.repos[full_name].check_runs.items())]
        return [r for r in runs if head_sha is None or r["head_sha"] == head_sha]

    def delete_check_run(self, ident: int, full_name: str = "acme/models") -> None:
        """Make a check run gone (as when GitHub drops old runs past 1,000 of a name)."""
        with self.lock:
            del self.repos[full_name].check_runs[ident]

    def calls_to(self, method: str, path: str) -> list[Call]:
        return [c for c in self.calls if c.method == method and re.fullmatch(path, c.path)]

    # -- shapes ---------------------------------------------------------------------------------
    def user(self, login: str = BOT) -> dict[str, Any]:
        return {
            "login": login,
            "id": 41898282,
            "node_id": "MDM6Qm90NDE4OTgyODI=",
            "avatar_url": "https://avatars.githubusercontent.com/in/15368?v=4",
            "gravatar_id": "",
            "url": f"{self.url}/users/{login}",
            "html_url": f"{self.origin}/{login}",
            "type": "Bot",
            "site_admin": False,
        }

    def repo_json(self, repo: Repo) -> dict[str, Any]:
        owner, name = repo.full_name.split("/")
        created = "2020-01-01T00:00:00Z"
        return {
            "id": repo.id,
            "node_id": f"R_{repo.id}",
            "name": name,
            "full_name": repo.full_name,
            "owner": {**self.user(owner), "type": "Organization"},
            "private": repo.private,
            "html_url": f"{self.origin}/{repo.full_name}",
            "description": None,
            "fork": False,
            "url": f"{self.url}/repos/{repo.full_name}",
            "issues_url": f"{self.url}/repos/{repo.full_name}/issues{{/number}}",
            "labels_url": f"{self.url}/repos/{repo.full_name}/labels{{/name}}",
            "has_issues": repo.has_issues,
            "open_issues_count": sum(1 for i in repo.issues.values() if i["state"] == "open"),
            "default_branch": "main",
            "created_at": created,
            "updated_at": created,
            "pushed_at": created,
            "visibility": "private" if repo.private else "public",
            "permissions": {"admin": False, "maintain": False, "push": True, "triage": True, "pull": True},
        }

    def label_json(
        self, repo: Repo, name: str, color: str = "ededed", description: str | None = None
    ) -> dict[str, Any]:
        ident = next(self._ids)
        return {
            "id": ident,
            "node_id": f"LA_{ident}",
            "url": f"{self.url}/repos/{repo.full_name}/labels/{name}",
            "name": name,
            "description": description,
            "color": color,
            "default": False,
        }


# -- the request handler -----------------------------------------------------------------------------
def _handler(server: GitHubStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_PATCH(self) -> None:
            self._serve("PATCH")

        def do_PUT(self) -> None:
            self._serve("PUT")

        def do_DELETE(self) -> None:
            self._serve("DELETE")

        def _serve(self, method: str) -> None:
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            headers = {k.lower(): v for k, v in self.headers.items()}
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode("utf-8", "replace")
            path = parts.path
            call = Call(method, path, parse_qs(parts.query), headers, body)
            server.calls.append(call)
            extra: dict[str, str] = {}
            try:
                if not path.startswith(server.prefix + "/"):
                    raise ApiError(404, "Not Found")
                path = path[len(server.prefix) :]
                call.path = path
                for m, pattern, barrier in server._barriers:
                    if m == method and pattern.fullmatch(path):
                        barrier.wait()
                fault = self._fault(method, path)
                if fault is not None:
                    status, payload, extra = fault.status, fault.body, fault.headers
                else:
                    status, payload, extra = Api(server, headers, call.query, self._resource(path)).route(
                        method, path, body
                    )
            except ApiError as exc:
                status, payload = exc.status, exc.body
            except Exception as exc:  # a stand-in bug: say so, as GitHub's 500 would
                status, payload = 500, {"message": f"stand-in error: {exc!r}", "documentation_url": DOCS}
            call.status = status
            self._reply(status, payload, extra, path)

        def _fault(self, method: str, path: str) -> Fault | None:
            with server.lock:
                for fault in server.faults:
                    if fault.method == method and fault.path.fullmatch(path) and fault.times > 0:
                        fault.times -= 1
                        return fault
            return None

        @staticmethod
        def _resource(path: str) -> str:
            return "search" if path.startswith("/search/") else "core"

        def _reply(self, status: int, payload: Any, extra: dict[str, str], path: str) -> None:
            data = b"" if payload is None else json.dumps(payload).encode()
            self.send_response(status)
            resource = self._resource(path)
            limit = 30 if resource == "search" else 5000
            reset = int(time.time()) + 3600
            headers = {
                "Content-Type": "application/json; charset=utf-8",
                "Content-Length": str(len(data)),
                "x-github-media-type": "github.v3; format=json",
                "x-ratelimit-limit": str(limit),
                "x-ratelimit-remaining": str(limit - 1),
                "x-ratelimit-reset": str(reset),
                "x-ratelimit-used": "1",
                "x-ratelimit-resource": resource,
                "x-github-request-id": "ABCD:1234:5678",
            }
            for key, value in extra.items():
                headers = {k: v for k, v in headers.items() if k.lower() != key.lower()}
                headers[key] = value
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

    return Handler


Result = tuple[int, Any, dict[str, str]]


class Api:
    """One request against the state (under its lock)."""

    def __init__(
        self, server: GitHubStandIn, headers: dict[str, str], query: dict[str, list[str]], resource: str
    ) -> None:
        self.s = server
        self.headers = headers
        self.query = query
        self.resource = resource

    def q(self, name: str, default: str | None = None) -> str | None:
        values = self.query.get(name)
        return values[0] if values else default

    # -- auth -------------------------------------------------------------------------------------
    def credential(self) -> tuple[str, str]:
        header = self.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() not in ("token", "bearer") or not value.strip():
            raise ApiError(401, "Requires authentication")
        return scheme.lower(), value.strip()

    def token(self) -> Token:
        _, value = self.credential()
        token = self.s.tokens.get(value)
        if token is None or (token.expires_at is not None and token.expires_at < _now()):
            if value.count(".") == 2:  # a JWT where a token belongs
                raise ApiError(401, "A JSON web token could not be decoded")
            raise ApiError(401, "Bad credentials")
        return token

    def app(self) -> App:
        scheme, value = self.credential()
        if scheme != "bearer" or value.count(".") != 2:
            raise ApiError(401, "A JSON web token could not be decoded")
        try:
            claims = jwt.decode(value, options={"verify_signature": False})
        except jwt.PyJWTError as exc:
            raise ApiError(401, "A JSON web token could not be decoded") from exc
        app = self.s.apps.get(str(claims.get("iss")))
        if app is None:
            raise ApiError(401, "'Issuer' claim ('iss') must be an Integer")
        try:
            claims = jwt.decode(
                value,
                app.public_key,
                algorithms=["RS256"],
                options={"require": ["iat", "exp", "iss"]},
                leeway=60,
            )
        except jwt.ExpiredSignatureError as exc:
            raise ApiError(
                401,
                "'Expiration time' claim ('exp') must be a numeric value representing the future time "
                "at which the assertion expires",
            ) from exc
        except jwt.PyJWTError as exc:
            raise ApiError(401, "A JSON web token could not be decoded") from exc
        if int(claims["exp"]) - int(claims["iat"]) > 660:
            raise ApiError(401, "'Expiration time' claim ('exp') is too far in the future")
        return app

    def repo(self, full_name: str, *, issues: bool = False, write: bool = False) -> Repo:
        token = self.token()
        repo = self.s.repos.get(full_name)
        if repo is None or (token.repos is not None and full_name not in token.repos):
            raise ApiError(404, "Not Found")
        if issues and not repo.has_issues:
            raise ApiError(410, "Issues are disabled for this repo")
        if write and not token.write:
            raise ApiError(403, "Resource not accessible by personal access token")
        return repo

    # -- routing ----------------------------------------------------------------------------------
    ROUTES: tuple[tuple[str, str, str], ...] = (
        ("GET", r"/repos/([^/]+/[^/]+)", "get_repo"),
        ("GET", r"/repos/([^/]+/[^/]+)/installation", "get_installation"),
        ("POST", r"/app/installations/(\d+)/access_tokens", "create_installation_token"),
        ("GET", r"/repos/([^/]+/[^/]+)/issues", "list_issues"),
        ("POST", r"/repos/([^/]+/[^/]+)/issues", "create_issue"),
        ("GET", r"/repos/([^/]+/[^/]+)/issues/comments/(\d+)", "get_comment"),
        ("PATCH", r"/repos/([^/]+/[^/]+)/issues/comments/(\d+)", "edit_comment"),
        ("GET", r"/repos/([^/]+/[^/]+)/issues/(\d+)", "get_issue"),
        ("PATCH", r"/repos/([^/]+/[^/]+)/issues/(\d+)", "edit_issue"),
        ("GET", r"/repos/([^/]+/[^/]+)/issues/(\d+)/comments", "list_comments"),
        ("POST", r"/repos/([^/]+/[^/]+)/issues/(\d+)/comments", "create_comment"),
        ("GET", r"/repos/([^/]+/[^/]+)/labels", "list_labels"),
        ("POST", r"/repos/([^/]+/[^/]+)/labels", "create_label"),
        ("GET", r"/search/issues", "search_issues"),
        ("POST", r"/repos/([^/]+/[^/]+)/check-runs", "create_check_run"),
        ("GET", r"/repos/([^/]+/[^/]+)/check-runs/(\d+)", "get_check_run"),
        ("PATCH", r"/repos/([^/]+/[^/]+)/check-runs/(\d+)", "update_check_run"),
        ("GET", r"/repos/([^/]+/[^/]+)/commits/([^/]+)/check-runs", "list_check_runs_for_ref"),
    )

    def route(self, method: str, path: str, body: Any) -> Result:
        for m, pattern, name in self.ROUTES:
            match = re.fullmatch(pattern, path)
            if match and m == method:
                with self.s.lock:
                    result: Result = getattr(self, name)(*match.groups(), body=body)
                    return result
        raise ApiError(404, "Not Found")

    # -- repositories and Apps ------------------------------------------------------------------
    def get_repo(self, full_name: str, body: Any) -> Result:
        return 200, self.s.repo_json(self.repo(full_name)), {}

    def get_installation(self, full_name: str, body: Any) -> Result:
        app = self.app()
        for ident, repos in app.installations.items():
            if full_name in repos:
                owner = full_name.split("/")[0]
                return (
                    200,
                    {
                        "id": ident,
                        "account": {**self.s.user(owner), "type": "Organization"},
                        "app_id": int(app.app_id) if app.app_id.isdigit() else app.app_id,
                        "app_slug": "flaketriage",
                        "target_id": 1,
                        "target_type": "Organization",
                        "permissions": {"issues": "write", "metadata": "read"},
                        "events": ["issues"],
                        "repository_selection": "selected",
                        "access_tokens_url": f"{self.s.url}/app/installations/{ident}/access_tokens",
                        "repositories_url": f"{self.s.url}/installation/repositories",
                        "html_url": f"{self.s.origin}/organizations/{owner}/settings/installations/{ident}",
                        "created_at": "2020-01-01T00:00:00Z",
                        "updated_at": "2020-01-01T00:00:00Z",
                        "single_file_name": None,
                    },
                    {},
                )
        raise ApiError(404, "Not Found")

    def create_installation_token(self, ident: str, body: Any) -> Result:
        app = self.app()
        repos = app.installations.get(int(ident))
        if repos is None:
            raise ApiError(404, "Not Found")
        value = f"ghs_{next(self.s._ids):036d}"
        expires = _now() + timedelta(hours=1)
        self.s.tokens[value] = Token(repos=set(repos), write=True, expires_at=expires, checks=app.checks)
        return (
            201,
            {
                "token": value,
                "expires_at": _iso(expires),
                "permissions": {"issues": "write", "metadata": "read"},
                "repository_selection": "selected",
            },
            {},
        )

    # -- issues ---------------------------------------------------------------------------------
    def issue_json(self, repo: Repo, issue: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in issue.items() if not k.startswith("_")}

    def _issue(self, repo: Repo, number: str) -> dict[str, Any]:
        issue = repo.issues.get(int(number))
        if issue is None:
            raise ApiError(404, "Not Found")
        return issue

    def _labels(self, repo: Repo, names: Any) -> list[dict[str, Any]]:
        if not isinstance(names, list) or not all(isinstance(n, str) and n.strip() for n in names):
            raise ApiError(
                422, "Validation Failed", errors=[{"resource": "Label", "code": "invalid", "field": "labels"}]
            )
        found = []
        for name in dict.fromkeys(names):
            if name not in repo.labels:  # applying an unknown label creates it, as GitHub does
                repo.labels[name] = self.s.label_json(repo, name)
            found.append(repo.labels[name])
        return found

    def _text(self, value: Any, field_name: str, resource: str, *, required: bool, limit: int) -> str | None:
        if value is None:
            if required:
                raise ApiError(
                    422,
                    "Validation Failed",
                    errors=[{"resource": resource, "code": "missing_field", "field": field_name}],
                )
            return None
        if not isinstance(value, str):
            raise ApiError(
                422, f"Invalid request.\n\nFor '{field_name}', {json.dumps(value)} is not a string."
            )
        if required and not value.strip():
            raise ApiError(
                422,
                "Validation Failed",
                errors=[{"resource": resource, "code": "missing_field", "field": field_name}],
            )
        if len(value) > limit:
            raise ApiError(422, "Validation Failed", errors=[{
                "resource": resource, "code": "custom", "field": field_name,
                "message": f"{field_name} is too long (maximum is {limit} characters)",
            }])  # fmt: skip
        return value

    def list_issues(self, full_name: str, body: Any) -> Result:
        repo = self.repo(full_name, issues=True)
        state = self.q("state", "open")
        items = list(repo.issues.values())
        if state != "all":
            items = [i for i in items if i["state"] == state]
        if self.q("labels"):
            wanted = set(str(self.q("labels")).split(","))
            items = [i for i in items if wanted <= {lb["name"] for lb in i["labels"]}]
        if self.q("since"):
            since = str(self.q("since"))
            items = [i for i in items if i["updated_at"] >= since]
        key = {"created": "created_at", "updated": "updated_at", "comments": "comments"}[
            self.q("sort", "created") or "created"
        ]
        items.sort(key=lambda i: (i[key], i["number"]), reverse=self.q("direction", "desc") == "desc")
        return self.page([self.issue_json(repo, i) for i in items], f"/repos/{full_name}/issues")

    def create_issue(self, full_name: str, body: Any) -> Result:
        repo = self.repo(full_name, issues=True, write=True)
        body = body if isinstance(body, dict) else {}
        title = self._text(body.get("title"), "title", "Issue", required=True, limit=MAX_TITLE)
        text = self._text(body.get("body"), "body", "Issue", required=False, limit=MAX_BODY)
        labels = self._labels(repo, body.get("labels", []))
        number = max(repo.issues, default=0) + 1
        now = _iso(_now())
        base = f"{self.s.url}/repos/{full_name}/issues/{number}"
        issue = {
            "id": next(self.s._ids),
            "node_id": f"I_{number}",
            "url": base,
            "repository_url": f"{self.s.url}/repos/{full_name}",
            "labels_url": base + "/labels{/name}",
            "comments_url": base + "/comments",
            "events_url": base + "/events",
            "html_url": f"{self.s.origin}/{full_name}/issues/{number}",
            "number": number,
            "state": "open",
            "state_reason": None,
            "title": title,
            "body": text,
            "user": self.s.user(),
            "labels": labels,
            "assignee": None,
            "assignees": [],
            "milestone": None,
            "locked": False,
            "active_lock_reason": None,
            "comments": 0,
            "closed_at": None,
            "created_at": now,
            "updated_at": now,
            "closed_by": None,
            "author_association": "NONE",
        }
        repo.issues[number] = issue
        repo.indexed_at[number] = _now() + timedelta(seconds=self.s.search_lag_s)
        return 201, self.issue_json(repo, issue), {"Location": base}

    def get_issue(self, full_name: str, number: str, body: Any) -> Result:
        repo = self.repo(full_name, issues=True)
        return 200, self.issue_json(repo, self._issue(repo, number)), {}

    def edit_issue(self, full_name: str, number: str, body: Any) -> Result:
        repo = self.repo(full_name, issues=True, write=True)
        issue = self._issue(repo, number)
        body = body if isinstance(body, dict) else {}
        changes: dict[str, Any] = {}
        if "title" in body:
            changes["title"] = self._text(body["title"], "title", "Issue", required=True, limit=MAX_TITLE)
        if "body" in body:
            changes["body"] = self._text(body["body"], "body", "Issue", required=False, limit=MAX_BODY)
        if "labels" in body:
            changes["labels"] = self._labels(repo, body["labels"])
        if "state" in body:
            if body["state"] not in ("open", "closed"):
                raise ApiError(
                    422,
                    "Validation Failed",
                    errors=[{"resource": "Issue", "code": "invalid", "field": "state"}],
                )
            reason = body.get("state_reason")
            if reason not in (None, "completed", "not_planned", "reopened"):
                raise ApiError(
                    422,
                    "Validation Failed",
                    errors=[{"resource": "Issue", "code": "invalid", "field": "state_reason"}],
                )
            if body["state"] != issue["state"]:
                closing = body["state"] == "closed"
                changes["state"] = body["state"]
                changes["closed_at"] = _iso(_now()) if closing else None
                changes["closed_by"] = self.s.user() if closing else None
                changes["state_reason"] = reason or ("completed" if closing else "reopened")
        issue.update(changes)
        issue["updated_at"] = _iso(_now())
        return 200, self.issue_json(repo, issue), {}

    # -- comments -------------------------------------------------------------------------------
    def comment_json(self, comment: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in comment.items() if not k.startswith("_")}

    def list_comments(self, full_name: str, number: str, body: Any) -> Result:
        repo = self.repo(full_name, issues=True)
        self._issue(repo, number)
        items = [c for _, c in sorted(repo.comments.items()) if c["_issue"] == int(number)]
        if self.q("since"):
            items = [c for c in items if c["updated_at"] >= str(self.q("since"))]
        return self.page(
            [self.comment_json(c) for c in items], f"/repos/{full_name}/issues/{number}/comments"
        )

    def create_comment(self, full_name: str, number: str, body: Any) -> Result:
        repo = self.repo(full_name, issues=True, write=True)
        issue = self._issue(repo, number)
        body = body if isinstance(body, dict) else {}
        text = self._text(body.get("body"), "body", "IssueComment", required=True, limit=MAX_BODY)
        ident = next(self.s._ids)
        now = _iso(_now())
        comment = {
            "id": ident,
            "node_id": f"IC_{ident}",
            "url": f"{self.s.url}/repos/{full_name}/issues/comments/{ident}",
            "html_url": f"{issue['html_url']}#issuecomment-{ident}",
            "body": text,
            "user": self.s.user(),
            "created_at": now,
            "updated_at": now,
            "issue_url": issue["url"],
            "author_association": "NONE",
            "_issue": issue["number"],
        }
        repo.comments[ident] = comment
        issue["comments"] += 1
        issue["updated_at"] = now
        return 201, self.comment_json(comment), {}

    def get_comment(self, full_name: str, ident: str, body: Any) -> Result:
        repo = self.repo(full_name, issues=True)
        comment = repo.comments.get(int(ident))
        if comment is None:
            raise ApiError(404, "Not Found")
        return 200, self.comment_json(comment), {}

    def edit_comment(self, full_name: str, ident: str, body: Any) -> Result:
        repo = self.repo(full_name, issues=True, write=True)
        comment = repo.comments.get(int(ident))
        if comment is None:
            raise ApiError(404, "Not Found")
        body = body if isinstance(body, dict) else {}
        comment["body"] = self._text(body.get("body"), "body", "IssueComment", required=True, limit=MAX_BODY)
        comment["updated_at"] = _iso(_now())
        return 200, self.comment_json(comment), {}

    # -- labels ---------------------------------------------------------------------------------
    def list_labels(self, full_name: str, body: Any) -> Result:
        repo = self.repo(full_name)
        return self.page(list(repo.labels.values()), f"/repos/{full_name}/labels")

    def create_label(self, full_name: str, body: Any) -> Result:
        repo = self.repo(full_name, write=True)
        body = body if isinstance(body, dict) else {}
        name = body.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ApiError(
                422,
                "Validation Failed",
                errors=[{"resource": "Label", "code": "missing_field", "field": "name"}],
            )
        color = str(body.get("color", "ededed")).lstrip("#")
        if not re.fullmatch(r"[0-9a-fA-F]{6}", color):
            raise ApiError(
                422, "Validation Failed", errors=[{"resource": "Label", "code": "invalid", "field": "color"}]
            )
        if name in repo.labels:
            raise ApiError(
                422,
                "Validation Failed",
                errors=[{"resource": "Label", "code": "already_exists", "field": "name"}],
            )
        repo.labels[name] = self.s.label_json(repo, name, color, body.get("description"))
        return 201, repo.labels[name], {}

    # -- search ---------------------------------------------------------------------------------
    def search_issues(self, body: Any) -> Result:
        self.token()
        query = self.q("q") or ""
        phrases = [p.lower() for p in re.findall(r'"([^"]*)"', query)]
        rest = re.sub(r'"[^"]*"', " ", query)
        qualifiers = dict(re.findall(r"(\w+):(\S+)", rest))
        words = [w.lower() for w in re.sub(r"\w+:\S+", " ", rest).split()]
        if not phrases and not words and not qualifiers:
            raise ApiError(
                422, "Validation Failed", errors=[{"resource": "Search", "field": "q", "code": "missing"}]
            )
        names = [qualifiers["repo"]] if "repo" in qualifiers else list(self.s.repos)
        now = _now()
        items = []
        for name in names:
            repo = self.s.repos.get(name)
            if repo is None:
                raise ApiError(422, "Validation Failed", errors=[{
                    "message": "The listed users and repositories cannot be searched either because the "
                    "resources do not exist or you do not have permission to view them.",
                    "resource": "Search", "field": "q", "code": "invalid",
                }])  # fmt: skip
            for number, issue in repo.issues.items():
                if repo.indexed_at.get(number, now) > now:
                    continue  # not in the index yet
                haystack = (
                    (issue["body"] or "")
                    if qualifiers.get("in") == "body"
                    else f"{issue['title']} {issue['body'] or ''}"
                )
                haystack = haystack.lower()
                if all(p in haystack for p in phrases) and all(w in haystack for w in words):
                    items.append({**self.issue_json(repo, issue), "score": 1.0})
        order = self.q("order", "desc")
        items.sort(key=lambda i: i["created_at"], reverse=order == "desc")
        status, page, headers = self.page(items, "/search/issues")
        return status, {"total_count": len(items), "incomplete_results": False, "items": page}, headers

    # -- check runs -------------------------------------------------------------------------------
    def checks_repo(self, full_name: str, *, write: bool = False) -> Repo:
        repo = self.repo(full_name)
        token = self.token()
        if write and token.checks is None:
            raise ApiError(403, "You must authenticate via a GitHub App.")
        if write and token.checks != "write":
            raise ApiError(403, "Resource not accessible by integration")
        return repo

    def _check_run(self, repo: Repo, ident: str) -> dict[str, Any]:
        run = repo.check_runs.get(int(ident))
        if run is None:
            raise ApiError(404, "Not Found")
        return run

    @staticmethod
    def _invalid(field_name: str, code: str = "invalid", message: str | None = None) -> ApiError:
        error: dict[str, Any] = {"resource": "CheckRun", "code": code, "field": field_name}
        if message:
            error["message"] = message
        return ApiError(422, "Validation Failed", errors=[error])

    def _check_fields(self, repo: Repo, body: dict[str, Any], run: dict[str, Any] | None) -> dict[str, Any]:
        """The fields `body` sets, validated as GitHub documents; `run` is the run being updated."""
        changes: dict[str, Any] = {}
        for key in ("name", "external_id", "details_url"):
            if key in body:
                if not isinstance(body[key], str) or (key == "name" and not body[key].strip()):
                    raise self._invalid(key)
                changes[key] = body[key]
        if "details_url" in changes and not re.fullmatch(r"https?://[^\s/]+\S*", changes["details_url"]):
            raise self._invalid("details_url", message="details_url must be a valid http(s) URL")
        if "head_sha" in body:
            sha = body["head_sha"]
            if (
                not isinstance(sha, str)
                or not re.fullmatch(r"[0-9a-f]{40}", sha)
                or (repo.commits is not None and sha not in repo.commits)
            ):
                raise ApiError(422, f"No commit found for SHA: {sha}")
            changes["head_sha"] = sha
        status = body.get("status")
        if status is not None and status not in CHECK_STATUSES:
            raise self._invalid("status", message=(
                f"{status} is reserved for GitHub Actions" if status in ACTIONS_STATUSES else None
            ))  # fmt: skip
        conclusion = body.get("conclusion")
        if conclusion is not None and conclusion not in CHECK_CONCLUSIONS:
            raise self._invalid("conclusion")
        now = _iso(_now())
        if conclusion is not None:  # a conclusion completes the run, whatever the status says
            changes.update(status="completed", conclusion=conclusion, completed_at=now)
        elif status == "completed" or "completed_at" in body:
            if run is None or run["conclusion"] is None:
                raise self._invalid("conclusion", "missing_field", "conclusion is required to complete")
            changes["status"] = "completed"
        elif status is not None:  # queued or in_progress: open (again)
            changes.update(status=status, conclusion=None, completed_at=None)
        if "output" in body:
            changes["output"] = self._check_output(body["output"], changes, run)
        return changes

    def _check_output(
        self, output: Any, changes: dict[str, Any], run: dict[str, Any] | None
    ) -> dict[str, Any]:
        if not isinstance(output, dict):
            raise self._invalid("output")
        for key in ("title", "summary"):
            if not isinstance(output.get(key), str) or not output[key]:
                raise self._invalid(f"output.{key}", "missing_field")
        for key in ("summary", "text"):
            value = output.get(key)
            if value is not None and (not isinstance(value, str) or len(value) > MAX_CHECK_OUTPUT):
                raise self._invalid(
                    f"output.{key}", "custom", f"{key} is too long (maximum is {MAX_CHECK_OUTPUT} characters)"
                )
        annotations = output.get("annotations") or []
        if not isinstance(annotations, list) or len(annotations) > MAX_ANNOTATIONS:
            raise self._invalid("output.annotations", message=f"at most {MAX_ANNOTATIONS} per request")
        count = (run["output"]["annotations_count"] if run else 0) + len(annotations)
        return {
            "title": output["title"],
            "summary": output["summary"],
            "text": output.get("text"),
            "annotations_count": count,
        }

    def check_run_json(self, repo: Repo, run: dict[str, Any]) -> dict[str, Any]:
        """`run` in the shape of GitHub's documented example (`CHECK_RUN_EXAMPLE`)."""
        shape = copy.deepcopy(CHECK_RUN_EXAMPLE)
        api = f"{self.s.url}/repos/{repo.full_name}/check-runs/{run['id']}"
        shape.update({k: v for k, v in run.items() if not k.startswith("_")})
        shape.update(
            node_id=f"CR_{run['id']}",
            url=api,
            html_url=f"{self.s.origin}/{repo.full_name}/runs/{run['id']}",
            output={**run["output"], "annotations_url": api + "/annotations"},
            check_suite={"id": run["_suite"]},
            pull_requests=[],
        )
        shape["app"].update(id=15368, slug="flaketriage", name="flaketriage", node_id="MDM6QXBwMTUzNjg=")
        return shape

    def create_check_run(self, full_name: str, body: Any) -> Result:
        repo = self.checks_repo(full_name, write=True)
        body = body if isinstance(body, dict) else {}
        for key in ("name", "head_sha"):
            if key not in body:
                raise self._invalid(key, "missing_field")
        changes = self._check_fields(repo, body, None)
        ident = next(self.s._ids)
        run: dict[str, Any] = {
            "id": ident,
            "external_id": "",
            "details_url": f"{self.s.origin}/apps/flaketriage",  # the App's page, as GitHub does
            "status": "queued",
            "conclusion": None,
            "started_at": _iso(_now()),
            "completed_at": None,
            "output": {"title": None, "summary": None, "text": None, "annotations_count": 0},
            "_suite": next(self.s._ids),
        }
        run.update(changes)
        repo.check_runs[ident] = run
        return 201, self.check_run_json(repo, run), {}

    def get_check_run(self, full_name: str, ident: str, body: Any) -> Result:
        repo = self.checks_repo(full_name)
        return 200, self.check_run_json(repo, self._check_run(repo, ident)), {}

    def update_check_run(self, full_name: str, ident: str, body: Any) -> Result:
        repo = self.checks_repo(full_name, write=True)
        run = self._check_run(repo, ident)
        run.update(self._check_fields(repo, body if isinstance(body, dict) else {}, run))
        return 200, self.check_run_json(repo, run), {}

    def list_check_runs_for_ref(self, full_name: str, ref: str, body: Any) -> Result:
        repo = self.checks_repo(full_name)
        runs = [r for _, r in sorted(repo.check_runs.items()) if r["head_sha"] == ref]
        if self.q("check_name"):
            runs = [r for r in runs if r["name"] == self.q("check_name")]
        if self.q("status"):
            runs = [r for r in runs if r["status"] == self.q("status")]
        if (self.q("filter") or "latest") == "latest":
            runs = list({r["name"]: r for r in runs}.values())  # the newest of each name
        runs.reverse()  # newest first
        items = [self.check_run_json(repo, r) for r in runs]
        status, page, headers = self.page(items, f"/repos/{full_name}/commits/{ref}/check-runs")
        return status, {"total_count": len(items), "check_runs": page}, headers

    # -- pagination -------------------------------------------------------------------------------
    def page(self, items: list[Any], path: str) -> Result:
        per_page = max(1, min(100, int(self.q("per_page", "30") or 30)))
        number = max(1, int(self.q("page", "1") or 1))
        last = max(1, -(-len(items) // per_page))
        chunk = items[(number - 1) * per_page : number * per_page]
        links = []
        params = {k: v[0] for k, v in self.query.items() if k not in ("page", "per_page")}

        def link(page: int, rel: str) -> str:
            query = urlencode({**params, "per_page": per_page, "page": page})
            return f'<{self.s.url}{path}?{query}>; rel="{rel}"'

        if number < last:
            links += [link(number + 1, "next"), link(last, "last")]
        if number > 1:
            links += [link(1, "first"), link(number - 1, "prev")]
        return 200, chunk, ({"Link": ", ".join(links)} if links else {})


def iter_markers(body: str) -> Iterator[str]:
    """The fingerprints of the ``flaketriage-fingerprint`` markers in a body."""
    yield from re.findall(r"<!-- flaketriage-fingerprint: ([0-9a-f]+) -->", body)
