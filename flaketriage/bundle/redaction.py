"""Secret redaction: masks credentials in the captured environment, command line and output.

A value is secret when its variable or option *name* says so (``GITHUB_TOKEN``, ``--password``), when
it has the shape of a known credential (``ghp_...``, ``AKIA...``, ``SG.``, ``dop_v1_``, a PEM private
key, a JWT, a Slack webhook's path, the password of ``scheme://user:password@host``), or when it is
the exact value of a secret environment variable that :meth:`Redactor.redact_env` has already seen
(in the environment itself only when it is long and distinctive: `MIN_COPY_LEN`). Source code is
masked by value only (:meth:`Redactor.redact_values`): there a secret-sounding name is usually a
parameter, not a secret.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import hmac
import itertools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from flaketriage.errors import ConfigError

MASK = "[REDACTED]"

MIN_SECRET_LEN = 6
"""Shorter values of secret variables are masked in the environment but not searched for in text:
masking every ``true`` or ``1`` in a log would hide far more than it protects."""

# A fixpoint needs only one or two extra passes in practice; the cap bounds pathological inputs.
_MAX_PASSES = 5

_SECRET_WORDS = frozenset(
    {
        "token",
        "secret",
        "secrets",
        "password",
        "passwords",
        "passwd",
        "pass",
        "passphrase",
        "pwd",
        "pat",
        "credential",
        "credentials",
        "creds",
        "auth",
        "oauth",
        "authorization",
        "session",
        "sessionid",
        "cookie",
        "cookies",
        "dsn",
        "webhook",
        "webhooks",
        "apikey",
        "salt",
    }
)
"""Word parts of a name that make it secret wherever they appear (``AWS_SESSION_TOKEN``)."""

_SECRET_INFIXES = (
    "password",
    "passwd",
    "secret",
    "credential",
    "apikey",
    "accesskey",
    "privatekey",
    "passphrase",
)
"""Run together with other words in one part (``DBPASSWORD``, ``MYAPIKEY``)."""

_SECRET_PAIRS = frozenset({("connection", "string"), ("conn", "str")})

_KEY_KINDS = frozenset(
    {
        "api",
        "access",
        "private",
        "secret",
        "signing",
        "encryption",
        "decryption",
        "ssh",
        "gpg",
        "pgp",
        "hmac",
        "jwt",
        "master",
        "license",
        "licence",
        "client",
        "consumer",
        "service",
        "account",
        "storage",
        "subscription",
        "shared",
        "deploy",
        "app",
        "admin",
    }
)
"""Words before a trailing ``key`` that make the name a credential's (``API_KEY``, ``signing_key``)."""

_QUALIFIERS = frozenset(
    {
        "len",
        "length",
        "limit",
        "limits",
        "count",
        "size",
        "max",
        "min",
        "num",
        "number",
        "ttl",
        "timeout",
        "expiry",
        "expires",
        "expiration",
        "lifetime",
        "type",
        "mode",
        "enabled",
        "disabled",
        "enable",
        "disable",
        "file",
        "path",
        "dir",
        "name",
        "provider",
        "backend",
        "method",
        "version",
    }
)
"""A last part that describes a secret rather than holding one (``MAX_TOKEN_LENGTH``,
``POSTGRES_PASSWORD_FILE``): such values are kept, because replay needs them and they leak nothing."""

_NOT_SECRET = frozenset(
    {
        "PWD",
        "OLDPWD",
        "SSH_AUTH_SOCK",
        "DBUS_SESSION_BUS_ADDRESS",
        "SESSION_MANAGER",
        "DESKTOP_SESSION",
    }
)
"""Names that contain a secret word but hold a path or a socket (``PWD`` is the working directory)."""

_NOT_SECRET_PREFIXES = ("XDG_",)

_CAMEL_PART = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")

# Letters or digits right before a credential mean it is the tail of some longer word, not a token.
_START = r"(?<![A-Za-z0-9])"

_VALUE_PATTERNS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(p)
    for p in (
        _START + r"gh[pousr]_[A-Za-z0-9]{30,255}",
        _START + r"github_pat_[A-Za-z0-9_]{22,255}",
        _START + r"glpat-[A-Za-z0-9_-]{20,}",
        _START + r"(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}",
        _START + r"xox[abposr]-[A-Za-z0-9-]{10,}",
        _START + r"eyJ[A-Za-z0-9_-]{5,4096}\.eyJ[A-Za-z0-9_-]{5,16384}\.[A-Za-z0-9_-]*",
        _START + r"sk-[A-Za-z0-9_-]{20,}",
        _START + r"hf_[A-Za-z0-9]{20,}",
        _START + r"AIza[0-9A-Za-z_-]{35}",
        _START + r"npm_[A-Za-z0-9]{36}",
        _START + r"pypi-[A-Za-z0-9_-]{50,}",
        _START + r"[rs]k_live_[A-Za-z0-9]{16,}",
        _START + r"SK[0-9a-fA-F]{32}(?![A-Za-z0-9])",  # Twilio API key
        _START + r"SG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}",  # SendGrid
        _START + r"do[opr]_v1_[a-f0-9]{64}",  # DigitalOcean
        _START + r"shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}",  # Shopify
        # The path of a Slack incoming webhook is its credential.
        r"https://hooks\.slack\.com/(?:services|workflows|triggers)/(?P<secret>[A-Za-z0-9_/-]+)",
        r"\b[Bb]earer[ \t]+(?P<secret>[A-Za-z0-9._~+/-]{8,}=*)",
        # Only the password of user:password@ goes, so the host stays readable. The scheme is
        # bounded, else every word of a long dotted run would rescan the run for "://".
        r"\b[A-Za-z][A-Za-z0-9+.-]{0,30}://[^:/\s@]*:(?P<secret>[^@/\s]+)@",
        # Without an END line the log was cut inside the key: mask everything after BEGIN.
        r"(?s)-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY-----(?P<secret>.*?)"
        r"(?:-----END[A-Z0-9 ]{0,40}PRIVATE KEY-----|\Z)",
    )
)

_GUARDS: dict[re.Pattern[str], tuple[str, ...]] = dict(
    zip(
        _VALUE_PATTERNS,
        (
            ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"),
            ("github_pat_",),
            ("glpat-",),
            ("AKIA", "ASIA", "AGPA", "AIDA", "AROA", "ANPA", "ANVA", "AIPA"),
            ("xoxa-", "xoxb-", "xoxp-", "xoxo-", "xoxs-", "xoxr-"),
            ("eyJ",),
            ("sk-",),
            ("hf_",),
            ("AIza",),
            ("npm_",),
            ("pypi-",),
            ("k_live_",),
            ("SK",),
            ("SG.",),
            ("_v1_",),
            ("shp",),
            ("hooks.slack.com",),
            ("earer",),
            ("://",),
            ("-----BEGIN",),
        ),
        strict=True,
    )
)
"""Text each built-in pattern's matches contain (one of them): where none occurs the pattern is not
run. A substring test is a fast scan; a pattern that starts with a look-behind tries every position,
which made masking the text files of a source snapshot the slowest part of a capture."""

# NAME=value, NAME: value, "name": "value", --name=value, --name value. Only the name and separator
# are matched, so that scanning resumes inside the value: in ``X=password=abc`` the inner pair is seen.
_ASSIGNMENT = re.compile(
    r"""
    (?<![A-Za-z0-9_.-])
    (?P<quote>["']?)(?P<flag>-{1,2})?(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)(?P=quote)
    (?:
        [ \t]*(?:=|:(?!//))[ \t]*
      | (?(flag)(?P<flagsep>[ \t]+)|(?!))
    )
    """,
    re.VERBOSE,
)

# Read at the end of a secret name's separator. An option's value cannot start with "-", which is
# the next option; "==" is a comparison, not an assignment.
_VALUE = re.compile(
    r"""
    (?:(?i:bearer|basic|token|digest|bot)[ \t]+)?
    (?P<value>
        "(?:[^"\\\n]|\\.)*"
      | '[^'\n]*'
      | [^\s"'&;,=:][^\s"'&;,]*
    )
    """,
    re.VERBOSE,
)
_OPTION_VALUE = re.compile(r"(?P<value>[^\s\"'&;,=:-][^\s\"'&;,]*|\"(?:[^\"\\\n]|\\.)*\"|'[^'\n]*')")

_COOKIE_HEADER = re.compile(r"(?im)^[ \t]*(?:set-)?cookie[ \t]*:[ \t]*(?P<secret>[^\r\n]+)")


@dataclass(frozen=True, slots=True)
class _Span:
    start: int
    end: int


class Redactor:
    """Masks secrets with :data:`MASK`; remembers the secret environment values it has seen.

    ``extra_names`` are variable or option names to treat as secret, matched case-insensitively,
    with ``*`` and ``?`` wildcards (``MYCO_*``). ``extra_patterns`` are regular expressions for secret
    values; a group named ``secret`` narrows the mask to that group.
    """

    def __init__(self, extra_names: Iterable[str] = (), extra_patterns: Iterable[str] = ()) -> None:
        self._extra_names = tuple(n.upper() for n in extra_names)
        self._patterns = _VALUE_PATTERNS + tuple(_compile(p) for p in extra_patterns)
        self._known: set[str] = set()
        self._known_pattern: re.Pattern[str] | None = None
        self._fingerprint: tuple[bytes, str] | None = None

    def is_secret_name(self, name: str) -> bool:
        """Whether a variable or option named ``name`` holds a secret, judged from the name alone."""
        bare = name.lstrip("-")
        upper = bare.upper()
        if any(fnmatch.fnmatchcase(upper, pattern) for pattern in self._extra_names):
            return True
        if upper in _NOT_SECRET or upper.startswith(_NOT_SECRET_PREFIXES):
            return False
        return _name_looks_secret(bare)

    def redact_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """A copy of ``env`` with secret values masked, also where a long one is copied under
        another name; secrets found are remembered for text."""
        out: dict[str, str] = {}
        for name, value in env.items():
            if value and self.is_secret_name(name):
                out[name] = MASK
                self._remember(value)
            else:
                # Known values are not applied here: a secret equal to a path would mangle HOME or PATH.
                redacted, found = self._redact(value, use_known=False)
                out[name] = redacted
                for secret in found:
                    self._remember(secret)
        return self._mask_copies(out)

    def _mask_copies(self, env: dict[str, str]) -> dict[str, str]:
        """`env` with the long secrets already seen masked inside other values too
        (``BUILD_ARGS=--key $DD_API_KEY``), once every variable has been read, so that order does not
        matter. Not in variables that hold paths the run needs, and not short or all-letter values:
        ``POSTGRES_PASSWORD=postgres`` must leave ``POSTGRES_USER=postgres`` as it is."""
        copies = sorted((v for v in self._known if _is_distinctive(v)), key=len, reverse=True)
        if not copies:
            return env
        pattern = re.compile("|".join(re.escape(v) for v in copies))
        return {
            name: value
            if _holds_paths(name) or value == MASK
            else _apply(value, _merge([_Span(*m.span()) for m in pattern.finditer(value)], value))
            for name, value in env.items()
        }

    def redact_text(self, text: str) -> str:
        """``text`` with credentials, secret assignments and known secret values masked."""
        return self._redact(text, use_known=True)[0]

    def redact_values(self, text: str) -> str:
        """``text`` with credentials of a known shape and known secret values masked, but not the
        values of secret-sounding names: for source code, where ``password: str`` is a parameter
        and ``session = Session()`` an object, and masking them would break the program."""
        return self._redact(text, use_known=True, by_name=False)[0]

    def redact_argv(self, argv: Sequence[str]) -> tuple[str, ...]:
        """Each argument redacted as text, and the argument after a bare secret option masked.

        ``["--password", "hunter2"]`` reaches :meth:`redact_text` as two strings, neither of which
        looks secret alone.
        """
        out: list[str] = []
        for i, arg in enumerate(argv):
            previous = argv[i - 1] if i else ""
            if (
                previous.startswith("-")
                and re.fullmatch(r"-{1,2}[A-Za-z_][A-Za-z0-9_.-]*", previous)
                and not arg.startswith("-")
                and arg
                and self.is_secret_name(previous)
            ):
                self._remember(arg)
                out.append(MASK)
            else:
                out.append(self.redact_text(arg))
        return tuple(out)

    def fingerprint(self, key: bytes) -> str:
        """A keyed hash of everything masking depends on besides the text: this flaketriage's
        version (its rules), the patterns and names (built-in and extra) and the secret values
        remembered so far. Equal fingerprints mask equal text equally. Keyed (HMAC), so that without
        `key` it confirms no guessed secret."""
        if self._fingerprint is not None and self._fingerprint[0] == key:
            return self._fingerprint[1]
        from flaketriage import __version__

        rules = [
            __version__,
            [p.pattern for p in (*self._patterns, _COOKIE_HEADER, _ASSIGNMENT, _VALUE, _OPTION_VALUE)],
            sorted(self._extra_names),
            sorted(self._known),
        ]
        digest = hmac.new(
            key, json.dumps(rules).encode("utf-8", "surrogateescape"), hashlib.sha256
        ).hexdigest()
        self._fingerprint = (key, digest)
        return digest

    def _remember(self, value: str) -> None:
        # A value inside the mask would be found again in every masked text, forever.
        if len(value) >= MIN_SECRET_LEN and value.strip() and value not in MASK and value not in self._known:
            self._known.add(value)
            self._known_pattern = None
            self._fingerprint = None

    def _redact(self, text: str, *, use_known: bool, by_name: bool = True) -> tuple[str, list[str]]:
        found: list[str] = []
        # Masking changes what surrounds other text (a lookbehind may now see "]"), so repeat to a
        # fixpoint: that is what makes redaction idempotent.
        for _ in range(_MAX_PASSES):
            spans = self._spans(text, use_known=use_known, by_name=by_name)
            if not spans:
                break
            found.extend(text[s.start : s.end] for s in spans if text[s.start : s.end] != MASK)
            masked = _apply(text, spans)
            if masked == text:
                break
            text = masked
        return text, found

    def _spans(self, text: str, *, use_known: bool, by_name: bool = True) -> list[_Span]:
        spans: list[_Span] = []
        for pattern in (*self._patterns, _COOKIE_HEADER) if by_name else self._patterns:
            guard = _GUARDS.get(pattern)
            if guard is not None and not any(literal in text for literal in guard):
                continue
            for match in pattern.finditer(text):
                group = "secret" if "secret" in pattern.groupindex else 0
                if match.group(group):
                    spans.append(_Span(match.start(group), match.end(group)))
        covered = 0
        for match in _ASSIGNMENT.finditer(text) if by_name else ():
            # Inside a value already masked, a nested assignment adds nothing, and skipping it keeps
            # chains like "password=password=..." linear.
            if match.start() < covered or not self.is_secret_name(match.group("name")):
                continue
            value_pattern = _OPTION_VALUE if match.group("flagsep") is not None else _VALUE
            value = value_pattern.match(text, match.end())
            if value is not None:
                span = _value_span(value)
                spans.append(span)
                covered = span.end
        if use_known and self._known and any(value in text for value in self._known):
            spans.extend(_Span(m.start(), m.end()) for m in self._known_regex().finditer(text))
        return _merge(spans, text)

    def _known_regex(self) -> re.Pattern[str]:
        if self._known_pattern is None:
            # Longest first, so a secret that contains another is masked whole.
            ordered = sorted(self._known, key=len, reverse=True)
            self._known_pattern = re.compile("|".join(re.escape(v) for v in ordered))
        return self._known_pattern


MIN_COPY_LEN = 16
"""A secret variable's value is masked in other variables too only from this length, and when it
mixes cases or letters and digits (an AWS secret key, a generated password): a shorter or plainer
one (``postgres``, ``/home/ci/work``) is as likely a word or path the run needs as a copy of it."""

_PATH_VARIABLES = frozenset({"HOME", "PWD", "OLDPWD", "TMPDIR", "TEMP", "TMP", "SHELL", "USER", "LOGNAME"})


def _is_distinctive(value: str) -> bool:
    classes = (str.islower, str.isupper, str.isdigit)
    return len(value) >= MIN_COPY_LEN and sum(any(map(kind, value)) for kind in classes) >= 2


def _holds_paths(name: str) -> bool:
    upper = name.upper()
    return upper in _PATH_VARIABLES or upper.endswith("PATH") or upper.startswith(_NOT_SECRET_PREFIXES)


# The same few names recur on every line of a log.
@functools.lru_cache(maxsize=4096)
def _name_looks_secret(name: str) -> bool:
    pieces = [p for p in re.split(r"[^A-Za-z0-9]+", name) if p]
    words = [w.lower() for piece in pieces for w in _CAMEL_PART.findall(piece)]
    if not words:
        return False
    if words[-1] in _QUALIFIERS and len(words) > 1:
        return False
    if any(w in _SECRET_WORDS for w in words):
        return True
    lowered = [p.lower() for p in pieces]
    if any(infix in p for p in lowered for infix in _SECRET_INFIXES) or any(
        p.endswith("token") for p in lowered
    ):
        return True
    if any(pair in _SECRET_PAIRS for pair in itertools.pairwise(words)):
        return True
    # A trailing KEY names a credential when the word before it says which kind (api_key,
    # ssh_private_key) or when the name is an environment variable's capitals (OPENAI_KEY); in
    # code it is usually a lookup key (sort_key, cache_key, is_single_key), and so is a lone KEY.
    if len(words) > 1 and words[-1] == "key":
        return words[-2] in _KEY_KINDS or name.isupper()
    return False


def _value_span(match: re.Match[str]) -> _Span:
    start, end = match.span("value")
    value = match.group("value")
    if len(value) >= 2 and value[0] in "\"'" and value[-1] == value[0]:
        # Keep the quotes, so that a masked JSON or Python literal still parses.
        start, end = start + 1, end - 1
    return _Span(start, end)


def _merge(spans: list[_Span], text: str) -> list[_Span]:
    """Sorted, non-overlapping spans; one that cuts into an existing mask swallows it whole."""
    masks = [(m.start(), m.end()) for m in re.finditer(re.escape(MASK), text)]
    widened: list[_Span] = []
    for span in spans:
        if span.start >= span.end:
            continue
        start, end = span.start, span.end
        for m_start, m_end in masks:
            if m_start < end and start < m_end:
                start, end = min(start, m_start), max(end, m_end)
        widened.append(_Span(start, end))
    widened.sort(key=lambda s: (s.start, -s.end))
    merged: list[_Span] = []
    for span in widened:
        if merged and span.start <= merged[-1].end:
            last = merged[-1]
            merged[-1] = _Span(last.start, max(last.end, span.end))
        else:
            merged.append(span)
    return merged


def _apply(text: str, spans: list[_Span]) -> str:
    parts: list[str] = []
    cursor = 0
    for span in spans:
        parts.append(text[cursor : span.start])
        parts.append(MASK)
        cursor = span.end
    parts.append(text[cursor:])
    return "".join(parts)


def _compile(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ConfigError(
            f"redaction pattern {pattern!r} is not a valid regular expression ({exc}); "
            "fix or remove it from the extra patterns"
        ) from exc
