"""A corpus of fake credentials: each generated with its format's real prefix, length and alphabet,
so a redactor sees what it would see in a CI job, but none of them opens anything.

`secrets(rng)` gives one of every format; `Secret.leaks(text)` says whether stored text still holds
any of it. The parts a redactor may keep (a PEM header, the host of a URL) are not in
`Secret.sensitive`; everything that would let someone in is.
"""

from __future__ import annotations

import base64
import json
import random
import string
from collections.abc import Callable
from dataclasses import dataclass

ALNUM = string.ascii_letters + string.digits
HEX = "0123456789abcdef"
DIGITS = string.digits
UPPER_DIGITS = string.ascii_uppercase + string.digits
B64 = ALNUM + "+/"
B64URL = ALNUM + "-_"
WINDOW = 12
"""A stored run of this many characters of a secret counts as a leak (shorter runs occur by chance)."""


@dataclass(frozen=True)
class Secret:
    """One planted credential: its format, the text planted, and the parts that must never be stored."""

    kind: str
    value: str
    sensitive: tuple[str, ...]
    env_name: str
    """A name that says it holds a secret (``AWS_SECRET_ACCESS_KEY``)."""
    shaped: bool = True
    """Recognizable by its shape alone; False for a bare random string (a password, a Datadog
    key), which only its name or the secret variable it came from gives away."""

    def leaks(self, text: str) -> str | None:
        """The first run of `WINDOW` sensitive characters found in `text`, or None."""
        for part in self.sensitive:
            size = min(WINDOW, len(part))
            for start in range(len(part) - size + 1):
                window = part[start : start + size]
                if window in text:
                    return window
        return None


Maker = Callable[[random.Random], Secret]
Parts = tuple[str, tuple[str, ...]]
"""A planted text and its sensitive parts."""


def _r(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def _pem(rng: random.Random, label: str) -> tuple[str, tuple[str, ...]]:
    lines = [_r(rng, B64, 64) for _ in range(6)] + [_r(rng, B64, 20) + "=="]
    body = "\n".join(lines)
    return f"-----BEGIN {label}-----\n{body}\n-----END {label}-----\n", tuple(lines)


def _jwt(rng: random.Random) -> str:
    def part(data: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")

    header = part({"alg": "HS256", "typ": "JWT"})
    claims = part(
        {"sub": _r(rng, HEX, 12), "name": "ci-bot", "iat": rng.randrange(1_600_000_000, 1_800_000_000)}
    )
    return f"{header}.{claims}.{_r(rng, B64URL, 43)}"


def _gcp(rng: random.Random) -> tuple[str, tuple[str, ...]]:
    key, lines = _pem(rng, "PRIVATE KEY")
    document = {
        "type": "service_account",
        "project_id": "ft-ci-project",
        "private_key_id": _r(rng, HEX, 40),
        "private_key": key,
        "client_email": "ci@ft-ci-project.iam.gserviceaccount.com",
        "client_id": _r(rng, string.digits, 21),
    }
    return json.dumps(document), lines


def _whole(kind: str, env_name: str, make: Callable[[random.Random], str], *, shaped: bool = True) -> Maker:
    def build(rng: random.Random) -> Secret:
        value = make(rng)
        return Secret(kind, value, (value,), env_name, shaped)

    return build


def _part(kind: str, env_name: str, make: Callable[[random.Random], Parts]) -> Maker:
    def build(rng: random.Random) -> Secret:
        value, sensitive = make(rng)
        return Secret(kind, value, sensitive, env_name)

    return build


def _azure(rng: random.Random) -> tuple[str, tuple[str, ...]]:
    key = _r(rng, B64, 86) + "=="
    text = f"DefaultEndpointsProtocol=https;AccountName=ftci;AccountKey={key};EndpointSuffix=core.windows.net"
    return text, (key,)


def _url_password(scheme: str, host: str) -> Callable[[random.Random], tuple[str, tuple[str, ...]]]:
    def make(rng: random.Random) -> tuple[str, tuple[str, ...]]:
        password = _r(rng, ALNUM, 24)
        return f"{scheme}://ci_user:{password}@{host}/app", (password,)

    return make


def _basic(rng: random.Random) -> tuple[str, tuple[str, ...]]:
    password = _r(rng, ALNUM, 20)
    token = base64.b64encode(f"ci-bot:{password}".encode()).decode()
    return f"Authorization: Basic {token}", (token,)


def _bearer(rng: random.Random) -> tuple[str, tuple[str, ...]]:
    token = _r(rng, ALNUM, 40)
    return f"Bearer {token}", (token,)


def _slack_webhook(rng: random.Random) -> tuple[str, tuple[str, ...]]:
    path = f"T{_r(rng, UPPER_DIGITS, 10)}/B{_r(rng, UPPER_DIGITS, 10)}/{_r(rng, ALNUM, 24)}"
    return f"https://hooks.slack.com/services/{path}", (path,)


FORMATS: tuple[Maker, ...] = (
    _whole(
        "aws_access_key_id",
        "AWS_ACCESS_KEY_ID",
        lambda r: "AKIA" + _r(r, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", 16),
    ),
    _whole(
        "aws_temporary_key_id",
        "AWS_TEMP_ACCESS_KEY_ID",
        lambda r: "ASIA" + _r(r, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", 16),
    ),
    _whole("aws_secret_access_key", "AWS_SECRET_ACCESS_KEY", lambda r: _r(r, B64, 40), shaped=False),
    _part("gcp_service_account", "GOOGLE_CREDENTIALS_JSON", _gcp),
    _part("azure_storage_connection_string", "AZURE_STORAGE_CONNECTION_STRING", _azure),
    _whole("github_classic_token", "GITHUB_TOKEN", lambda r: "ghp_" + _r(r, ALNUM, 36)),
    _whole("github_oauth_token", "GH_OAUTH_TOKEN", lambda r: "gho_" + _r(r, ALNUM, 36)),
    _whole("github_app_token", "GH_APP_TOKEN", lambda r: "ghs_" + _r(r, ALNUM, 36)),
    _whole(
        "github_fine_grained_pat", "GH_PAT", lambda r: f"github_pat_{_r(r, ALNUM, 22)}_{_r(r, ALNUM, 59)}"
    ),
    _whole("gitlab_pat", "GITLAB_TOKEN", lambda r: "glpat-" + _r(r, B64URL, 20)),
    _whole(
        "slack_bot_token",
        "SLACK_BOT_TOKEN",
        lambda r: f"xoxb-{_r(r, string.digits, 12)}-{_r(r, string.digits, 13)}-{_r(r, ALNUM, 24)}",
    ),
    _whole(
        "slack_user_token",
        "SLACK_USER_TOKEN",
        lambda r: f"xoxp-{_r(r, DIGITS, 12)}-{_r(r, DIGITS, 12)}-{_r(r, DIGITS, 13)}-{_r(r, HEX, 32)}",
    ),
    _part("slack_webhook_url", "SLACK_WEBHOOK_URL", _slack_webhook),
    _whole("stripe_secret_key", "STRIPE_SECRET_KEY", lambda r: "sk_live_" + _r(r, ALNUM, 99)),
    _whole("stripe_restricted_key", "STRIPE_RESTRICTED_KEY", lambda r: "rk_live_" + _r(r, ALNUM, 99)),
    _whole("twilio_api_key", "TWILIO_API_KEY", lambda r: "SK" + _r(r, HEX, 32)),
    _whole("sendgrid_api_key", "SENDGRID_API_KEY", lambda r: f"SG.{_r(r, B64URL, 22)}.{_r(r, B64URL, 43)}"),
    _whole("npm_token", "NPM_TOKEN", lambda r: "npm_" + _r(r, ALNUM, 36)),
    _whole("pypi_token", "PYPI_API_TOKEN", lambda r: "pypi-AgEIcHlwaS5vcmc" + _r(r, B64URL, 140)),
    _whole("huggingface_token", "HF_TOKEN", lambda r: "hf_" + _r(r, string.ascii_letters, 34)),
    _whole("openai_key", "OPENAI_API_KEY", lambda r: "sk-proj-" + _r(r, B64URL, 156)),
    _whole("anthropic_key", "ANTHROPIC_API_KEY", lambda r: f"sk-ant-api03-{_r(r, B64URL, 93)}AA"),
    _whole("google_api_key", "GOOGLE_API_KEY", lambda r: "AIza" + _r(r, B64URL, 35)),
    _whole("jwt", "SESSION_JWT", _jwt),
    _part("rsa_private_key", "DEPLOY_PRIVATE_KEY", lambda r: _pem(r, "RSA PRIVATE KEY")),
    _part("ec_private_key", "SIGNING_PRIVATE_KEY", lambda r: _pem(r, "EC PRIVATE KEY")),
    _part("openssh_private_key", "SSH_PRIVATE_KEY", lambda r: _pem(r, "OPENSSH PRIVATE KEY")),
    _part("postgres_url_password", "DATABASE_URL_SECRET", _url_password("postgres", "db.internal:5432")),
    _part("https_url_password", "ARTIFACTS_CREDENTIALS", _url_password("https", "artifacts.example.com")),
    _part("basic_auth_header", "AUTH_HEADER", _basic),
    _part("bearer_token", "API_AUTH", _bearer),
    _whole("datadog_api_key", "DD_API_KEY", lambda r: _r(r, HEX, 32), shaped=False),
    _whole("digitalocean_token", "DIGITALOCEAN_ACCESS_TOKEN", lambda r: "dop_v1_" + _r(r, HEX, 64)),
    _whole("shopify_token", "SHOPIFY_ACCESS_TOKEN", lambda r: "shpat_" + _r(r, HEX, 32)),
    _whole("plain_password", "DB_PASSWORD", lambda r: _r(r, ALNUM, 18), shaped=False),
)


def secrets(rng: random.Random) -> list[Secret]:
    """One fake credential of every format in `FORMATS`, drawn from `rng`."""
    return [make(rng) for make in FORMATS]
