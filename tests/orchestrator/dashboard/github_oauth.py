"""A stand-in for GitHub's OAuth App web flow: a real HTTP server (a thread) that answers as GitHub
documents it (docs.github.com/apps/oauth-apps/building-oauth-apps/authorizing-oauth-apps), and the
REST calls a sign-in makes with the token it gives.

- ``GET /login/oauth/authorize`` (the browser): for the registered ``client_id``, a ``redirect_uri``
  on the registered callback's host and path (or none: the callback), it signs in `signed_in_as`
  (the person at the browser, who consents) and redirects to the callback with a ``code`` and the
  ``state`` it was given; an unknown client is a 404, a redirect elsewhere an error page.
- ``POST /login/oauth/access_token`` (``client_id``, ``client_secret``, ``code``, ``redirect_uri``):
  a token for a code given in the last 10 minutes, once, to the client it was given to, with the
  ``redirect_uri`` it was given with. As GitHub does, a refusal is a 200 with ``error`` and
  ``error_description``; the answer is JSON when ``Accept: application/json`` is sent, else
  form-encoded.
- ``GET /user``: the token's user (401 ``Requires authentication`` without a token that works).
- ``GET /user/memberships/orgs/{org}``: the user's membership (``state`` active or pending), which
  needs the ``read:org`` scope (403 without it); 404 when they are not a member.
- ``GET /orgs/{org}/teams/{team}/memberships/{login}``: a team membership, ``read:org`` too; 404.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

CLIENT_ID = "Iv1.0123456789abcdef"
CLIENT_SECRET = "0123456789abcdef0123456789abcdef01234567"
CODE_TTL_S = 600


@dataclass
class _Code:
    login: str
    client_id: str
    redirect_uri: str
    scope: str
    expires: float


@dataclass
class GitHubOAuth:
    """The stand-in; `callback` is the OAuth App's registered callback URL."""

    callback: str
    signed_in_as: str = "octocat"
    """Who is signed in to GitHub in the browser that is sent to authorize."""
    users: dict[str, dict[str, Any]] = field(default_factory=dict)
    orgs: dict[str, dict[str, str]] = field(default_factory=dict)
    """Memberships: org -> login -> state (``active``, ``pending``)."""
    teams: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    codes: dict[str, _Code] = field(default_factory=dict)
    tokens: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Token -> (login, scope)."""
    calls: list[str] = field(default_factory=list)
    """``METHOD path`` of every request, in order."""

    def __post_init__(self) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> GitHubOAuth:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def add_user(self, login: str, **fields: Any) -> None:
        self.users[login] = {"login": login, "id": 1000 + len(self.users), "type": "User", **fields}

    # -- the flow -------------------------------------------------------------------------------
    def authorize(self, query: dict[str, str]) -> tuple[int, dict[str, str], str]:
        if query.get("client_id") != CLIENT_ID:
            return 404, {}, "Not Found"
        redirect = query.get("redirect_uri") or self.callback
        wanted, registered = urlsplit(redirect), urlsplit(self.callback)
        if (wanted.scheme, wanted.netloc) != (registered.scheme, registered.netloc) or not (
            wanted.path == registered.path or wanted.path.startswith(registered.path.rstrip("/") + "/")
        ):
            return 200, {}, "The redirect_uri MUST match the registered callback URL for this application."
        code = secrets.token_hex(10)
        with self._lock:
            self.codes[code] = _Code(
                self.signed_in_as, CLIENT_ID, redirect, query.get("scope", ""), time.time() + CODE_TTL_S
            )
        answer = {"code": code}
        if "state" in query:
            answer["state"] = query["state"]
        return 302, {"Location": f"{redirect}?{urlencode(answer)}"}, ""

    def access_token(self, form: dict[str, str]) -> dict[str, str]:
        if form.get("client_id") != CLIENT_ID or form.get("client_secret") != CLIENT_SECRET:
            return _error(
                "incorrect_client_credentials", "The client_id and/or client_secret passed are incorrect."
            )
        with self._lock:
            code = self.codes.pop(form.get("code", ""), None)
        if code is None or code.expires < time.time() or code.client_id != form["client_id"]:
            return _error("bad_verification_code", "The code passed is incorrect or expired.")
        if form.get("redirect_uri") and form["redirect_uri"] != code.redirect_uri:
            return _error("redirect_uri_mismatch", "The redirect_uri MUST match the registered callback URL.")
        token = "gho_" + secrets.token_hex(18)
        with self._lock:
            self.tokens[token] = (code.login, code.scope)
        return {"access_token": token, "token_type": "bearer", "scope": code.scope}

    def api(self, path: str, authorization: str) -> tuple[int, dict[str, Any]]:
        scheme, _, token = authorization.partition(" ")
        held = self.tokens.get(token) if scheme.lower() in ("bearer", "token") else None
        if held is None:
            return 401, {
                "message": "Requires authentication",
                "documentation_url": "https://docs.github.com/rest",
            }
        login, scope = held
        parts = path.strip("/").split("/")
        if parts == ["user"]:
            return 200, self.users.get(login, {"login": login, "id": 1, "type": "User"})
        needs_org = parts[0] == "orgs" or parts[:2] == ["user", "memberships"]
        if needs_org and "read:org" not in scope.split(","):
            message = "You need at least read:org scope or user scope to list your organizations."
            return 403, {"message": message}
        if len(parts) == 4 and parts[:3] == ["user", "memberships", "orgs"]:
            state = self.orgs.get(parts[3], {}).get(login)
            if state is None:
                return 404, {"message": "Not Found"}
            return 200, {
                "state": state,
                "role": "member",
                "organization": {"login": parts[3]},
                "user": {"login": login},
            }
        if len(parts) == 6 and parts[0] == "orgs" and parts[2] == "teams" and parts[4] == "memberships":
            state = self.teams.get((parts[1], parts[3]), {}).get(parts[5])
            if state is None:
                return 404, {"message": "Not Found"}
            return 200, {"state": state, "role": "member", "url": f"{self.url}{path}"}
        return 404, {"message": "Not Found"}


def _error(code: str, description: str) -> dict[str, str]:
    return {
        "error": code,
        "error_description": description,
        "error_uri": "https://docs.github.com/apps/managing-oauth-apps/troubleshooting-oauth-app-access-token-request-errors",
    }


def _handler(server: GitHubOAuth) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlsplit(self.path)
            server.calls.append(f"GET {url.path}")
            if url.path == "/login/oauth/authorize":
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                status, headers, text = server.authorize(query)
                self._answer(status, text.encode(), "text/html; charset=utf-8", headers)
                return
            status, body = server.api(url.path, self.headers.get("Authorization", ""))
            self._answer(status, json.dumps(body).encode(), "application/json; charset=utf-8")

        def do_POST(self) -> None:
            url = urlsplit(self.path)
            server.calls.append(f"POST {url.path}")
            length = int(self.headers.get("Content-Length") or 0)
            form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
            if url.path != "/login/oauth/access_token":
                self._answer(404, b'{"message": "Not Found"}', "application/json")
                return
            answer = server.access_token(form)
            if "application/json" in self.headers.get("Accept", ""):
                self._answer(200, json.dumps(answer).encode(), "application/json; charset=utf-8")
            else:
                self._answer(
                    200, urlencode(answer).encode(), "application/x-www-form-urlencoded; charset=utf-8"
                )

        def _answer(self, status: int, body: bytes, kind: str, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler
