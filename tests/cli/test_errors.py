"""Bad input: a clear one-line error and a non-zero exit, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from flaketriage.store import LocalStore


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
