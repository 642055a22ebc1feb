"""Secrets in captured files: the credential files a bundle never holds, and masking the secret
values in the text files and the uncommitted diff that it does hold.

Credential files are known by name (`CREDENTIAL_FILES`). Every other captured text file goes
through the capture's `Redactor`: configuration files (`CONFIG_SUFFIXES`) like the logs, by name
and by value (``password: hunter2``); everything else by value only (a credential of a known shape,
or the value of a secret environment variable), because in code ``password: str`` is a parameter,
and masking it would break the replay. In the diff only added lines are masked: the other lines
are the commit's own, and the diff applies to the commit only while they stay as they are.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from flaketriage.bundle.redaction import Redactor

CREDENTIAL_FILES = (
    ".env",
    ".env.*",
    "*.pem",
    "*.key",
    "id_rsa*",
    "id_ed25519*",
    ".netrc",
    ".pypirc",
    ".npmrc",
    ".git-credentials",
    ".aws/credentials",
    ".docker/config.json",
)
"""Never captured, wherever they are: a file name, or the end of a path (case-insensitive)."""

CONFIG_SUFFIXES = frozenset(
    {".yaml", ".yml", ".toml", ".ini", ".cfg", ".conf", ".json", ".properties", ".tfvars"}
)
"""Files masked by name as well as by value: ``password: hunter2`` is a secret here."""

CREDENTIAL_REASON = "credential file: never captured"

_HUNK = re.compile(r"^@@ -(\d+(?:,\d+)?) \+(\d+)(?:,(\d+))? @@")
_C_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


def _component(pattern: str) -> str:
    """A glob for one path component (``*``, ``?``) as a regular expression that stays inside it."""
    return "".join("[^/]*" if c == "*" else "[^/]" if c == "?" else re.escape(c) for c in pattern)


_CREDENTIAL_PATH = re.compile(
    "(?:^|/)(?:" + "|".join("/".join(map(_component, p.split("/"))) for p in CREDENTIAL_FILES) + r")\Z"
)
"""Any of `CREDENTIAL_FILES` at the end of a path: one expression, as it runs for every file."""


def is_credential_file(path: str) -> bool:
    """Whether `path` (relative, ``/``-separated) names a credential file."""
    parts = [part for part in path.lower().split("/") if part and part != "."]  # as PurePosixPath has them
    return _CREDENTIAL_PATH.search("/".join(parts)) is not None


def mask_text(redactor: Redactor, path: str, text: str) -> str:
    """`text` of the file at `path` with its secrets masked (see the module's docstring)."""
    if PurePosixPath(path).suffix.lower() in CONFIG_SUFFIXES:
        return redactor.redact_text(text)
    return redactor.redact_values(text)


def mask_file(redactor: Redactor, path: str, data: bytes) -> bytes | None:
    """The bytes of a text file with its secrets masked, or None when it holds none (or is binary:
    it has a NUL byte). Bytes that are not UTF-8 pass through unchanged."""
    if b"\0" in data:
        return None
    text = data.decode("utf-8", "surrogateescape")
    masked = mask_text(redactor, path, text)
    return None if masked == text else masked.encode("utf-8", "surrogateescape")


def mask_patch(redactor: Redactor, patch: bytes) -> tuple[bytes, list[str]]:
    """A ``git diff`` with secrets masked in its added lines, and the paths where any were.

    A masked secret that spanned lines (a private key) leaves fewer lines; the hunk headers are
    rewritten to match, so the diff still applies. Binary patches are left as they are.
    """
    lines = _lines(patch.decode("utf-8", "surrogateescape"))
    out: list[str] = []
    masked: list[str] = []
    path = ""
    shift = 0
    i = 0
    while i < len(lines):
        line = lines[i]
        hunk = _HUNK.match(line)
        if hunk is None:
            if line.startswith("diff --git "):
                path, shift = "", 0
            elif line.startswith("+++ "):
                path = _patch_path(line[4:])
            out.append(line)
            i += 1
            continue
        body, i = _hunk_body(lines, i + 1, hunk)
        new_body = _mask_added(redactor, path, body)
        if new_body != body:
            masked.append(path)
        old_new = int(hunk.group(3) or 1)
        new_count = old_new - sum(1 for b in body if b[:1] == "+") + sum(1 for b in new_body if b[:1] == "+")
        if new_body != body or shift:
            start = int(hunk.group(2)) + shift
            line = f"@@ -{hunk.group(1)} +{start},{new_count} @@" + line[hunk.end() :]
        shift += new_count - old_new
        out.append(line)
        out += new_body
    return "".join(out).encode("utf-8", "surrogateescape"), list(dict.fromkeys(masked))


def _lines(text: str) -> list[str]:
    """`text` split after each ``\\n`` only (`str.splitlines` also splits at ``\\r`` and others)."""
    return re.findall(r"[^\n]*\n|[^\n]+\Z", text)


def _hunk_body(lines: list[str], i: int, hunk: re.Match[str]) -> tuple[list[str], int]:
    """The lines of the hunk whose header matched, from `i`, and the index after them."""
    old_left = int(hunk.group(1).partition(",")[2] or 1)
    new_left = int(hunk.group(3) or 1)
    body: list[str] = []
    while i < len(lines) and (old_left > 0 or new_left > 0 or lines[i].startswith("\\")):
        line = lines[i]
        kind = line[:1]
        if kind in (" ", "\n", ""):
            old_left, new_left = old_left - 1, new_left - 1
        elif kind == "-":
            old_left -= 1
        elif kind == "+":
            new_left -= 1
        elif kind != "\\":
            break  # a malformed hunk: leave the rest as it is
        body.append(line)
        i += 1
    return body, i


def _mask_added(redactor: Redactor, path: str, body: list[str]) -> list[str]:
    out: list[str] = []
    run: list[str] = []
    for line in [*body, None]:
        if line is not None and line[:1] == "+":
            run.append(line[1:])
            continue
        if run:
            text = "".join(run)
            masked = mask_text(redactor, path, text)
            if masked.endswith("\n") != text.endswith("\n"):
                masked += "\n"  # a key cut off at the end swallowed the newline the diff needs
            out += ["+" + part for part in _lines(masked)]
            run = []
        if line is not None:
            out.append(line)
    return out


def _patch_path(header: str) -> str:
    """The path of a ``+++ b/path`` header line (git C-quotes unusual names)."""
    text = header.rstrip("\n").rstrip("\t")
    if text.startswith('"') and text.endswith('"') and len(text) >= 2:
        text = _c_unquote(text[1:-1])
    return text[2:] if text.startswith("b/") else text


def _c_unquote(text: str) -> str:
    raw = bytearray()
    i = 0
    while i < len(text):
        char = text[i]
        if char == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt in "01234567" and re.fullmatch(r"[0-7]{3}", text[i + 1 : i + 4]):
                raw.append(int(text[i + 1 : i + 4], 8))
                i += 4
                continue
            if nxt in _C_ESCAPES:
                raw.append(_C_ESCAPES[nxt])
                i += 2
                continue
        raw += char.encode("utf-8", "surrogateescape")
        i += 1
    return raw.decode("utf-8", "surrogateescape")
