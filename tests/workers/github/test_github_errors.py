"""GitHub's refusals, each one clear `IssueTrackerError`; rate limits retried; the GitHub App's
installation-token flow; and the settings that pick GitHub over Markdown files."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from flaketriage.errors import ConfigError, IssueTrackerError, ReportError
from flaketriage.settings import load_settings
from flaketriage.workers.comments import MarkdownCommenter, open_commenter
from flaketriage.workers.report import MarkdownIssueSink
from flaketriage.workers.report.backend import open_issue_sink
from flaketriage.workers.report.github_client import GitHubClient, GitHubConfig
from flaketriage.workers.report.github_sink import GitHubCommenter, GitHubIssueSink
from tests.conftest import free_port
from tests.workers.github.conftest import REPO, TOKEN, config, draft
from tests.workers.github.stand_in import GitHubStandIn

SinkFactory = Callable[..., GitHubIssueSink]
ISSUES = rf"/repos/{REPO}/issues"


def refused(sink: GitHubIssueSink) -> IssueTrackerError:
    with pytest.raises(IssueTrackerError) as info:
        sink.upsert(draft("a" * 64))
    error = info.value
    assert isinstance(error, ReportError) and "\n" not in str(error)
    return error


# -- one clear error per status ---------------------------------------------------------------------
def test_bad_credentials_401(github: GitHubStandIn, make_sink: SinkFactory) -> None:
    error = refused(make_sink(token="ghp_revoked"))
    assert error.status == 401
    assert "GitHub refused the credentials (401 'Bad credentials')" in str(error)
    assert "FLAKETRIAGE_GITHUB_TOKEN is wrong, expired or revoked" in str(error)
    assert github.calls[-1].status == 401 and github.calls_to("POST", ISSUES) == []


def test_unknown_repository_404(github: GitHubStandIn, make_sink: SinkFactory) -> None:
    error = refused(make_sink(repo="acme/no-such-repo"))
    assert error.status == 404
    assert "the repository acme/no-such-repo does not exist" in str(error)
    assert "FLAKETRIAGE_GITHUB_REPO" in str(error) and github.url in str(error)


def test_a_token_without_access_to_a_private_repository_sees_404(
    github: GitHubStandIn, make_sink: SinkFactory
) -> None:
    github.add_token("ghp_other", repos={"acme/other"})
    error = refused(make_sink(token="ghp_other"))
    assert error.status == 404 and "cannot see it" in str(error)


def test_issues_disabled_410(github: GitHubStandIn, make_sink: SinkFactory) -> None:
    github.repos[REPO].has_issues = False
    error = refused(make_sink())
    assert error.status == 410 and "issues are disabled on acme/models" in str(error)
    # Disabled after the sink opened the repository: GitHub's own 410, the same advice.
    github.repos[REPO].has_issues = True
    sink = make_sink()
    sink.upsert(draft("a" * 64))
    github.repos[REPO].has_issues = False
    error = refused(sink)
    assert error.status == 410 and "'Issues are disabled for this repo'" in str(error)
    assert "enable Issues in the repository's settings" in str(error)


def test_read_only_token_403(github: GitHubStandIn, make_sink: SinkFactory) -> None:
    github.add_token("ghp_readonly", write=False)
    error = refused(make_sink(token="ghp_readonly"))
    assert error.status == 403
    assert "'Resource not accessible by personal access token'" in str(error)
    assert "Issues read/write" in str(error) and "`repo` scope" in str(error)


def test_validation_failed_422(github: GitHubStandIn) -> None:
    client = GitHubClient(config(github))
    with pytest.raises(IssueTrackerError) as info, client.calling("filing an issue"):
        client.repo().create_issue(title="   ", body="b")  # what the stand-in and GitHub refuse
    assert info.value.status == 422
    assert (
        "GitHub refused filing an issue as invalid (422 'Validation Failed': Issue title missing_field)"
        in str(info.value)
    )
    with pytest.raises(IssueTrackerError) as info, client.calling("filing an issue"):
        client.repo().create_issue(title="t", body="x" * 65537)
    assert "body is too long (maximum is 65536 characters)" in str(info.value)


def test_a_server_that_keeps_failing_is_one_error_after_the_retries(
    github: GitHubStandIn, make_sink: SinkFactory
) -> None:
    github.fail("GET", f"/repos/{REPO}", 502, times=10, message="Server Error")
    error = refused(make_sink())
    assert error.status == 502 and "probably having an outage" in str(error)
    assert len(github.calls_to("GET", f"/repos/{REPO}")) == 4  # the first try and 3 retries


def test_an_unreachable_api_is_one_error(make_sink: SinkFactory) -> None:
    error = refused(make_sink(api_url=f"http://127.0.0.1:{free_port()}/api/v3"))
    assert error.status is None and "cannot reach GitHub at http://127.0.0.1:" in str(error)
    assert "FLAKETRIAGE_GITHUB_API_URL" in str(error)


def test_a_primary_rate_limit_beyond_the_longest_wait_fails_instead_of_stalling(
    github: GitHubStandIn, make_sink: SinkFactory
) -> None:
    reset = str(int(time.time()) + 3600)
    github.fail(
        "POST",
        ISSUES,
        403,
        message="API rate limit exceeded for user ID 1.",
        headers={"x-ratelimit-remaining": "0", "x-ratelimit-reset": reset},
    )
    started = time.monotonic()
    error = refused(make_sink(max_rate_limit_wait_s=5))
    assert time.monotonic() - started < 5
    assert error.status == 403 and "rate limit stopped filing an issue" in str(error) and reset in str(error)


# -- secondary rate limits --------------------------------------------------------------------------
@pytest.mark.parametrize("status", [403, 429])
def test_a_secondary_rate_limit_is_waited_out_and_retried(
    github: GitHubStandIn, make_sink: SinkFactory, status: int
) -> None:
    github.secondary_rate_limit("POST", ISSUES, status=status, retry_after=1)
    started = time.monotonic()
    ref = make_sink().upsert(draft("a" * 64))
    assert ref.created and time.monotonic() - started >= 1.0  # it waited what retry-after said
    assert [c.status for c in github.calls_to("POST", ISSUES)] == [status, 201]
    assert len(github.issues()) == 1


def test_secondary_rate_limits_on_an_update_and_a_comment_are_retried(
    github: GitHubStandIn, make_sink: SinkFactory
) -> None:
    sink = make_sink()
    sink.upsert(draft("a" * 64))
    github.secondary_rate_limit("PATCH", rf"{ISSUES}/1")
    github.secondary_rate_limit("POST", rf"{ISSUES}/1/comments")
    sink.upsert(draft("b" * 64))
    assert len(github.comments(1)) == 1 and len(github.issues()) == 1


# -- the GitHub App ---------------------------------------------------------------------------------
def _key_pair() -> tuple[str, str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return private, public


@pytest.fixture(scope="module")
def app_keys() -> tuple[str, str]:
    return _key_pair()


def test_a_github_app_trades_its_signed_jwt_for_an_installation_token(
    github: GitHubStandIn, make_sink: SinkFactory, app_keys: tuple[str, str]
) -> None:
    private, public = app_keys
    github.add_app("12345", public, {777: {REPO}})
    ref = make_sink(token=None, app_id="12345", app_private_key=private).upsert(draft("a" * 64))
    assert ref.created and len(github.issues()) == 1
    [lookup] = github.calls_to("GET", f"/repos/{REPO}/installation")
    [exchange] = github.calls_to("POST", "/app/installations/777/access_tokens")
    for call in (lookup, exchange):
        scheme, token = call.headers["authorization"].split(" ", 1)
        assert scheme == "Bearer"
        claims = jwt.decode(token, public, algorithms=["RS256"])  # signed with the App's key
        assert claims["iss"] == "12345" and claims["exp"] - claims["iat"] <= 660
    [filed] = github.calls_to("POST", ISSUES)
    assert filed.headers["authorization"].startswith("token ghs_")  # the installation token


def test_a_known_installation_id_skips_the_lookup(
    github: GitHubStandIn, make_sink: SinkFactory, app_keys: tuple[str, str]
) -> None:
    private, public = app_keys
    github.add_app("12345", public, {777: {REPO}})
    make_sink(token=None, app_id="12345", app_private_key=private, app_installation_id=777).upsert(
        draft("a" * 64)
    )
    assert github.calls_to("GET", f"/repos/{REPO}/installation") == []
    assert len(github.issues()) == 1


def test_an_app_key_that_is_not_the_apps_is_refused_clearly(
    github: GitHubStandIn, make_sink: SinkFactory, app_keys: tuple[str, str]
) -> None:
    github.add_app("12345", app_keys[1], {777: {REPO}})
    other_private, _ = _key_pair()
    error = refused(make_sink(token=None, app_id="12345", app_private_key=other_private))
    assert error.status == 401 and "GitHub App 12345's installation" in str(error)
    assert "FLAKETRIAGE_GITHUB_APP_PRIVATE_KEY is that App's current private key" in str(error)


def test_an_app_not_installed_on_the_repository_says_so(
    github: GitHubStandIn, make_sink: SinkFactory, app_keys: tuple[str, str]
) -> None:
    github.add_app("12345", app_keys[1], {777: {"acme/other"}})
    error = refused(make_sink(token=None, app_id="12345", app_private_key=app_keys[0]))
    assert error.status == 404 and "install the App on the repository" in str(error)


# -- settings ---------------------------------------------------------------------------------------
def test_settings_pick_github_only_with_a_repository_and_credentials(
    tmp_path: Path, github: GitHubStandIn, app_keys: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [n for n in os.environ if n.startswith("FLAKETRIAGE_GITHUB_")]:
        monkeypatch.delenv(name)
    base = {"store": str(tmp_path / "store"), "github_api_url": github.url}
    assert isinstance(open_issue_sink(load_settings(**base)), MarkdownIssueSink)
    assert isinstance(open_commenter(load_settings(**base)), MarkdownCommenter)
    with pytest.raises(
        ConfigError, match="FLAKETRIAGE_GITHUB_REPO=acme/models is set but there are no GitHub"
    ):
        open_issue_sink(load_settings(**base, github_repo=REPO))
    with pytest.raises(
        ConfigError, match="FLAKETRIAGE_GITHUB_APP_ID is set but FLAKETRIAGE_GITHUB_APP_PRIVATE_KEY"
    ):
        open_issue_sink(load_settings(**base, github_repo=REPO, github_app_id="12345"))
    sink = open_issue_sink(load_settings(**base, github_repo=REPO, github_token=TOKEN))
    assert isinstance(sink, GitHubIssueSink) and sink.client.config.token == TOKEN
    assert isinstance(
        open_commenter(load_settings(**base, github_repo=REPO, github_token=TOKEN)), GitHubCommenter
    )
    # An App's key may be given as its file; the App wins over a token.
    pem = tmp_path / "app.pem"
    pem.write_text(app_keys[0])
    settings = load_settings(
        **base, github_repo=REPO, github_token=TOKEN, github_app_id="12345", github_app_private_key=str(pem)
    )
    parsed = GitHubConfig.from_settings(settings)
    assert parsed is not None and parsed.token is None and parsed.app_private_key == app_keys[0]
    bad = load_settings(
        **base, github_repo=REPO, github_app_id="1", github_app_private_key=str(tmp_path / "nope")
    )
    with pytest.raises(ConfigError, match="neither PEM text"):
        GitHubConfig.from_settings(bad)
    monkeypatch.setenv("FLAKETRIAGE_GITHUB_REPO", "acme")
    with pytest.raises(ConfigError, match="FLAKETRIAGE_GITHUB_REPO=acme is not valid: must be owner/name"):
        load_settings()
    monkeypatch.delenv("FLAKETRIAGE_GITHUB_REPO")
    # Markdown issues need no issues directory once GitHub takes them, even with a remote store.
    remote = {**base, "store": "memory://elsewhere", "github_repo": REPO, "github_token": TOKEN}
    assert isinstance(open_issue_sink(load_settings(**remote)), GitHubIssueSink)
