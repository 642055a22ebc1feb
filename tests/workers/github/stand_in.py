"""A GitHub REST API stand-in: a real HTTP server (a thread) that answers the calls flaketriage makes
the way GitHub documents them, and enforces what GitHub enforces.

Covered: ``GET /repos/{o}/{r}``; issues create/get/edit/list (labels, state, since, sort,
pagination with ``Link`` headers); comments create/list/get/edit; labels list/create; ``GET
/search/issues`` (``total_count``/``incomplete_results``/``items``, with an index that lags behind
new issues by `search_lag_s`); a GitHub App's ``GET /repos/{o}/{r}/installation`` and ``POST
/app/installations/{id}/access_tokens`` behind an RS256 JWT checked with the App's public key.

Enforced: ``Authorization: token ...`` or ``Bearer ...`` on every call (401 ``Bad credentials``),
404 for repositories the credentials cannot see and for unknown issues, 410 when issues are
disabled, 403 for a read-only token's writes, 422 validation errors (a missing title, a body over
65,536 characters, a label that exists, a bad state), the ``x-ratelimit-*`` headers on every
answer, and scripted faults: secondary rate limits (403 with ``retry-after``, or 429), 5xx.
Bodies follow GitHub's documented examples (url, html_url, number, state, labels, user, dates).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import jwt

DOCS = "https://docs.github.com/rest"
MAX_BODY = 65536
MAX_TITLE = 256
BOT = "flaketriage-bot"


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


@dataclass
class App:
    app_id: str
    public_key: str
    installations: dict[int, set[str]] = field(default_factory=dict)
    """Installation id → the repositories it is installed on."""


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

    def add_token(self, token: str, *, repos: set[str] | None = None, write: bool = True) -> None:
        self.tokens[token] = Token(repos=repos, write=write)

    def add_app(self, app_id: str, public_key_pem: str, installations: dict[int, set[str]]) -> None:
        self.apps[app_id] = App(app_id, public_key_pem, installations)

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
        self.s.tokens[value] = Token(repos=set(repos), write=True, expires_at=expires)
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
