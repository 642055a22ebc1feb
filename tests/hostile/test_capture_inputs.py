"""Capture never loses a failure it has seen; bad settings are one line; memory stays bounded.

Hostile and careless inputs to ``capture`` (and a few to ``triage``, ``bundle`` and the pytest
plugin), through the real CLI in a fresh project: bytes that are not UTF-8 in arguments and the
environment, data that is broken, empty, or rewritten by the command, metrics files that cannot
be read, settings that cannot work, a store the command wrecks, and a large CSV.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from flaketriage.bundle.io import list_bundles, load_manifest
from flaketriage.bundle.manifest import Manifest
from flaketriage.store import open_store
from tests.hostile.conftest import Sandbox, assert_no_traceback, assert_one_line_error

MARKER = "ran.marker"
FAIL_AND_MARK = f"open({MARKER!r}, 'w').close(); raise SystemExit(1)"


def manifests(sandbox: Sandbox) -> list[Manifest]:
    if not sandbox.store.is_dir():
        return []
    store = open_store(str(sandbox.store), readonly=True)
    return [load_manifest(store, s.id) for s in list_bundles(store)]


def only_manifest(sandbox: Sandbox) -> Manifest:
    found = manifests(sandbox)
    assert len(found) == 1, found
    return found[0]


def blob(sandbox: Sandbox, sha256: str) -> bytes:
    return open_store(str(sandbox.store), readonly=True).get_bytes(sha256)


# -- bytes that are not UTF-8 in argv and the environment ------------------------------------------

# Fails (exit 3) only when it receives exactly the original bytes, so a replay that mangled them
# would pass, and the verdict would not be deterministic.
EXACT_BYTES = """\
import os, sys
got = (sys.argv[1].encode("utf-8", "surrogateescape"), os.environb.get(b"X"))
print(repr(sys.argv), repr(os.environb.get(b"X")))
sys.exit(3 if got == (b"bad\\xff", b"\\xfe") else 0)
"""


def test_non_utf8_argument_and_environment_are_kept_and_replayed(sandbox: Sandbox) -> None:
    (sandbox.project / "fail.py").write_text(EXACT_BYTES)
    env = {"X": os.fsdecode(b"\xfe")}
    proc = sandbox.run("capture", "--", sys.executable, "fail.py", b"bad\xff", env=env)
    assert proc.returncode == 3, proc.stderr
    assert_no_traceback(proc)
    assert "captured bundle" in proc.stderr
    manifest = only_manifest(sandbox)
    assert manifest.command.argv[-1].encode("utf-8", "surrogateescape") == b"bad\xff"
    assert manifest.command.env["X"].encode("utf-8", "surrogateescape") == b"\xfe"
    # Stored as JSON can hold it (a marked escape), and read back to the same bytes.
    raw = blob(sandbox, manifest.bundle_id)
    assert b"bad\\\\xff" in raw and b"\\u0000" in raw

    triage = sandbox.run("triage", manifest.bundle_id[:12], "--json", "--max-replays", "8", env=env)
    assert triage.returncode == 0, triage.stderr
    result = json.loads(triage.stdout)
    assert result["verdict"] == "deterministic", result
    assert result["failures"] == result["replays"] >= 2

    for args in (["bundle", "list"], ["bundle", "show", manifest.bundle_id[:12]]):
        shown = sandbox.run(*args)
        assert shown.returncode == 0, shown.stderr
        assert_no_traceback(shown)
        assert "$'bad\\xff'" in shown.stdout

    exported = sandbox.project / "export"
    proc = sandbox.run("bundle", "export", manifest.bundle_id[:12], str(exported))
    assert proc.returncode == 0, proc.stderr
    run_sh = (exported / "run.sh").read_bytes()
    assert b"$'bad\\xff'" in run_sh and run_sh.isascii()
    again = subprocess.run(
        ["bash", "run.sh"], cwd=exported, env=sandbox.env(env), capture_output=True, check=False
    )
    assert again.returncode == 3, again.stderr
    assert sandbox.outside_writes() == set()


# -- declared data: checked before the run, stored as it was read -----------------------------------


def _truncated_npy(path: Path) -> None:
    np.save(path, np.zeros((1000, 8)))
    path.write_bytes(path.read_bytes()[:300])


BROKEN_DATA: dict[str, tuple[Callable[[Path], object], str]] = {
    "not-numpy.npy": (lambda p: p.write_bytes(b"just some text, not an array\n"), "NumPy magic"),
    "truncated.npy": (_truncated_npy, "not a .npy array"),
    "empty-file.npy": (lambda p: p.write_bytes(b""), "NumPy magic"),
    "bare-cr.csv": (lambda p: p.write_bytes(b"a,b\nx\ry,z\n"), "not readable as CSV"),
}


@pytest.mark.parametrize("name", sorted(BROKEN_DATA))
def test_broken_data_is_refused_before_the_command_runs(sandbox: Sandbox, name: str) -> None:
    write, needle = BROKEN_DATA[name]
    write(sandbox.project / name)
    proc = sandbox.run("capture", "--data", name, "--", sys.executable, "-c", FAIL_AND_MARK)
    assert_one_line_error(proc, 2, name, needle)
    assert not (sandbox.project / MARKER).exists(), "the command ran"
    assert manifests(sandbox) == []
    assert sandbox.outside_writes() == set()


def test_unreadable_data_is_refused_before_the_command_runs(sandbox: Sandbox) -> None:
    data = sandbox.project / "locked.csv"
    data.write_text("a,b\n1,2\n")
    data.chmod(0o000)
    prefix: list[str] = []
    if os.geteuid() == 0:
        # Root reads any file; without these two capabilities it obeys the mode bits like anyone.
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: a mode-000 file stays readable")
        prefix = [setpriv, "--bounding-set=-dac_override,-dac_read_search", "--"]
    argv = ["capture", "--data", "locked.csv", "--", sys.executable, "-c", FAIL_AND_MARK]
    proc = subprocess.run(
        [*prefix, sys.executable, "-m", "flaketriage", *argv],
        cwd=sandbox.project,
        env=sandbox.env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert_one_line_error(proc, 2, "locked.csv", "Permission denied")
    assert not (sandbox.project / MARKER).exists(), "the command ran"
    assert sandbox.outside_writes() == set()


def test_csv_that_is_not_utf8_is_accepted_byte_for_byte(sandbox: Sandbox) -> None:
    original = b"name,city\r\n1,caf\xe9\r\n2,M\xfcnchen\r\n"
    (sandbox.project / "latin1.csv").write_bytes(original)
    proc = sandbox.run("capture", "--data", "latin1.csv", "--", sys.executable, "-c", FAIL_AND_MARK)
    assert proc.returncode == 1, proc.stderr
    assert_no_traceback(proc)
    (data,) = only_manifest(sandbox).data
    assert data.items == 2 and data.blob is not None
    assert blob(sandbox, data.blob.sha256) == original


WRECK_INPUT = {
    "deletes": "import os; os.remove('data.csv')",
    "rewrites": "open('data.csv', 'w').write('x\\n')",
    "replaces": "open('new.csv', 'w').write('x\\n'); __import__('os').replace('new.csv', 'data.csv')",
}


@pytest.mark.parametrize("how", sorted(WRECK_INPUT))
def test_bundle_keeps_the_data_the_command_read(sandbox: Sandbox, how: str) -> None:
    original = b"id,value\n" + b"".join(b"%d,%d\n" % (i, i * i) for i in range(100))
    (sandbox.project / "data.csv").write_bytes(original)
    code = f"{WRECK_INPUT[how]}; raise SystemExit(4)"
    proc = sandbox.run("capture", "--data", "data.csv", "--", sys.executable, "-c", code)
    assert proc.returncode == 4, proc.stderr
    assert_no_traceback(proc)
    assert (sandbox.project / "data.csv").exists() == (how != "deletes")
    (data,) = only_manifest(sandbox).data
    assert data.path == "data.csv" and data.items == 100 and data.blob is not None
    assert blob(sandbox, data.blob.sha256) == original
    assert sandbox.outside_writes() == set()


# The command removes the copy of its input from the store, as a garbage collection running during
# a long command would (nothing references it until the manifest is written).
COLLECT_INPUT = (
    "import hashlib, os; key = hashlib.sha256(open('data.csv', 'rb').read()).hexdigest(); "
    "os.remove(os.path.join('.flaketriage', 'objects', key[:2], key[2:]))"
)


def test_input_collected_during_the_run_is_stored_again(sandbox: Sandbox) -> None:
    original = b"id\n1\n2\n"
    (sandbox.project / "data.csv").write_bytes(original)
    proc = sandbox.run(
        "capture", "--data", "data.csv", "--", sys.executable, "-c", COLLECT_INPUT + "; exit(6)"
    )
    assert proc.returncode == 6, proc.stderr
    assert_no_traceback(proc)
    (data,) = only_manifest(sandbox).data
    assert data.blob is not None and blob(sandbox, data.blob.sha256) == original


def test_input_collected_and_changed_during_the_run_is_reported(sandbox: Sandbox) -> None:
    (sandbox.project / "data.csv").write_bytes(b"id\n1\n2\n")
    code = COLLECT_INPUT + "; open('data.csv', 'w').write('id\\n3\\n'); exit(6)"
    proc = sandbox.run("capture", "--data", "data.csv", "--", sys.executable, "-c", code)
    assert_one_line_error(proc, 6, "could not record it", "data.csv", "garbage collection")
    assert manifests(sandbox) == []
    assert sandbox.outside_writes() == set()


def _empty_dir(path: Path) -> None:
    path.mkdir()


EMPTY_DATA: dict[str, tuple[Callable[[Path], object], str]] = {
    "empty.csv": (lambda p: p.write_bytes(b""), "no records"),
    "header-only.csv": (lambda p: p.write_bytes(b"a,b,c\r\n"), "no records"),
    "blank.jsonl": (lambda p: p.write_bytes(b"\n  \n"), "no non-empty lines"),
    "nothing.npy": (lambda p: np.save(p, np.zeros((0, 3))), "no entries"),
    "shards": (_empty_dir, "an empty directory"),
}


@pytest.mark.parametrize("name", sorted(EMPTY_DATA))
def test_empty_data_is_accepted_with_a_warning(sandbox: Sandbox, name: str) -> None:
    write, needle = EMPTY_DATA[name]
    write(sandbox.project / name)
    proc = sandbox.run("capture", "--data", name, "--", sys.executable, "-c", FAIL_AND_MARK)
    assert proc.returncode == 1, proc.stderr
    assert_no_traceback(proc)
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("flaketriage: warning:")]
    assert len(warnings) == 1, proc.stderr
    assert name in warnings[0] and needle in warnings[0] and "nothing to minimize" in warnings[0]
    (data,) = only_manifest(sandbox).data
    assert data.items == 0 and data.path == name
    assert sandbox.outside_writes() == set()


# -- the store -----------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["", "   "])
@pytest.mark.parametrize("command", ["capture", "triage", "bundle list"])
def test_empty_store_setting_is_an_error(sandbox: Sandbox, command: str, value: str) -> None:
    args = {
        "capture": ["capture", "--", sys.executable, "-c", FAIL_AND_MARK],
        "triage": ["triage", "abcd"],
        "bundle list": ["bundle", "list"],
    }[command]
    proc = sandbox.run(*args, env={"FLAKETRIAGE_STORE": value})
    assert_one_line_error(proc, 2, "FLAKETRIAGE_STORE", "empty")
    assert list(sandbox.project.iterdir()) == [], "something was written in the project"
    assert sandbox.outside_writes() == set()


def test_a_store_wrecked_by_the_command_is_reported_and_the_status_kept(sandbox: Sandbox) -> None:
    # The command replaces the store's object directory with a file: the bundle cannot be written.
    code = (
        "import shutil; shutil.rmtree('.flaketriage/objects'); "
        "open('.flaketriage/objects', 'w').close(); raise SystemExit(5)"
    )
    proc = sandbox.run("capture", "--", sys.executable, "-c", code)
    line = assert_one_line_error(
        proc, 5, "the command failed", "could not record it", "no bundle was written"
    )
    assert "exit 5" in line
    assert sandbox.outside_writes() == set()


# -- metrics files -------------------------------------------------------------------------------

BROKEN_METRICS = {
    "missing": ("pass", "no such file"),
    "directory": ("import os; os.mkdir('m.json')", "Is a directory"),
    "not-json": ("open('m.json', 'w').write('loss: high\\nstep two\\n')", "no line of it is a JSON object"),
    "empty": ("open('m.json', 'w').close()", "the file is empty"),
}
METRIC = ["--metric", "loss", "--above", "1.0", "--metrics-file", "m.json"]


@pytest.mark.parametrize("reason", sorted(BROKEN_METRICS))
def test_unreadable_metrics_file_is_a_metric_failure(sandbox: Sandbox, reason: str) -> None:
    code, detail = BROKEN_METRICS[reason]
    proc = sandbox.run("capture", *METRIC, "--", sys.executable, "-c", code)
    assert proc.returncode == 1, proc.stderr  # the command passed; the criterion could not be evaluated
    assert_no_traceback(proc)
    said = [line for line in proc.stderr.splitlines() if "metrics file m.json could not be read" in line]
    assert len(said) == 1 and detail in said[0], proc.stderr
    failure = only_manifest(sandbox).failure
    assert failure.kind == "metric" and failure.detail is not None and detail in failure.detail
    assert failure.signature == f"metric|file|{'unreadable' if reason == 'directory' else reason}"
    assert sandbox.outside_writes() == set()


def test_unreadable_metrics_file_replays_deterministically(sandbox: Sandbox) -> None:
    proc = sandbox.run("capture", *METRIC, "--", sys.executable, "-c", "pass")
    assert proc.returncode == 1, proc.stderr
    manifest = only_manifest(sandbox)
    triage = sandbox.run("triage", manifest.bundle_id[:12], "--json", "--max-replays", "8")
    assert triage.returncode == 0, triage.stderr
    result = json.loads(triage.stdout)
    assert result["verdict"] == "deterministic" and result["failures"] == result["replays"], result


def test_readable_metrics_within_bounds_pass(sandbox: Sandbox) -> None:
    code = "open('m.json', 'w').write('{\"loss\": 0.5}')"
    proc = sandbox.run("capture", *METRIC, "--", sys.executable, "-c", code)
    assert proc.returncode == 0, proc.stderr
    assert manifests(sandbox) == []


def test_a_crash_outranks_a_missing_metrics_file(sandbox: Sandbox) -> None:
    proc = sandbox.run("capture", *METRIC, "--", sys.executable, "-c", "raise KeyError('boom')")
    assert proc.returncode == 1, proc.stderr
    failure = only_manifest(sandbox).failure
    assert failure.kind == "exception" and failure.exception_type == "KeyError"


# -- settings: one line naming the variable, from every entry point --------------------------------

BAD_SETTINGS = {
    "FLAKETRIAGE_MAX_REPLAYS": ("abc", "an integer >= 1"),
    "FLAKETRIAGE_ALPHA": ("2", "a number in (0, 1)"),
    "FLAKETRIAGE_SANDBOX": ("podman", "one of auto, bwrap, process, docker"),
}


@pytest.mark.parametrize("variable", sorted(BAD_SETTINGS))
@pytest.mark.parametrize("command", ["capture", "triage", "bundle list"])
def test_bad_setting_is_one_line_naming_it(sandbox: Sandbox, variable: str, command: str) -> None:
    value, accepts = BAD_SETTINGS[variable]
    args = {
        "capture": ["capture", "--", sys.executable, "-c", FAIL_AND_MARK],
        "triage": ["triage", "abcd"],
        "bundle list": ["bundle", "list"],
    }[command]
    proc = sandbox.run(*args, env={variable: value})
    assert_one_line_error(proc, 2, f"{variable}={value}", accepts)
    assert not (sandbox.project / MARKER).exists(), "the command ran"
    assert sandbox.outside_writes() == set()


PLUGIN_SETTINGS = {
    **{var: (value, f"{var}={value}", accepts) for var, (value, accepts) in BAD_SETTINGS.items()},
    "FLAKETRIAGE_STORE": ("", "FLAKETRIAGE_STORE=''", "empty"),
}


@pytest.mark.parametrize("variable", sorted(PLUGIN_SETTINGS))
def test_bad_setting_warns_in_the_pytest_plugin(sandbox: Sandbox, variable: str) -> None:
    value, named, accepts = PLUGIN_SETTINGS[variable]
    (sandbox.project / "test_one.py").write_text("def test_fails():\n    assert 1 == 2\n")
    proc = subprocess.run(
        # flaketriage's plugin alone: the other plugins installed here take seconds to load.
        [sys.executable, "-m", "pytest", "-q", "-p", "flaketriage", "-p", "no:cacheprovider", "test_one.py"],
        cwd=sandbox.project,
        env=sandbox.env({"FLAKETRIAGE_PYTEST": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", variable: value}),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output  # the test's failure, not an internal error (3)
    assert "Traceback (most recent call last)" not in output and "INTERNALERROR" not in output, output
    warnings = [line for line in output.splitlines() if line.startswith("flaketriage: warning:")]
    assert warnings and all(named in w and accepts in w for w in warnings), output
    assert not (sandbox.project / ".flaketriage").exists()
    assert sandbox.outside_writes() == set()


# -- memory --------------------------------------------------------------------------------------

PEAK_RSS = """\
import resource, subprocess, sys
code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode
print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def test_capture_of_a_large_csv_stays_within_its_memory_bound(sandbox: Sandbox) -> None:
    data = sandbox.project / "big.csv"
    row = b"12345,0.123456789,some text that repeats,another column,987654321\n"
    blocks = 60 * 1024 * 1024 // (len(row) * 1000)
    with data.open("wb") as f:
        f.write(b"id,x,text,other,n\n")
        for _ in range(blocks):
            f.write(row * 1000)
    size = data.stat().st_size
    # A fresh measuring process, so the peak is this capture's alone (KiB on Linux).
    argv = [sys.executable, "-m", "flaketriage", "capture", "--data", "big.csv"]
    proc = subprocess.run(
        [sys.executable, "-c", PEAK_RSS, *argv, "--", sys.executable, "-c", "raise SystemExit(1)"],
        cwd=sandbox.project,
        env=sandbox.env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    code, peak_kib = map(int, proc.stdout.split())
    assert code == 1, proc.stderr
    assert_no_traceback(proc)
    assert only_manifest(sandbox).data[0].items == blocks * 1000  # every row counted
    bound = 2 * size + 150 * 1024 * 1024
    assert peak_kib * 1024 < bound, f"peak RSS {peak_kib / 1024:.0f} MiB, bound {bound / 2**20:.0f} MiB"
