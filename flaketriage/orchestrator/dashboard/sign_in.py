"""Signing in and out of the dashboard: the sign-in page, the token form, the GitHub OAuth App's
web flow (``/dashboard/login/github`` and its callback), signing out, and the page a refused
request gets (`install`).

The sign-in page is always open (so are the static files and ``/healthz``). Each way in ends the
same: a new session cookie (`Access.start_session`), a line in the log, and a 303 back to the page
the person came from (``next``: a dashboard path only, never another site).
"""

from __future__ import annotations

import hmac
import secrets
from typing import TYPE_CHECKING
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from flaketriage.orchestrator.dashboard.access import (
    OAUTH_COOKIE,
    OAUTH_TTL_S,
    PREFIX,
    AccessRefused,
    local_path,
    log,
    person_name,
)

if TYPE_CHECKING:
    from fastapi import FastAPI

    from flaketriage.orchestrator.dashboard.views import Views

LOGIN = f"{PREFIX}/login"


def after_login(text: str | None) -> str:
    """Where signing in leads: the dashboard page `text` names, not the sign-in page itself."""
    path = local_path(text)
    return PREFIX if path.startswith(LOGIN) else path


def refused_page(views: Views, request: Request, exc: AccessRefused) -> Response:
    """The answer to a refused request: a reader who may not read is sent to sign in (303);
    anything else gets a page saying why, with the refusal's status."""
    login = f"{LOGIN}?next={quote(exc.back, safe='/')}"
    if exc.sign_in and request.method in ("GET", "HEAD"):
        return RedirectResponse(login, status_code=303)
    log.warning("dashboard: refused %s %s (%d): %s", request.method, request.url.path, exc.status, exc.detail)
    return views.page(
        request,
        "refused.html",
        status_code=exc.status,
        title="Not allowed" if exc.status == 403 else "Not understood",
        page_key="",
        detail=exc.detail,
        login=login if exc.sign_in else None,
        back=exc.back,
    )


def install(app: FastAPI, views: Views) -> None:
    """Answer `AccessRefused`, wherever in the dashboard it is raised, with `refused_page`."""

    async def handler(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, AccessRefused)
        return refused_page(views, request, exc)

    app.add_exception_handler(AccessRefused, handler)


def router(views: Views) -> APIRouter:
    """The sign-in page, the token and GitHub sign-ins, and signing out."""
    routes = APIRouter()
    access = views.access
    settings = access.settings

    def page(
        request: Request, next_path: str, *, message: str | None = None, status: int = 200, name: str = ""
    ) -> HTMLResponse:
        access.browser(request)  # the form's token needs an id of the browser's before signing in
        return views.page(
            request,
            "login.html",
            status_code=status,
            title="Sign in",
            page_key="",
            next_path=next_path,
            token_login=bool(settings.dashboard_tokens()),
            github_login=settings.github_login_ready(),
            message=message,
            name=name,
        )

    def callback_url(request: Request) -> str:
        base = settings.service_url or str(request.base_url).rstrip("/")
        return f"{base}{PREFIX}/login/github/callback"

    def signed_in(request: Request, name: str, via: str, next_path: str) -> Response:
        response = access.redirect(request, next_path, f"Signed in as {name}.")
        access.start_session(request, response, name, via)
        return response

    @routes.get("/login", response_class=HTMLResponse)
    def login_page(request: Request, next: str | None = None) -> HTMLResponse:
        return page(request, after_login(next))

    @routes.post("/login", response_class=HTMLResponse)
    async def token_sign_in(request: Request) -> Response:
        form = await access.form(request)
        access.check_form(request, form, act=False)  # the form's token: no signing in from another site
        next_path = after_login(form.get("next"))
        if not settings.dashboard_tokens():
            return page(request, next_path, message="Signing in with a token is not set up here.", status=403)
        name = person_name(form.get("name") or "token")
        if name is None:
            message = "Give a name of 1 to 64 characters, no control characters (it is logged)."
            return page(request, next_path, message=message, status=400)
        if not access.token_matches(form.get("token", "")):
            log.warning(
                "dashboard: a wrong token from %s (as %r)",
                request.client.host if request.client else "?",
                name,
            )
            return page(
                request, next_path, message="That is not the dashboard's token.", status=401, name=name
            )
        return signed_in(request, name, "token", next_path)

    @routes.get("/login/github")
    def github_start(request: Request, next: str | None = None) -> Response:
        from flaketriage.orchestrator.dashboard.github_login import GitHubLogin

        next_path = after_login(next)
        if not settings.github_login_ready():
            return page(request, next_path, message="Signing in with GitHub is not set up here.", status=404)
        state = secrets.token_urlsafe(24)
        response = RedirectResponse(
            GitHubLogin(settings).authorize_url(state, callback_url(request)), status_code=303
        )
        value = access.signer.sign("oauth", {"st": state, "nx": next_path}, max_age_s=OAUTH_TTL_S)
        access.remember(request, response, OAUTH_COOKIE, value, OAUTH_TTL_S)
        return response

    @routes.get("/login/github/callback")
    def github_callback(
        request: Request, code: str | None = None, state: str | None = None, error: str | None = None
    ) -> Response:
        from flaketriage.orchestrator.dashboard.github_login import GitHubLogin, GitHubLoginError

        started = access.signer.unsign("oauth", request.cookies.get(OAUTH_COOKIE))
        expected = started.get("st") if started else None
        given = (state or "").encode("utf-8", "surrogatepass")
        if not isinstance(expected, str) or not hmac.compare_digest(given, expected.encode("ascii")):
            raise AccessRefused(
                "this GitHub sign-in was not started in this browser, or took longer than 10 minutes: "
                "sign in again",
                back=LOGIN,
            )
        assert started is not None
        next_path = after_login(str(started.get("nx")))
        response: Response
        if error or not code:
            said = f" ({error[:100]})" if error else ""
            response = page(request, next_path, message=f"GitHub did not sign you in{said}.", status=403)
        else:
            try:
                login = GitHubLogin(settings).sign_in(code, callback_url(request))
            except GitHubLoginError as exc:
                log.warning("dashboard: a GitHub sign-in refused: %s", exc)
                response = page(request, next_path, message=f"Not signed in: {exc}.", status=403)
            else:
                response = signed_in(request, login, "github", next_path)
        access.forget(request, response, OAUTH_COOKIE)  # a state serves once
        return response

    @routes.post("/logout")
    async def sign_out(request: Request) -> Response:
        form = await access.form(request)
        viewer = access.viewer(request)
        if not viewer.can_act:
            return access.redirect(request, PREFIX, "You are signed out.")
        access.check_form(request, form)
        response = access.redirect(request, PREFIX, "Signed out.")
        access.end_session(request, response)
        log.info("dashboard: %s signed out", viewer.label)
        return response

    return routes
