"""The GitHub sign-in: an OAuth App's web flow, as GitHub documents it
(docs.github.com/apps/oauth-apps/building-oauth-apps/authorizing-oauth-apps).

The browser is sent to `GitHubLogin.authorize_url` with a ``state`` bound to it (the caller keeps
it in a signed cookie); GitHub sends it back with a ``code``, which `GitHubLogin.sign_in` trades
for a token (``POST /login/oauth/access_token``, JSON asked for), reads the user with it (``GET
/user``) and says whether they may sign in: their login in ``FLAKETRIAGE_DASHBOARD_GITHUB_USERS``,
or an active member of ``FLAKETRIAGE_DASHBOARD_GITHUB_ORG``'s organization (``GET
/user/memberships/orgs/{org}``) or team (``GET /orgs/{org}/teams/{team}/memberships/{login}``). The
token serves these calls only and is never kept.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote, urlencode

import httpx

from flaketriage import __version__
from flaketriage.errors import RequestRefusedError
from flaketriage.settings import Settings

TIMEOUT_S = 10.0
"""How long each call to GitHub may take."""
_LOGIN = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})")


class GitHubLoginError(RequestRefusedError):
    """GitHub did not sign the person in (an error it sent, a code it refused, no answer), or the
    person it signed in may not sign in here; the message says which, for the sign-in page."""


class GitHubLogin:
    """The web flow of the OAuth App in `settings`; `transport` replaces the network (tests)."""

    def __init__(self, settings: Settings, *, transport: httpx.BaseTransport | None = None) -> None:
        self.settings = settings
        self.transport = transport

    @property
    def scope(self) -> str:
        """What the token may read: organization memberships when an organization decides."""
        return "read:org" if self.settings.dashboard_github_org else ""

    def authorize_url(self, state: str, redirect_uri: str) -> str:
        """Where the browser asks GitHub to sign its person in."""
        query = {
            "client_id": self.settings.github_oauth_client_id or "",
            "redirect_uri": redirect_uri,
            "state": state,
            "allow_signup": "false",
        }
        if self.scope:
            query["scope"] = self.scope
        return f"{self.settings.github_oauth_url}/login/oauth/authorize?{urlencode(query)}"

    def sign_in(self, code: str, redirect_uri: str) -> str:
        """The login of the person GitHub signed in with `code`, when they may sign in here;
        `GitHubLoginError` saying why not."""
        with httpx.Client(
            timeout=TIMEOUT_S,
            transport=self.transport,
            headers={"User-Agent": f"flaketriage/{__version__}"},
            follow_redirects=False,
        ) as client:
            token = self._token(client, code, redirect_uri)
            login = self._login(client, token)
            if not self._allowed(client, token, login):
                raise GitHubLoginError(f"the GitHub user {login} may not sign in here")
        return login

    def _token(self, client: httpx.Client, code: str, redirect_uri: str) -> str:
        secret = self.settings.github_oauth_client_secret
        data = {
            "client_id": self.settings.github_oauth_client_id or "",
            "client_secret": secret.get_secret_value() if secret is not None else "",
            "code": code,
            "redirect_uri": redirect_uri,
        }
        answer = self._call(
            client, "POST", f"{self.settings.github_oauth_url}/login/oauth/access_token", data=data
        )
        token = answer.get("access_token")
        if not isinstance(token, str) or not token:
            # GitHub answers a refused code with 200 and an error object.
            error = str(answer.get("error") or "no access token")[:100]
            raise GitHubLoginError(f"GitHub did not accept the sign-in ({error}): sign in again")
        return token

    def _login(self, client: httpx.Client, token: str) -> str:
        user = self._call(client, "GET", f"{self.settings.github_api_url}/user", token=token)
        login = user.get("login")
        if not isinstance(login, str) or not _LOGIN.fullmatch(login):
            raise GitHubLoginError("GitHub's answer named no user: sign in again")
        return login

    def _allowed(self, client: httpx.Client, token: str, login: str) -> bool:
        if login.lower() in self.settings.dashboard_github_users:
            return True
        org_team = self.settings.dashboard_github_org
        if not org_team:
            return False
        org, _, team = org_team.partition("/")
        api = self.settings.github_api_url
        path = (
            f"/orgs/{quote(org)}/teams/{quote(team)}/memberships/{quote(login)}"
            if team
            else f"/user/memberships/orgs/{quote(org)}"
        )
        membership = self._call(client, "GET", api + path, token=token, missing_ok=True)
        return membership.get("state") == "active"

    @staticmethod
    def _call(
        client: httpx.Client,
        method: str,
        url: str,
        *,
        token: str | None = None,
        data: dict[str, str] | None = None,
        missing_ok: bool = False,
    ) -> dict[str, Any]:
        """GitHub's JSON answer; ``{}`` for a 403 or 404 when `missing_ok` (not a member)."""
        headers = {"Accept": "application/json"}
        if token is not None:
            headers = {"Accept": "application/vnd.github+json", "Authorization": f"Bearer {token}"}
        try:
            response = client.request(method, url, headers=headers, data=data)
        except httpx.HTTPError as exc:
            raise GitHubLoginError(f"GitHub did not answer ({type(exc).__name__}): try again") from exc
        if missing_ok and response.status_code in (403, 404):
            return {}
        if response.status_code != 200:
            raise GitHubLoginError(f"GitHub answered {response.status_code} to the sign-in: sign in again")
        try:
            answer = response.json()
        except ValueError as exc:
            raise GitHubLoginError("GitHub's answer was not JSON: try again") from exc
        if not isinstance(answer, dict):
            raise GitHubLoginError("GitHub's answer was not a JSON object: try again")
        return answer
