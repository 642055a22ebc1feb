"""`Access`: who is looking at the dashboard, what they may do, the forms' CSRF tokens and the
session cookie (`flaketriage.orchestrator.dashboard.sign_in` has the routes that sign people in and
out).

Reading is open to anyone who reaches the service by default, or only to readers from
``FLAKETRIAGE_DASHBOARD_TRUSTED_NETWORKS``, or (``FLAKETRIAGE_DASHBOARD_READ=login``) only to
people signed in: anyone else is sent to the sign-in page (`reader`). Acting needs a person signed
in, with a token (``FLAKETRIAGE_DASHBOARD_TOKEN``, else the API token) or through a GitHub OAuth
App (`flaketriage.orchestrator.dashboard.github_login`); a script may send the token as
``Authorization: Bearer`` instead.

A session is a signed cookie (`cookies.Signer`: HttpOnly, SameSite=Lax, Secure over https) naming
the person, how they signed in and a random session id. Every form carries a token bound to that
id (before signing in, to a random id in a cookie of the browser's own), checked with
`hmac.compare_digest`, and a form whose ``Origin`` (or ``Referer``) names another host is refused
too. Signing in with a token binds the session to that token: changing it signs those sessions out.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import re
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

from fastapi import Request
from fastapi.responses import RedirectResponse, Response

from flaketriage.errors import RequestRefusedError
from flaketriage.orchestrator.dashboard.cookies import Signer
from flaketriage.orchestrator.request_body import read_body

if TYPE_CHECKING:
    from flaketriage.settings import Settings

PREFIX = "/dashboard"
"""Where the pages live; ``/`` and ``/ui`` redirect there. Every cookie of the dashboard is scoped
to it."""
SESSION_COOKIE = "ft_session"
BROWSER_COOKIE = "ft_browser"
"""A random id of the browser, signed: what the sign-in form's token is bound to."""
FLASH_COOKIE = "ft_flash"
"""The result of an action, shown once by the page it redirects to."""
OAUTH_COOKIE = "ft_oauth"
"""The GitHub sign-in's state and where to go after it, for the 10 minutes it may take."""
OAUTH_TTL_S = 600
FLASH_TTL_S = 120
BROWSER_TTL_S = 86400
MAX_FORM = 16 * 1024
"""The largest form the dashboard reads (its forms are a few short fields)."""
MAX_NAME = 64
MAX_FLASH = 600

log = logging.getLogger("flaketriage.dashboard")
"""Who signed in or out (and who failed to), and every action with who did it."""


@dataclass(frozen=True)
class Viewer:
    """Who made a request: ``name`` is None for an anonymous reader."""

    name: str | None = None
    can_act: bool = False
    via: str | None = None
    """How they signed in: ``token``, ``github``, or ``api`` (a request with the token itself)."""
    session: str | None = None
    """The session's random id, which form tokens are bound to (None without a session cookie)."""

    @property
    def label(self) -> str:
        """The viewer as logs and records name them: ``alice (github)``."""
        return f"{self.name} ({self.via})" if self.name else "anonymous"


class AccessRefused(RequestRefusedError):
    """A request the dashboard refuses: reading without the right to read (``sign_in``: sent to the
    sign-in page), an action without a person signed in, or a form whose token or origin is wrong
    (403). Nothing was changed."""

    def __init__(self, detail: str, *, status: int = 403, sign_in: bool = False, back: str = PREFIX) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status
        self.sign_in = sign_in
        self.back = back


def local_path(text: str | None, default: str = PREFIX) -> str:
    """`text` when it is a path of the dashboard's (``/dashboard...``, with its query), so a
    ``next=`` can only lead back into the dashboard; `default` for anything else (another site,
    ``//host``, a backslash, a control character, ``..``)."""
    if not text or len(text) > 2000 or not text.isascii() or not text.isprintable() or "\\" in text:
        return default
    parts = urlsplit(text)
    path = parts.path
    if parts.scheme or parts.netloc or parts.fragment or path.startswith("//"):
        return default
    if not (path == PREFIX or path.startswith(PREFIX + "/")) or ".." in path.split("/"):
        return default
    return text


class Access:
    """The dashboard's rules for `settings`: readers, sessions, form tokens, result messages."""

    def __init__(self, settings: Settings, *, key: bytes | None = None) -> None:
        self.settings = settings
        if key is None and settings.dashboard_secret is not None:
            key = settings.dashboard_secret.get_secret_value().encode("utf-8")
        if key is None:
            log.warning(
                "FLAKETRIAGE_DASHBOARD_SECRET is not set: the dashboard's sessions are signed with a "
                "random key of this process; they end when it restarts and other processes do not "
                "accept them"
            )
            key = secrets.token_bytes(32)
        self.signer = Signer(key)
        self.networks = [ipaddress.ip_network(n) for n in settings.dashboard_trusted_networks]

    # -- who is looking -----------------------------------------------------------------------
    def viewer(self, request: Request) -> Viewer:
        """The person signed in (the session cookie, or the token in ``Authorization``), else an
        anonymous reader; a cookie that does not verify (tampered, expired, signed with another
        key or for a token since changed) is no session."""
        found = getattr(request.state, "viewer", None)
        if isinstance(found, Viewer):
            return found
        viewer = self._bearer(request.headers.get("authorization")) or self._session(request)
        request.state.viewer = viewer
        return viewer

    def _bearer(self, authorization: str | None) -> Viewer | None:
        if not authorization or not authorization.startswith("Bearer "):
            return None
        if self.token_matches(authorization.removeprefix("Bearer ").strip()):
            return Viewer(name="API token", can_act=True, via="api")
        return None

    def _session(self, request: Request) -> Viewer:
        data = self.signer.unsign("session", request.cookies.get(SESSION_COOKIE))
        if data is None:
            return Viewer()
        name, via, session = data.get("n"), data.get("v"), data.get("s")
        if not (isinstance(name, str) and isinstance(session, str) and via in ("token", "github")):
            return Viewer()
        if via == "token" and not hmac.compare_digest(str(data.get("t", "")), self._token_tag()):
            return Viewer()  # the token was changed since: its sessions end
        if via == "github" and not self._github_may(name):
            return Viewer()
        return Viewer(name=name, can_act=True, via=str(via), session=session)

    def _github_may(self, login: str) -> bool:
        """Whether a GitHub session still stands: the login is set up, and its login still listed
        (membership of the organization is asked at sign-in only)."""
        settings = self.settings
        return settings.github_login_ready() and (
            bool(settings.dashboard_github_org) or login.lower() in settings.dashboard_github_users
        )

    def token_matches(self, given: str) -> bool:
        raw = given.encode("utf-8", "surrogatepass")
        # Every token compared, each in constant time: which one matched is not told by the time.
        matched = [hmac.compare_digest(raw, t.encode("utf-8")) for t in self.settings.dashboard_tokens()]
        return any(matched)

    def _token_tag(self) -> str:
        tokens = self.settings.dashboard_tokens()
        return self.signer.mac("token", tokens[0])[:22] if tokens else ""

    def may_read(self, request: Request) -> bool:
        """Whether the request may read the pages (`reader`)."""
        if self.viewer(request).can_act:
            return True
        if self.settings.dashboard_read == "login":
            return False
        if not self.networks:
            return True
        host = request.client.host if request.client is not None else ""
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in network for network in self.networks)

    def reader(self, request: Request) -> None:
        """A dependency of every page: `AccessRefused` (sent to sign in) for a reader who may not read."""
        if not self.may_read(request):
            back = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            raise AccessRefused("sign in to read the dashboard", sign_in=True, back=local_path(back))

    # -- forms ----------------------------------------------------------------------------------
    def csrf_token(self, request: Request) -> str:
        """The token the forms of this page carry: bound to the session, else to the browser's id;
        empty for a reader who has neither (they are shown no form but the sign-in page's)."""
        bound = self._bound_to(request)
        return self.signer.mac("csrf", bound) if bound else ""

    def _bound_to(self, request: Request) -> str | None:
        viewer = self.viewer(request)
        if viewer.session:
            return viewer.session
        browser = getattr(request.state, "browser", None)
        if isinstance(browser, str):
            return browser
        data = self.signer.unsign("browser", request.cookies.get(BROWSER_COOKIE))
        return str(data["b"]) if data and isinstance(data.get("b"), str) else None

    def browser(self, request: Request) -> None:
        """Give a browser that has neither a session nor an id one, for the sign-in form's token;
        `finish` sends it in the page's cookies."""
        if self._bound_to(request) is None:
            request.state.browser = secrets.token_urlsafe(18)
            request.state.new_browser = True

    async def form(self, request: Request) -> dict[str, str]:
        """The fields of a posted form (URL-encoded, at most `MAX_FORM` bytes, valid UTF-8), the
        first value of each; `AccessRefused` (400) for anything else."""
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "application/x-www-form-urlencoded":
            raise AccessRefused(
                "the form was not sent as a form (application/x-www-form-urlencoded)", status=400
            )
        body = await read_body(
            request,
            limit=MAX_FORM,
            timeout_s=self.settings.body_timeout_s,
            too_large=f"a dashboard form is at most {MAX_FORM // 1024} KiB",
        )
        try:
            fields = parse_qs(
                body.decode("ascii"), keep_blank_values=True, max_num_fields=50, errors="strict"
            )
        except (UnicodeDecodeError, ValueError):
            raise AccessRefused("the form is not valid URL-encoded UTF-8 text", status=400) from None
        return {name: values[0] for name, values in fields.items()}

    def check_form(
        self, request: Request, form: dict[str, str], *, act: bool = True, back: str | None = None
    ) -> Viewer:
        """The viewer, when they may send this form: signed in (when `act`), from this site, with
        the form token of their session (or, before signing in, of their browser); else
        `AccessRefused`, whose page leads `back`. A request with the token itself in
        ``Authorization`` needs neither (no browser sends one by itself)."""
        viewer = self.viewer(request)
        back = back or local_path(form.get("next"))
        if act and not viewer.can_act:
            raise AccessRefused("sign in to do this: nothing was changed", sign_in=True, back=back)
        if viewer.via == "api":
            return viewer
        self._check_origin(request, back)
        expected = self.csrf_token(request)
        given = form.get("csrf_token", "").encode("utf-8", "surrogatepass")
        if not expected or not hmac.compare_digest(given, expected.encode("ascii")):
            raise AccessRefused(
                "this form's token is missing or is not this session's (an old page, or a form from "
                "another site): reload the page and send it again; nothing was changed",
                back=back,
            )
        return viewer

    @staticmethod
    def _check_origin(request: Request, back: str) -> None:
        host = (request.headers.get("host") or "").lower()
        for header in ("origin", "referer"):
            value = request.headers.get(header)
            if value is None:
                continue
            sent = urlsplit(value).netloc.lower() if value != "null" else "null"
            if sent != host:
                raise AccessRefused(
                    f"this form was sent from another site ({header} {sent or value[:100]!r}, not "
                    f"{host!r}): nothing was changed",
                    back=back,
                )
            return  # Origin decides when a browser sends it; Referer only when it does not

    # -- sessions and messages ------------------------------------------------------------------
    def start_session(self, request: Request, response: Response, name: str, via: str) -> Viewer:
        """Sign `name` in (a new session id: one from before signing in is never reused)."""
        session = secrets.token_urlsafe(18)
        data = {"n": name, "v": via, "s": session, "at": int(time.time())}
        if via == "token":
            data["t"] = self._token_tag()
        max_age = self.settings.dashboard_session_h * 3600
        self.remember(
            request, response, SESSION_COOKIE, self.signer.sign("session", data, max_age_s=max_age), max_age
        )
        viewer = Viewer(name=name, can_act=True, via=via, session=session)
        log.info("dashboard: %s signed in from %s", viewer.label, _client(request))
        return viewer

    def end_session(self, request: Request, response: Response) -> None:
        self.forget(request, response, SESSION_COOKIE)

    def set_flash(self, request: Request, response: Response, message: str) -> None:
        """Show `message` on the next page (escaped there, as all text is)."""
        value = self.signer.sign("flash", {"m": message[:MAX_FLASH]}, max_age_s=FLASH_TTL_S)
        self.remember(request, response, FLASH_COOKIE, value, FLASH_TTL_S)

    def flash(self, request: Request) -> str | None:
        """The message an action left for this page, if any."""
        data = self.signer.unsign("flash", request.cookies.get(FLASH_COOKIE))
        message = data.get("m") if data else None
        return message if isinstance(message, str) else None

    def finish(self, request: Request, response: Response) -> None:
        """What every page does to its answer: a message shown is forgotten, a browser given an id
        (`browser`) keeps it."""
        if FLASH_COOKIE in request.cookies:
            self.forget(request, response, FLASH_COOKIE)
        if getattr(request.state, "new_browser", False):
            value = self.signer.sign("browser", {"b": request.state.browser}, max_age_s=BROWSER_TTL_S)
            self.remember(request, response, BROWSER_COOKIE, value, BROWSER_TTL_S)

    def redirect(self, request: Request, to: str, message: str | None = None) -> RedirectResponse:
        """A 303 to `to` (a dashboard path), with `message` shown there."""
        response = RedirectResponse(local_path(to), status_code=303)
        if message:
            self.set_flash(request, response, message)
        return response

    @staticmethod
    def remember(request: Request, response: Response, name: str, value: str, max_age: float) -> None:
        """Set the dashboard's cookie `name`: for its pages only, out of scripts' reach, sent along
        by other sites' links but not their forms, over https only when the request came so."""
        response.set_cookie(
            name,
            value,
            max_age=int(max_age),
            path=PREFIX,
            secure=_https(request),
            httponly=True,
            samesite="lax",
        )

    @staticmethod
    def forget(request: Request, response: Response, name: str) -> None:
        response.delete_cookie(name, path=PREFIX, secure=_https(request), httponly=True, samesite="lax")

    def page_headers(self) -> dict[str, str]:
        """Headers every page is sent with: no framing by other sites, no sniffing, no caching."""
        return {
            "X-Frame-Options": "DENY",
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "same-origin",
            "Cache-Control": "no-store",
            "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; "
            "script-src 'self'; frame-ancestors 'none'; form-action 'self'",
        }


def _https(request: Request) -> bool:
    return request.url.scheme == "https"


def _client(request: Request) -> str:
    return request.client.host if request.client is not None else "unknown"


_NAME = re.compile(r"[^\x00-\x1f\x7f-\x9f]{1,64}")


def person_name(text: str) -> str | None:
    """A name a person gives (signing in with a token), trimmed, or None when it cannot be one:
    empty, longer than `MAX_NAME`, or holding a control character or a lone surrogate."""
    text = " ".join(text.split())
    if not _NAME.fullmatch(text):
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return text
