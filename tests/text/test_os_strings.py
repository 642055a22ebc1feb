"""OS strings with bytes that are not UTF-8: lossless through JSON, exact through the shell."""

from __future__ import annotations

import json
import os
import shlex
import subprocess

from hypothesis import given, settings
from hypothesis import strategies as st

from flaketriage.bundle.manifest import Command
from flaketriage.text.os_strings import (
    MARK,
    from_json_text,
    has_undecodable,
    shell_join,
    shell_word,
    to_json_text,
)

# Bytes as POSIX hands them over: anything but NUL.
os_bytes = st.binary(max_size=40).filter(lambda b: b"\x00" not in b)


@given(os_bytes)
def test_json_form_round_trips_any_bytes(raw: bytes) -> None:
    text = os.fsdecode(raw)
    stored = json.dumps(to_json_text(text), ensure_ascii=False).encode("utf-8")  # must not raise
    back = from_json_text(json.loads(stored))
    assert isinstance(back, str) and os.fsencode(back) == raw


@given(st.text().filter(lambda t: "\x00" not in t))
def test_text_without_undecodable_bytes_is_stored_unchanged(text: str) -> None:
    text = text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")  # no lone surrogates
    assert not has_undecodable(text)
    assert to_json_text(text) == text and from_json_text(text) == text


def test_escapes_are_readable_and_unambiguous() -> None:
    assert to_json_text("bad\udcff") == MARK + "bad\\xff"
    # A real argument that looks like an escape is not one: only the marker makes it so.
    assert from_json_text("bad\\xff") == "bad\\xff"
    assert from_json_text(to_json_text("a\\xff\udcfe")) == "a\\xff\udcfe"


def test_command_keeps_bytes_through_its_canonical_json() -> None:
    command = Command(argv=("python", "bad\udcff"), cwd="/w", env={"X": "\udcfe", "K\udce9": "v"})
    raw = command.model_dump_json().encode("utf-8")
    again = Command.model_validate_json(raw)
    assert again == command
    assert os.fsencode(again.argv[1]) == b"bad\xff" and os.fsencode(again.env["X"]) == b"\xfe"


@settings(max_examples=30, deadline=None)
@given(os_bytes.filter(bool))
def test_shell_word_gives_bash_the_exact_bytes(raw: bytes) -> None:
    word = shell_word(os.fsdecode(raw))
    assert word.isascii() or not has_undecodable(os.fsdecode(raw))
    out = subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True, check=True).stdout
    assert out == raw


def test_shell_join_matches_shlex_for_plain_text() -> None:
    argv = ["python", "-c", "print('a b')", "--lr=0.1", "café"]
    assert shell_join(argv) == shlex.join(argv)
    assert shell_join(["x", "bad\udcff"]) == "x $'bad\\xff'"
