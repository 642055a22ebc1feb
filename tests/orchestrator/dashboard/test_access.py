"""Who may read the dashboard and who may act: signing in with a token (a signed, HttpOnly,
SameSite=Lax session cookie, Secure over https), a session that does not verify is anonymous, the
GitHub OAuth App's web flow against a stand-in speaking GitHub's documented flow, reading behind a
sign-in or a list of trusted networks, signing out, and ``next=`` leading nowhere but back into the
dashboard. SQLite and PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from fastapi.testclient import TestClient

from flaketriage.orchestrator.dashboard.access import SESSION_COOKIE, local_path
from flaketriage.orchestrator.dashboard.cookies import Signer
from flaketriage.records import Database
from tests.orchestrator.dashboard.conftest import Dashboard
from tests.orchestrator.dashboard.github_oauth import CLIENT_ID, CLIENT_SECRET, GitHubOAuth
from tests.orchestrator.dashboard.reading import Page
from tests.orchestrator.dashboard.signing_in import (
    SECRET,
    TOKEN,
    client,
    make_dashboard,
    page_token,
    sign_in,
    signed_in,
)

CALLBACK = "http://testserver/dashboard/login/github/callback"


@pytest.fixture
def dashboard(database: Database, tmp_path: Path) -> Iterator[Dashboard]:
    made = make_dashboard(database, tmp_path)
    yield made
    made.client.close()


def cookie_attributes(response: Any, name: str) -> dict[str, str]:
    """The attributes of the Set-Cookie header that sets `name` (lowercased names)."""
    for header in response.headers.get_list("set-cookie"):
        first, *rest = [part.strip() for part in header.split(";")]
        if first.startswith(name + "="):
            out = {"value": first.partition("=")[2]}
            for part in rest:
                key, _, value = part.partition("=")
                out[key.lower()] = value
            return out
    raise AssertionError(f"no Set-Cookie for {name}: {response.headers.get_list('set-cookie')}")


def viewer_of(browser: TestClient) -> str:
    """What the page header says about who is looking."""
    return Page(browser.get("/dashboard/login").text).root.iter("header")[0].text


# -- the token ------------------------------------------------------------------------------------
def test_the_right_token_signs_in_with_a_signed_httponly_lax_cookie(dashboard: Dashboard) -> None:
    answer = sign_in(dashboard.client, name="alice", next_path="/dashboard/cases?verdict=flaky")
    assert answer.status_code == 303
    assert answer.headers["location"] == "/dashboard/cases?verdict=flaky"
    cookie = cookie_attributes(answer, SESSION_COOKIE)
    assert "httponly" in cookie and cookie["samesite"] == "lax" and cookie["path"] == "/dashboard"
    assert "secure" not in cookie  # plain http here: a Secure cookie would never come back
    assert int(cookie["max-age"]) == 12 * 3600
    session = Signer(SECRET.encode()).unsign("session", cookie["value"])
    assert session is not None and session["n"] == "alice" and session["v"] == "token"
    assert TOKEN not in cookie["value"]
    page = dashboard.client.get("/dashboard/cases?verdict=flaky")
    assert page.status_code == 200
    assert "Signed in as alice" in Page(page.text).root.iter("header")[0].text
    assert (
        Page(page.text).root.iter("main")[0].iter("p")[0].text == "Signed in as alice."
    )  # the message, once
    assert "Signed in as alice." not in dashboard.client.get("/dashboard/cases").text


def test_over_https_the_session_cookie_is_secure(dashboard: Dashboard) -> None:
    browser = client(dashboard.service, base_url="https://testserver")
    answer = sign_in(browser)
    assert answer.status_code == 303
    assert "secure" in cookie_attributes(answer, SESSION_COOKIE)


def test_a_wrong_token_is_refused_and_signs_nobody_in(
    dashboard: Dashboard, caplog: pytest.LogCaptureFixture
) -> None:
    answer = sign_in(dashboard.client, token=TOKEN + "x")
    assert answer.status_code == 401
    assert Page(answer.text).text("login-message") == "That is not the dashboard's token."
    assert SESSION_COOKIE not in answer.cookies
    assert "Sign in" in viewer_of(dashboard.client)
    assert any("a wrong token" in r.getMessage() for r in caplog.records)
    assert sign_in(dashboard.client, token="").status_code == 401


def test_the_sign_in_form_needs_its_token(dashboard: Dashboard) -> None:
    browser = dashboard.client
    browser.get("/dashboard/login")
    for form in (
        {"name": "alice", "token": TOKEN},
        {"name": "alice", "token": TOKEN, "csrf_token": "forged"},
        {"name": "alice", "token": TOKEN, "csrf_token": page_token(client(dashboard.service))},
    ):
        answer = browser.post("/dashboard/login", data=form)
        assert answer.status_code == 403, form
        assert "token is missing or is not this session" in Page(answer.text).text("refusal")
        assert SESSION_COOKIE not in answer.cookies
    answer = browser.post(
        "/dashboard/login",
        data={"name": "alice", "token": TOKEN, "csrf_token": page_token(browser)},
        headers={"Origin": "https://evil.example"},
    )
    assert answer.status_code == 403 and "from another site" in answer.text


@pytest.mark.parametrize("name", ["a\x00b", "x" * 65, "tab\there\x1b[31m"])
def test_a_name_that_cannot_be_shown_is_refused(dashboard: Dashboard, name: str) -> None:
    answer = sign_in(dashboard.client, name=name)
    assert answer.status_code == 400
    assert SESSION_COOKIE not in answer.cookies


def test_a_name_with_html_is_shown_as_text(dashboard: Dashboard) -> None:
    assert sign_in(dashboard.client, name="<script>alert(1)</script>").status_code == 303
    html = dashboard.client.get("/dashboard").text
    assert "<script>alert(1)</script>" not in html
    assert "Signed in as &lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_a_cookie_that_does_not_verify_is_an_anonymous_reader(dashboard: Dashboard) -> None:
    browser = signed_in(dashboard.service)
    good = browser.cookies[SESSION_COOKIE]
    signer = Signer(SECRET.encode())
    session = signer.unsign("session", good)
    assert session is not None
    body = {k: v for k, v in session.items() if k != "exp"}
    tampered = good[:-3] + ("AAA" if not good.endswith("AAA") else "BBB")
    forged = Signer(b"another key of 32 characters....").sign("session", body, max_age_s=3600)
    expired = signer.sign("session", body, max_age_s=3600, now=time.time() - 7200)
    as_flash = signer.sign("flash", body, max_age_s=3600)  # signed, but for another cookie
    renamed = signer.sign("session", body | {"n": "mallory", "s": "x"}, max_age_s=3600)
    for value in (tampered, forged, expired, as_flash, "garbage", "a.b.c", "x" * 5000):
        other = client(dashboard.service, cookies={SESSION_COOKIE: value})
        assert "Signed in" not in viewer_of(other), value
    assert "Signed in as mallory" in viewer_of(client(dashboard.service, cookies={SESSION_COOKIE: renamed}))
    assert "Signed in as alice" in viewer_of(browser)


def test_changing_the_token_or_the_secret_signs_token_sessions_out(
    dashboard: Dashboard, database: Database, tmp_path: Path
) -> None:
    cookie = signed_in(dashboard.service).cookies[SESSION_COOKIE]
    same = make_dashboard(database, tmp_path)
    assert "Signed in as alice" in viewer_of(client(same.service, cookies={SESSION_COOKIE: cookie}))
    for changed in (
        make_dashboard(database, tmp_path, dashboard_token="another-token-" + "t" * 20),
        make_dashboard(database, tmp_path, dashboard_secret="another-secret-" + "z" * 32),
    ):
        assert "Signed in" not in viewer_of(client(changed.service, cookies={SESSION_COOKIE: cookie}))


def test_the_api_token_signs_in_when_the_dashboard_has_none(database: Database, tmp_path: Path) -> None:
    made = make_dashboard(database, tmp_path, dashboard_token=None, api_token="api-token-" + "a" * 20)
    assert sign_in(made.client, token=TOKEN).status_code == 401
    assert sign_in(made.client, token="api-token-" + "a" * 20).status_code == 303


def test_without_a_token_or_github_nobody_signs_in(database: Database, tmp_path: Path) -> None:
    made = make_dashboard(database, tmp_path, dashboard_token=None)
    page = made.client.get("/dashboard/login")
    assert "Nobody can sign in here" in Page(page.text).text("no-login")
    assert 'id="token-form"' not in page.text
    signer = Signer(SECRET.encode())
    browser = signer.unsign("browser", made.client.cookies["ft_browser"])
    assert browser is not None
    form = {"csrf_token": signer.mac("csrf", browser["b"]), "token": ""}  # what a form would carry
    answer = made.client.post("/dashboard/login", data=form)
    assert answer.status_code == 403 and SESSION_COOKIE not in answer.cookies
    assert "not set up here" in Page(answer.text).text("login-message")


def test_without_a_secret_sessions_are_signed_with_a_random_key_and_a_warning(
    database: Database, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = make_dashboard(database, tmp_path, dashboard_secret=None)
    assert any("FLAKETRIAGE_DASHBOARD_SECRET is not set" in r.getMessage() for r in caplog.records)
    cookie = signed_in(first.service).cookies[SESSION_COOKIE]
    restarted = make_dashboard(database, tmp_path, dashboard_secret=None)
    assert "Signed in" not in viewer_of(client(restarted.service, cookies={SESSION_COOKIE: cookie}))


def test_a_short_secret_is_a_setting_error(database: Database, tmp_path: Path) -> None:
    from flaketriage.errors import ConfigError

    with pytest.raises(ConfigError, match="dashboard_secret=\\*\\*\\* is not valid: must be at least 32"):
        make_dashboard(database, tmp_path, dashboard_secret="short")


# -- signing out ----------------------------------------------------------------------------------
def test_signing_out_is_a_post_with_the_form_token(dashboard: Dashboard) -> None:
    browser = signed_in(dashboard.service)
    assert browser.get("/dashboard/logout").status_code == 405
    refused = browser.post("/dashboard/logout", data={"csrf_token": "forged"})
    assert refused.status_code == 403
    assert "Signed in as alice" in viewer_of(browser)
    answer = browser.post("/dashboard/logout", data={"csrf_token": page_token(browser)})
    assert answer.status_code == 303 and answer.headers["location"] == "/dashboard"
    assert cookie_attributes(answer, SESSION_COOKIE)["max-age"] == "0"
    assert "Signed in" not in viewer_of(browser)


# -- reading --------------------------------------------------------------------------------------
def test_reading_is_open_by_default(dashboard: Dashboard) -> None:
    for path in ("/dashboard", "/dashboard/cases", "/dashboard/login"):
        assert dashboard.client.get(path).status_code == 200, path


def test_read_login_sends_anonymous_readers_to_sign_in(database: Database, tmp_path: Path) -> None:
    made = make_dashboard(database, tmp_path, dashboard_read="login")
    browser = made.client
    for path, back in (
        ("/dashboard", "/dashboard"),
        ("/dashboard/cases?verdict=flaky&page=2", "/dashboard/cases?verdict=flaky&page=2"),
        ("/dashboard/cases/1", "/dashboard/cases/1"),
    ):
        answer = browser.get(path)
        assert answer.status_code == 303, path
        location = urlsplit(answer.headers["location"])
        assert location.path == "/dashboard/login"
        assert parse_qs(location.query)["next"] == [back]
    # Open still: the sign-in page, the static files, the health check.
    assert browser.get("/dashboard/login").status_code == 200
    assert browser.get("/dashboard/static/style.css").status_code == 200
    assert browser.get("/healthz").status_code == 200
    answer = sign_in(browser, next_path="/dashboard/cases?verdict=flaky")
    assert answer.headers["location"] == "/dashboard/cases?verdict=flaky"
    assert browser.get("/dashboard/cases?verdict=flaky").status_code == 200
    bearer = client(made.service, headers={"Authorization": f"Bearer {TOKEN}"})
    assert bearer.get("/dashboard").status_code == 200


def test_trusted_networks_read_and_others_sign_in(database: Database, tmp_path: Path) -> None:
    made = make_dashboard(database, tmp_path, dashboard_trusted_networks=["10.0.0.0/8", "2001:db8::/32"])
    assert client(made.service, client=("10.1.2.3", 4000)).get("/dashboard").status_code == 200
    assert client(made.service, client=("2001:db8::7", 4000)).get("/dashboard").status_code == 200
    for outside in ("192.0.2.1", "11.0.0.1", "testclient"):
        answer = client(made.service, client=(outside, 4000)).get("/dashboard")
        assert answer.status_code == 303 and answer.headers["location"].startswith("/dashboard/login"), (
            outside
        )
    elsewhere = client(made.service, client=("192.0.2.1", 4000))
    sign_in(elsewhere)
    assert elsewhere.get("/dashboard").status_code == 200


@pytest.mark.parametrize(
    "next_path",
    [
        "https://evil.example/dashboard",
        "//evil.example/dashboard",
        "/\\evil.example",
        "\\\\evil.example",
        "javascript:alert(1)",
        "/dashboard/../v1/cases",
        "/dashboard\x00/cases",
        "/v1/quarantine",
        "/dashboard/login",
        "/dashboardx",
        " https://evil.example",
        "/dashboard#fragment",
    ],
)
def test_next_never_leads_out_of_the_dashboard(dashboard: Dashboard, next_path: str) -> None:
    assert local_path(next_path) == "/dashboard" or next_path == "/dashboard/login"
    answer = sign_in(dashboard.client, next_path=next_path)
    assert answer.status_code == 303
    assert answer.headers["location"] == "/dashboard"


@pytest.mark.parametrize("field", ["next=%ED%A0%80", "name=%ED%A0%80", "token=%00%FF", "next=%00"])
def test_forms_with_text_that_is_not_utf8_or_nul_change_nothing(dashboard: Dashboard, field: str) -> None:
    browser = dashboard.client
    body = f"csrf_token={page_token(browser)}&name=alice&token={TOKEN}&{field}".encode()
    answer = browser.post(
        "/dashboard/login", content=body, headers={"Content-Type": "application/x-www-form-urlencoded"}
    )
    if field == "next=%00":  # a NUL in next is no path: signed in, and sent home
        assert answer.status_code == 303 and answer.headers["location"] == "/dashboard"
        return
    assert answer.status_code == 400
    assert SESSION_COOKIE not in answer.cookies


@pytest.mark.parametrize(
    "query",
    [
        "next=%00",
        "next=%ED%A0%80",
        "next=%3Cscript%3Ealert(1)%3C/script%3E",
        "next=https://evil.example",
        "next=",
    ],
)
def test_the_sign_in_page_takes_hostile_next_as_nothing(dashboard: Dashboard, query: str) -> None:
    answer = dashboard.client.get(f"/dashboard/login?{query}")
    assert answer.status_code == 200
    assert '<input type="hidden" name="next" value="/dashboard">' in answer.text
    assert "<script>alert" not in answer.text and "evil.example" not in answer.text


def test_pages_are_sent_with_the_strict_headers(dashboard: Dashboard) -> None:
    answer = dashboard.client.get("/dashboard/login")
    assert "script-src 'self'" in answer.headers["content-security-policy"]
    assert answer.headers["x-frame-options"] == "DENY"
    assert "style=" not in answer.text and "<style" not in answer.text
    labels = {label.attrs.get("for") for label in Page(answer.text).root.iter("label")}
    assert {"login-name", "login-token"} <= labels


# -- GitHub ---------------------------------------------------------------------------------------
@pytest.fixture
def github() -> Iterator[GitHubOAuth]:
    server = GitHubOAuth(callback=CALLBACK).start()
    server.add_user("octocat", name="The Octocat")
    server.add_user("mallory")
    yield server
    server.stop()


def github_dashboard(database: Database, tmp_path: Path, github: GitHubOAuth, **settings: Any) -> Dashboard:
    options: dict[str, Any] = {
        "github_oauth_client_id": CLIENT_ID,
        "github_oauth_client_secret": CLIENT_SECRET,
        "github_oauth_url": github.url,
        "github_api_url": github.url,
        "dashboard_github_users": ["OctoCat"],
    }
    return make_dashboard(database, tmp_path, **(options | settings))


def authorize(browser: TestClient, *, next_path: str = "/dashboard/cases") -> tuple[str, dict[str, str]]:
    """Start the sign-in and let GitHub's authorize page answer: the callback's path and query."""
    start = browser.get("/dashboard/login/github", params={"next": next_path})
    assert start.status_code == 303, start.text
    consent = httpx.get(start.headers["location"], follow_redirects=False)
    assert consent.status_code == 302, consent.text
    back = urlsplit(consent.headers["location"])
    assert f"{back.scheme}://{back.netloc}{back.path}" == CALLBACK
    return back.path, {k: v[0] for k, v in parse_qs(back.query).items()}


def test_github_sign_in_through_the_web_flow(database: Database, tmp_path: Path, github: GitHubOAuth) -> None:
    made = github_dashboard(database, tmp_path, github)
    login_page = Page(made.client.get("/dashboard/login").text)
    assert ("/dashboard/login/github?next=/dashboard", "Sign in with GitHub") in login_page.links()
    start = made.client.get("/dashboard/login/github")
    sent = urlsplit(start.headers["location"])
    query = parse_qs(sent.query)
    assert sent.path == "/login/oauth/authorize" and query["client_id"] == [CLIENT_ID]
    assert query["redirect_uri"] == [CALLBACK] and "scope" not in query and len(query["state"][0]) >= 32
    oauth = cookie_attributes(start, "ft_oauth")
    assert "httponly" in oauth and oauth["samesite"] == "lax"

    path, back = authorize(made.client, next_path="/dashboard/cases?verdict=flaky")
    answer = made.client.get(path, params=back)
    assert answer.status_code == 303, answer.text
    assert answer.headers["location"] == "/dashboard/cases?verdict=flaky"
    assert "Signed in as octocat" in viewer_of(made.client)
    assert github.calls[-2:] == ["POST /login/oauth/access_token", "GET /user"]
    # The state served once: the same callback again is refused.
    assert made.client.get(path, params=back).status_code == 403


def test_github_state_must_be_this_browsers(database: Database, tmp_path: Path, github: GitHubOAuth) -> None:
    made = github_dashboard(database, tmp_path, github)
    path, back = authorize(made.client)
    calls = len(github.calls)
    wrong = made.client.get(path, params=back | {"state": back["state"][:-2] + "xx"})
    assert wrong.status_code == 403
    assert "not started in this browser" in Page(wrong.text).text("refusal")
    other = client(made.service)  # the attacker's code, sent to another browser
    assert other.get(path, params=back).status_code == 403
    assert made.client.get(path, params={"code": back["code"]}).status_code == 403
    assert len(github.calls) == calls, "no code may be exchanged without the state"
    assert "Signed in" not in viewer_of(made.client) and "Signed in" not in viewer_of(other)


def test_github_refusals_sign_nobody_in(database: Database, tmp_path: Path, github: GitHubOAuth) -> None:
    made = github_dashboard(database, tmp_path, github)
    github.signed_in_as = "mallory"  # not in the allow-list
    path, back = authorize(made.client)
    answer = made.client.get(path, params=back)
    assert answer.status_code == 403
    assert (
        Page(answer.text).text("login-message")
        == "Not signed in: the GitHub user mallory may not sign in here."
    )
    github.signed_in_as = "octocat"
    path, back = authorize(made.client)
    github.codes.clear()  # the code expired, or was used
    answer = made.client.get(path, params=back)
    assert answer.status_code == 403 and "bad_verification_code" in answer.text
    path, back = authorize(made.client)
    denied = made.client.get(path, params={"error": "access_denied", "state": back["state"]})
    assert denied.status_code == 403 and "GitHub did not sign you in (access_denied)" in denied.text
    assert "Signed in" not in viewer_of(made.client)


def test_github_organization_and_team_membership(
    database: Database, tmp_path: Path, github: GitHubOAuth
) -> None:
    made = github_dashboard(
        database, tmp_path, github, dashboard_github_users=[], dashboard_github_org="acme"
    )
    assert parse_qs(urlsplit(made.client.get("/dashboard/login/github").headers["location"]).query)[
        "scope"
    ] == ["read:org"]
    github.orgs["acme"] = {"octocat": "pending"}
    path, back = authorize(made.client)
    assert made.client.get(path, params=back).status_code == 403
    github.orgs["acme"]["octocat"] = "active"
    path, back = authorize(made.client)
    assert made.client.get(path, params=back).status_code == 303
    assert "GET /user/memberships/orgs/acme" in github.calls

    team = github_dashboard(
        database, tmp_path, github, dashboard_github_users=[], dashboard_github_org="acme/ml"
    )
    path, back = authorize(team.client)
    assert team.client.get(path, params=back).status_code == 403
    github.teams[("acme", "ml")] = {"octocat": "active"}
    path, back = authorize(team.client)
    assert team.client.get(path, params=back).status_code == 303
    assert "GET /orgs/acme/teams/ml/memberships/octocat" in github.calls


def test_github_sign_in_needs_its_app_and_who_may(
    database: Database, tmp_path: Path, github: GitHubOAuth
) -> None:
    unset = github_dashboard(database, tmp_path, github, dashboard_github_users=[])
    assert unset.client.get("/dashboard/login/github").status_code == 404
    assert "login/github" not in unset.client.get("/dashboard/login").text


def test_github_answers_that_are_not_json_or_down_refuse(
    database: Database, tmp_path: Path, github: GitHubOAuth
) -> None:
    made = github_dashboard(database, tmp_path, github, github_api_url="http://127.0.0.1:9")
    path, back = authorize(made.client)
    answer = made.client.get(path, params=back)
    assert answer.status_code == 403 and "GitHub did not answer" in answer.text
    assert "POST /login/oauth/access_token" in github.calls  # the code was good; /user did not answer
    assert "Signed in" not in viewer_of(made.client)
