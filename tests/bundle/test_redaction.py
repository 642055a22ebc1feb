"""Redaction: known secret shapes and names are masked, ordinary text is untouched, and it is idempotent."""

from __future__ import annotations

import string
import time

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from flaketriage.bundle.redaction import MASK, MIN_SECRET_LEN, Redactor
from flaketriage.errors import ConfigError

ALNUM = string.ascii_letters + string.digits
UPPER_DIGITS = string.ascii_uppercase + string.digits
B64URL = ALNUM + "-_"

fast = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _s(alphabet: str, n: int, m: int | None = None) -> st.SearchStrategy[str]:
    return st.text(alphabet=alphabet, min_size=n, max_size=n if m is None else m)


# Each strategy yields (text to plant, the secret part that must not survive).
def _whole(s: st.SearchStrategy[str]) -> st.SearchStrategy[tuple[str, str]]:
    return s.map(lambda v: (v, v))


GITHUB = _whole(st.builds(lambda p, t: p + t, st.sampled_from(["ghp_", "gho_", "ghs_"]), _s(ALNUM, 36)))
GITHUB_PAT = _whole(_s(ALNUM + "_", 82).map(lambda t: "github_pat_" + t))
AWS = _whole(st.builds(lambda p, t: p + t, st.sampled_from(["AKIA", "ASIA"]), _s(UPPER_DIGITS, 16)))
SLACK = _whole(
    st.builds(
        lambda k, a, b: f"xox{k}-{a}-{b}", st.sampled_from("baprs"), _s(string.digits, 12), _s(ALNUM, 24)
    )
)
JWT = _whole(
    st.builds(
        lambda a, b, c: f"eyJ{a}.eyJ{b}.{c}", _s(B64URL, 10, 40), _s(B64URL, 10, 80), _s(B64URL, 20, 43)
    )
)
OPENAI = _whole(_s(ALNUM, 48).map(lambda t: "sk-" + t))
HUGGINGFACE = _whole(_s(string.ascii_letters, 34).map(lambda t: "hf_" + t))
GOOGLE = _whole(_s(B64URL, 35).map(lambda t: "AIza" + t))
PEM_BODY = st.lists(_s(ALNUM + "+/", 64), min_size=1, max_size=4).map("\n".join)
PEM = PEM_BODY.map(
    lambda body: (f"-----BEGIN RSA PRIVATE KEY-----\n{body}\n-----END RSA PRIVATE KEY-----", body)
)
# A leading capital keeps the token from also occurring in the (lower-case) surrounding text.
BEARER = _s(ALNUM + "._-", 20, 60).map(lambda t: (f"Authorization: Bearer Z{t}", "Z" + t))
# The password alphabet (upper case) cannot occur in the user name or the surrounding text.
URL_PASSWORD = st.builds(
    lambda user, pw: (f"https://{user}:{pw}@db.example.com:5432/app", pw),
    _s(string.ascii_lowercase, 1, 8),
    _s(string.ascii_uppercase, 8, 20),
)
PLANTED = st.one_of(
    GITHUB, GITHUB_PAT, AWS, SLACK, JWT, OPENAI, HUGGINGFACE, GOOGLE, PEM, BEARER, URL_PASSWORD
)

SURROUNDING = st.text(alphabet=string.ascii_lowercase + string.digits + " .,/()\n", max_size=60)
SEPARATOR = st.sampled_from([" ", "\n", "\t", "=", ": ", "'", '"', "(", ","])

SECRET_NAMES = st.sampled_from(
    [
        "GITHUB_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "HF_TOKEN",
        "WANDB_API_KEY",
        "NPM_TOKEN",
        "SENTRY_DSN",
        "DB_PASSWORD",
        "MYSQL_PWD",
        "SLACK_WEBHOOK_URL",
        "CLIENT_SECRET",
        "apiKey",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "SESSION_COOKIE",
        "CONNECTION_STRING",
    ]
)
PLAIN_NAMES = st.sampled_from(
    [
        "PATH",
        "HOME",
        "PWD",
        "OLDPWD",
        "SHELL",
        "USER",
        "LANG",
        "TERM",
        "PYTHONHASHSEED",
        "CUDA_VISIBLE_DEVICES",
        "TOKENIZERS_PARALLELISM",
        "MAX_TOKENS",
        "SSH_AUTH_SOCK",
        "XDG_SESSION_TYPE",
        "OMP_NUM_THREADS",
        "CI",
    ]
)
PLAIN_VALUES = st.one_of(
    st.integers(0, 10**9).map(str),
    st.sampled_from(["/usr/local/bin:/usr/bin:/bin", "/home/runner", "en_US.UTF-8", "xterm", "0,1", "true"]),
    st.text(alphabet=string.ascii_lowercase + string.digits + "/._-", max_size=40),
)


@fast
@given(before=SURROUNDING, after=SURROUNDING, sep1=SEPARATOR, sep2=SEPARATOR, planted=PLANTED)
def test_no_planted_credential_survives(
    before: str, after: str, sep1: str, sep2: str, planted: tuple[str, str]
) -> None:
    text, secret = planted
    out = Redactor().redact_text(before + sep1 + text + sep2 + after)
    assert secret not in out
    assert MASK in out


@fast
@given(
    env=st.dictionaries(PLAIN_NAMES, PLAIN_VALUES, max_size=6),
    name=SECRET_NAMES,
    value=st.text(min_size=MIN_SECRET_LEN, max_size=40),
    before=st.text(max_size=40),
    after=st.text(max_size=40),
)
def test_secret_env_values_are_masked_in_env_and_text(
    env: dict[str, str], name: str, value: str, before: str, after: str
) -> None:
    assume(value.strip() and value not in MASK)
    redactor = Redactor()
    redacted = redactor.redact_env({**env, name: value})
    assert redacted[name] == MASK
    assert value not in redactor.redact_text(before + value + after)


@fast
@given(env=st.dictionaries(PLAIN_NAMES, PLAIN_VALUES, max_size=10))
def test_plain_environment_is_unchanged(env: dict[str, str]) -> None:
    assert Redactor().redact_env(env) == env


@fast
@given(
    text=st.text(
        alphabet=st.sampled_from(string.ascii_letters + string.digits + " .,/()\n"),
        max_size=200,
    )
)
def test_plain_text_is_unchanged(text: str) -> None:
    assert Redactor().redact_text(text) == text


WORDS = st.sampled_from(
    [
        "the",
        "loss",
        "went",
        "up",
        "at",
        "step",
        "epoch",
        "batch",
        "tokens",
        "tokenizer",
        "max_tokens",
        "learning_rate",
        "author",
        "passed",
        "keyboard",
        "model",
        "GPU",
        "/usr/lib/python3.11",
        "./data/train.csv",
        "0.001",
        "1e-4",
        "42",
        "-3",
        "CUDA",
        "error",
        "out",
        "of",
        "memory",
        "AssertionError:",
        "expected",
        "3,",
        "got",
        "4",
        "session.",
    ]
)
PLAIN_ASSIGNMENTS = st.builds(
    lambda n, v: f"{n}={v}",
    st.sampled_from(["epoch", "lr", "loss", "batch_size", "PATH", "HOME", "PWD", "max_tokens", "seed"]),
    st.sampled_from(["3", "0.5", "/tmp/run", "1e-3", "/usr/bin:/bin"]),
)


@fast
@given(parts=st.lists(st.one_of(WORDS, PLAIN_ASSIGNMENTS), max_size=30))
def test_plain_log_lines_are_unchanged(parts: list[str]) -> None:
    line = " ".join(parts)
    assert Redactor().redact_text(line) == line


@fast
@given(
    text=st.one_of(
        st.text(max_size=200),
        st.lists(
            st.one_of(
                PLANTED.map(lambda p: p[0]),
                WORDS,
                st.text(max_size=10),
                st.sampled_from(["password=", "--token ", "token: ", "Bearer ", MASK, "://a:", "@h"]),
            ),
            max_size=12,
        ).map("".join),
    ),
    secrets=st.lists(st.text(min_size=MIN_SECRET_LEN, max_size=12), max_size=3),
)
def test_redaction_is_idempotent(text: str, secrets: list[str]) -> None:
    redactor = Redactor()
    redactor.redact_env({f"SECRET_{i}": s for i, s in enumerate(secrets)})
    once = redactor.redact_text(text)
    assert redactor.redact_text(once) == once


@fast
@given(env=st.dictionaries(st.one_of(PLAIN_NAMES, SECRET_NAMES), st.one_of(PLAIN_VALUES, st.text())))
def test_redact_env_is_idempotent(env: dict[str, str]) -> None:
    redactor = Redactor()
    once = redactor.redact_env(env)
    assert redactor.redact_env(once) == once


@pytest.mark.parametrize(
    "name",
    [
        "GITHUB_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "HF_TOKEN",
        "WANDB_API_KEY",
        "OPENAI_API_KEY",
        "NPM_TOKEN",
        "SENTRY_DSN",
        "MYSQL_PWD",
        "DB_PASS",
        "PGPASSWORD",
        "GH_PAT",
        "CLIENT_SECRET",
        "SLACK_WEBHOOK_URL",
        "DATABASE_CONNECTION_STRING",
        "apiKey",
        "authToken",
        "--password",
        "ssh_private_key",
    ],
)
def test_secret_names(name: str) -> None:
    assert Redactor().is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "PATH",
        "HOME",
        "PWD",
        "OLDPWD",
        "SHELL",
        "USER",
        "PYTHONHASHSEED",
        "CUDA_VISIBLE_DEVICES",
        "TOKENIZERS_PARALLELISM",
        "MAX_TOKENS",
        "MAX_TOKEN_LENGTH",
        "POSTGRES_PASSWORD_FILE",
        "GIT_AUTHOR_NAME",
        "SSH_AUTH_SOCK",
        "DBUS_SESSION_BUS_ADDRESS",
        "XDG_SESSION_ID",
        "KEY",
        "--max-new-tokens",
    ],
)
def test_plain_names(name: str) -> None:
    assert not Redactor().is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "api_key",
        "secret_key",
        "access_key",
        "private_key",
        "signing_key",
        "encryption_key",
        "client_key",
        "X_API_KEY",
        "--api-key",
        "accessKey",
        "privateKey",
        # An environment variable in capitals that ends in KEY is a credential often enough.
        "OPENAI_KEY",
        "STRIPE_KEY",
        "SSH_KEY",
    ],
)
def test_names_of_keys_that_are_credentials(name: str) -> None:
    assert Redactor().is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "is_single_key",
        "sort_key",
        "cache_key",
        "primary_key",
        "dict_key",
        "sortKey",
        "hotkey",
        "hotKey",
        "monkey",
        "key",
    ],
)
def test_names_that_merely_end_in_key(name: str) -> None:
    assert not Redactor().is_secret_name(name)


def test_traceback_locals_named_like_keys_keep_their_values() -> None:
    locals_ = (
        "is_single_key = False\n"
        "sort_key   = <function <lambda> at 0x7f>\n"
        "monkey     = <_pytest.monkeypatch.MonkeyPatch object at 0x7f>\n"
        "api_key    = 'abcd1234efgh'\n"
        f"cache_key  = 'ghp_{'a' * 36}'\n"
    )
    assert Redactor().redact_text(locals_) == (
        "is_single_key = False\n"
        "sort_key   = <function <lambda> at 0x7f>\n"
        "monkey     = <_pytest.monkeypatch.MonkeyPatch object at 0x7f>\n"
        f"api_key    = '{MASK}'\n"
        f"cache_key  = '{MASK}'\n"  # a credential by its value, whatever its name
    )


def test_url_keeps_everything_but_the_password() -> None:
    env = Redactor().redact_env({"DATABASE_URL": "postgres://app:hunter22@db.internal:5432/main"})
    assert env == {"DATABASE_URL": f"postgres://app:{MASK}@db.internal:5432/main"}


def test_password_found_in_an_env_value_is_masked_in_later_text() -> None:
    redactor = Redactor()
    redactor.redact_env({"DATABASE_URL": "postgres://app:hunter22@db/main"})
    assert redactor.redact_text("auth failed for hunter22") == f"auth failed for {MASK}"


def test_a_long_secret_copied_into_an_innocuous_variable_is_masked_there_too() -> None:
    key = "3f9a" * 8
    aws = "BZvYMk/YvqAcFqcIigurlkhldWMdBIhdKs/+bWwM"  # mixed case, no digit
    env = {
        "BUILD_ARGS": f"--dd {key}",  # before the secret variable: the order does not matter
        "DD_API_KEY": key,
        "DEPLOY_ARGS": aws,
        "AWS_SECRET_ACCESS_KEY": aws,
        "PYTHONPATH": f"/x/{key}",  # paths the run needs are kept
        "GOOGLE_CREDENTIALS": "/home/runner/work/project",
        "WORKDIR": "/home/runner/work/project",  # one case, no digit: as likely a path as a secret
        "POSTGRES_PASSWORD": "postgres",
        "POSTGRES_USER": "postgres",  # a short value is as likely a word the run needs
    }
    assert Redactor().redact_env(env) == env | {
        "BUILD_ARGS": f"--dd {MASK}",
        "DD_API_KEY": MASK,
        "DEPLOY_ARGS": MASK,
        "AWS_SECRET_ACCESS_KEY": MASK,
        "GOOGLE_CREDENTIALS": MASK,
        "POSTGRES_PASSWORD": MASK,
    }


def test_short_and_empty_secret_values() -> None:
    redactor = Redactor()
    assert redactor.redact_env({"API_TOKEN": "", "DB_PASSWORD": "abc"}) == {
        "API_TOKEN": "",
        "DB_PASSWORD": MASK,
    }
    # Too short to search for: masking every "abc" in a log would hide more than it protects.
    assert redactor.redact_text("abc") == "abc"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("password=hunter2 rest", f"password={MASK} rest"),
        ("token: abc123, x=1", f"token: {MASK}, x=1"),
        ('{"password": "a b c", "user": "bob"}', f'{{"password": "{MASK}", "user": "bob"}}'),
        ("client_secret='s3'", f"client_secret='{MASK}'"),
        ("--password value --lr 3", f"--password {MASK} --lr 3"),
        ("--token=tok123 --verbose", f"--token={MASK} --verbose"),
        ("--api-key -x", "--api-key -x"),
        ("X=password=abc", f"X=password={MASK}"),
        ("Authorization: Bearer abcdefgh12345", f"Authorization: Bearer {MASK}"),
        ("Authorization: Basic dXNlcjpwYXNz", f"Authorization: Basic {MASK}"),
        ("Cookie: a=b; c=d\nnext", f"Cookie: {MASK}\nnext"),
        ("key=value key_column=id", "key=value key_column=id"),
        ("git clone https://github.com/org/repo.git", "git clone https://github.com/org/repo.git"),
        ("epoch=3 loss=0.5 lr=1e-3 path=/tmp/a:b", "epoch=3 loss=0.5 lr=1e-3 path=/tmp/a:b"),
        (
            "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n-----END OPENSSH PRIVATE KEY-----\nafter",
            f"-----BEGIN OPENSSH PRIVATE KEY-----{MASK}-----END OPENSSH PRIVATE KEY-----\nafter",
        ),
        ("log cut: -----BEGIN PRIVATE KEY-----\nMIIEvQ", f"log cut: -----BEGIN PRIVATE KEY-----{MASK}"),
        ("twilio SK" + "0a" * 16 + " ok", f"twilio {MASK} ok"),
        ("SG." + "a" * 22 + "." + "b" * 43, MASK),
        ("do=dop_v1_" + "c" * 64, f"do={MASK}"),
        ("shopify shpat_" + "d" * 32, f"shopify {MASK}"),
        (
            "POST https://hooks.slack.com/services/T01/B02/xyz ok",
            f"POST https://hooks.slack.com/services/{MASK} ok",
        ),
        # Digests and commits are what a person searches for: never masked.
        ("commit " + "a1" * 20 + " sha256:" + "9f" * 32, "commit " + "a1" * 20 + " sha256:" + "9f" * 32),
        ("SKIP " + "0a" * 16 + " DISK" + "0a" * 16, "SKIP " + "0a" * 16 + " DISK" + "0a" * 16),
    ],
)
def test_redact_text_examples(text: str, expected: str) -> None:
    assert Redactor().redact_text(text) == expected


def test_redact_argv_masks_the_value_after_a_secret_option() -> None:
    redactor = Redactor()
    argv = ["python", "train.py", "--password", "hunter22", "--lr", "3", "--api-key=abc", "--max-tokens", "9"]
    assert redactor.redact_argv(argv) == (
        "python",
        "train.py",
        "--password",
        MASK,
        "--lr",
        "3",
        f"--api-key={MASK}",
        "--max-tokens",
        "9",
    )
    assert redactor.redact_text("login with hunter22") == f"login with {MASK}"


def test_extra_names_and_patterns() -> None:
    redactor = Redactor(extra_names=["MYCO_*", "internal_id"], extra_patterns=[r"corp-(?P<secret>\d{6})"])
    env = redactor.redact_env({"MYCO_ENDPOINT": "https://x", "INTERNAL_ID": "u-1", "BUILD": "corp-123456"})
    assert env == {"MYCO_ENDPOINT": MASK, "INTERNAL_ID": MASK, "BUILD": f"corp-{MASK}"}
    assert redactor.redact_text("id corp-654321") == f"id corp-{MASK}"


def test_an_invalid_extra_pattern_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="not a valid regular expression"):
        Redactor(extra_patterns=["("])


@pytest.mark.parametrize("unit", ["a.", "eyJaaaaaa.", "eyJaaaaaa-", "password=", "--token ", "x://a:b"])
def test_long_runs_without_spaces_take_linear_time(unit: str) -> None:
    # A pattern that rescans the rest of the run from every word start takes minutes here.
    text = unit * (400_000 // len(unit))
    started = time.perf_counter()
    Redactor().redact_text(text)
    assert time.perf_counter() - started < 5
