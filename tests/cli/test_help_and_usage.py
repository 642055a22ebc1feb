"""What the command line shows a person: help without noise, usage errors on one line, listings
that a pipe gets whole, and a triage of a remote store that writes its report locally."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import S3Server


def _one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "╭" not in proc.stderr
    assert proc.stderr.startswith("error:") and proc.stderr.count("\n") == 1, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


@pytest.mark.parametrize("command", [[], ["triage"], ["bundle", "list"], ["capture"]])
def test_help_shows_no_type_for_a_flag(cli, command: list[str]) -> None:  # type: ignore[no-untyped-def]
    proc = cli(*command, "--help")
    assert proc.returncode == 0, proc.stderr
    assert "--help" in proc.stdout and "<bool>" not in proc.stdout


def test_help_still_shows_the_type_of_an_option_that_takes_a_value(cli) -> None:  # type: ignore[no-untyped-def]
    proc = cli("triage", "--help")
    assert "<int range>" in proc.stdout and "<float>" in proc.stdout


def test_usage_errors_are_one_line(cli) -> None:  # type: ignore[no-untyped-def]
    _one_line_error(cli("bogus"), "No such command 'bogus'", "flaketriage --help")
    _one_line_error(cli("tirage", "x"), "Did you mean 'triage'?")
    _one_line_error(cli("bundle", "lst"), "No such command 'lst'", "flaketriage bundle --help")
    _one_line_error(cli("--nope"), "No such option: --nope")
    _one_line_error(cli("triage"), "Missing argument", "flaketriage triage --help")
    _one_line_error(cli("triage", "x", "--max-replays", "0"), "--max-replays")


def test_no_arguments_still_show_the_help(cli) -> None:  # type: ignore[no-untyped-def]
    proc = cli()
    assert proc.returncode == 2 and "Usage: " in proc.stdout and "error:" not in proc.stderr


def test_bundle_list_into_a_pipe_has_one_line_per_bundle(cli) -> None:  # type: ignore[no-untyped-def]
    message = "bad price for SKU-0137: -4.99 is below zero; " * 6
    proc = cli("capture", "--json", "--", sys.executable, "-c", f"raise ValueError({message!r})")
    bundle = json.loads(proc.stdout.strip().splitlines()[-1])["bundle"]
    listed = cli("bundle", "list")  # stdout is a pipe
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    assert header.split()[:2] == ["id", "created"]
    assert row.startswith(bundle[:12] + "  ") and message.strip() in row


def test_triage_of_an_s3_store_writes_its_report_under_the_working_directory(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path, s3_url: str, s3_server: S3Server
) -> None:
    env = s3_server.env
    proc = cli("capture", "--json", "--", sys.executable, "-c", "raise ValueError('boom')")
    bundle = json.loads(proc.stdout.strip().splitlines()[-1])["bundle"]
    pushed = cli("bundle", "push", bundle, "--to", s3_url, env=env)
    assert pushed.returncode == 0, pushed.stderr
    work = tmp_path / "elsewhere"
    work.mkdir()
    triaged = cli(
        "triage", bundle[:12], "--store", s3_url, "--max-replays", "5", "--json", "--sandbox", "process",
        cwd=work, env=env,
    )  # fmt: skip
    assert triaged.returncode == 0, triaged.stderr
    assert "note: the store s3://" in triaged.stderr and ".flaketriage/issues" in triaged.stderr
    report = json.loads(triaged.stdout.strip().splitlines()[-1])["report"]
    assert report["kind"] == "markdown"
    written = (
        work / report["location"] if not Path(report["location"]).is_absolute() else Path(report["location"])
    )
    assert written.is_file() and written.parent == work / ".flaketriage" / "issues"
    assert "ValueError: boom" in written.read_text()
