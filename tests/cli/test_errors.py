"""Bad input: a clear one-line error and a non-zero exit, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from flaketriage.store import LocalStore
from tests.conftest import free_port


def _assert_clean_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error:"), proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


def _capture_failure(cli, tmp_path: Path) -> str:  # type: ignore[no-untyped-def]
    (tmp_path / "bad.py").write_text("raise RuntimeError('boom')\n")
    proc = cli("capture", "--json", "--", sys.executable, "bad.py")
    assert proc.returncode == 1, proc.stderr
    bundle: str = json.loads(proc.stdout.strip().splitlines()[-1])["bundle"]
    return bundle


def test_unknown_bundle_id(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _capture_failure(cli, tmp_path)
    for command in (["bundle", "show"], ["bundle", "verify"], ["triage"]):
        _assert_clean_error(cli(*command, "deadbeef"), "no bundle deadbeef", "bundle list")


def test_corrupt_blob(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bundle = _capture_failure(cli, tmp_path)
    store = LocalStore(tmp_path / ".flaketriage")
    manifest_raw = store.get_bytes(bundle)
    stdout_key = json.loads(manifest_raw)["logs"]["stdout"]["sha256"]
    store._object_path(stdout_key).write_bytes(b"\x00tampered")
    verify = cli("bundle", "verify", bundle)
    assert verify.returncode == 1
    assert stdout_key in verify.stderr and "corrupt" in verify.stderr
    _assert_clean_error(cli("bundle", "export", bundle, str(tmp_path / "out")), stdout_key, "corrupt")
    assert not (tmp_path / "out").exists()


def test_missing_blob(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bundle = _capture_failure(cli, tmp_path)
    store = LocalStore(tmp_path / ".flaketriage")
    key = json.loads(store.get_bytes(bundle))["logs"]["stderr"]["sha256"]
    store._object_path(key).unlink()
    proc = cli("bundle", "verify", bundle)
    assert proc.returncode == 1 and key in proc.stderr and "not in the store" in proc.stderr


def test_store_path_not_writable(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "file").write_text("x")
    proc = cli("capture", "--store", str(tmp_path / "file" / "store"), "--", sys.executable, "-c", "pass")
    _assert_clean_error(proc, "cannot write to the store", "FLAKETRIAGE_STORE")


def test_command_that_does_not_exist(cli) -> None:  # type: ignore[no-untyped-def]
    _assert_clean_error(
        cli("capture", "--", "no-such-command-xyz", "--flag"), "command not found", "no-such-command-xyz"
    )


def test_no_command(cli) -> None:  # type: ignore[no-untyped-def]
    proc = cli("capture")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr


def test_missing_and_unknown_data(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _assert_clean_error(cli("capture", "--data", "nope.csv", "--", sys.executable, "-c", "pass"), "nope.csv")
    (tmp_path / "weights.bin").write_bytes(b"\x00\x01")
    _assert_clean_error(
        cli("capture", "--data", "weights.bin", "--", sys.executable, "-c", "pass"), "weights.bin", ".csv"
    )
    # Checked before the command runs: nothing ran, nothing was stored.
    assert not (tmp_path / ".flaketriage" / "refs" / "bundles").exists()


def test_bad_options(cli) -> None:  # type: ignore[no-untyped-def]
    _assert_clean_error(cli("capture", "--metric", "loss", "--", "true"), "--above")
    _assert_clean_error(cli("capture", "--fail-pattern", "(", "--", "true"), "regular expression")
    _assert_clean_error(cli("capture", "--above", "3", "--", "true"), "--metric")


def test_export_into_a_non_empty_directory(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bundle = _capture_failure(cli, tmp_path)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    _assert_clean_error(cli("bundle", "export", bundle, str(busy)), str(busy))
    assert (busy / "keep.txt").read_text() == "mine"


def test_list_without_a_store(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc = cli("bundle", "list", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout) == []


def test_error_text_with_brackets_is_printed_verbatim(cli) -> None:  # type: ignore[no-untyped-def]
    proc = cli("capture", "--fail-pattern", "[unclosed", "--", "true")
    _assert_clean_error(proc, "[unclosed")


def _assert_one_line(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    _assert_clean_error(proc, *needles)
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_bad_settings_are_one_line_naming_the_variable(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cases = {
        "FLAKETRIAGE_MAX_REPLAYS": (
            "abc",
            "FLAKETRIAGE_MAX_REPLAYS=abc is not valid: must be an integer >= 1",
        ),
        "FLAKETRIAGE_ALPHA": (
            "2",
            "FLAKETRIAGE_ALPHA=2 is not valid: must be less than 1 (a number in (0, 1))",
        ),
        "FLAKETRIAGE_SANDBOX": ("nope", "FLAKETRIAGE_SANDBOX=nope is not valid: must be one of auto, bwrap"),
        "FLAKETRIAGE_STORE": ("", "FLAKETRIAGE_STORE='' is not valid: the store location is empty"),
    }
    for variable, (value, line) in cases.items():
        proc = cli("capture", "--", sys.executable, "-c", "pass", env={variable: value})
        _assert_one_line(proc, line)
    _assert_one_line(cli("bundle", "list", env={"FLAKETRIAGE_ALPHA": "2"}), "FLAKETRIAGE_ALPHA=2")
    assert not (tmp_path / ".flaketriage").exists()  # nothing ran


def test_store_urls_the_cli_cannot_open(cli) -> None:  # type: ignore[no-untyped-def]
    _assert_one_line(cli("bundle", "list", "--store", "ftp://host/x"), "ftp://", "memory://NAME")
    dead = {
        "FLAKETRIAGE_STORE": "s3://bucket/ft",
        "FLAKETRIAGE_S3_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }
    _assert_one_line(
        cli("capture", "--", sys.executable, "-c", "pass", env=dead),
        "s3://bucket/ft",
        "cannot be reached",
    )


def test_a_file_url_store_is_a_directory(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url = (tmp_path / "url-store").as_uri()
    (tmp_path / "bad.py").write_text("raise RuntimeError('boom')\n")
    proc = cli("capture", "--store", url, "--json", "--", sys.executable, "bad.py")
    assert proc.returncode == 1, proc.stderr
    listed = cli("bundle", "list", "--json", env={"FLAKETRIAGE_STORE": url})
    assert listed.returncode == 0 and len(json.loads(listed.stdout)) == 1
    assert (tmp_path / "url-store" / "refs" / "bundles").is_dir()
