"""The pytest plugin on real test files, run by pytester in real pytest processes.

Each test writes a small suite, runs it with ``--flaketriage`` and reads what landed in the store;
the captured bundles are replayed with the real `Replayer` (plain subprocess sandbox) to show the
plugin's fingerprint is the one a replay computes.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from flaketriage.bundle.io import list_bundles, load_manifest, write_bundle
from flaketriage.bundle.manifest import Manifest
from flaketriage.bundle.variant import variant_of_manifest
from flaketriage.ci.pytest_plugin import Captured, seed_pinned, summary
from flaketriage.store import LocalStore
from flaketriage.workers.polluters import OrderTarget, fails_in
from flaketriage.workers.quarantine.file import Quarantine
from flaketriage.workers.replay import ReplayContext, Replayer, Variant
from flaketriage.workers.sandbox import ProcessSandbox
from flaketriage.workers.triage import triage
from flaketriage.workers.verdict import Outcome, Verdict, VerdictPolicy

pytest_plugins = ["pytester"]

LONG = "x" * 300


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("FLAKETRIAGE_") or name in (
            "CI",
            "BUILD_NUMBER",
            "PYTEST_ADDOPTS",
            "PYTHONHASHSEED",
        ):
            monkeypatch.delenv(name)


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def only_our_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    """pytest loads flaketriage's plugin alone (`run` names it): the other plugins installed here
    (schemathesis, hypothesis...) take seconds to load, in every run and in every replay of a
    bundle it captures (the bundle records this environment), for tests that start many."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


def run(pytester: pytest.Pytester, store_dir: Path, *args: str) -> pytest.RunResult:
    # ``-p flaketriage``: the plugin by its entry point, also where autoloading is off.
    return pytester.runpytest_subprocess(
        "-p",
        "flaketriage",
        "--flaketriage",
        f"--flaketriage-store={store_dir}",
        "-p",
        "no:cacheprovider",
        *args,
        timeout=120,
    )


def captured(store_dir: Path) -> list[Manifest]:
    """Bundles in the store, oldest first."""
    if not store_dir.exists():
        return []
    store = LocalStore(store_dir)
    return sorted((load_manifest(store, b.id) for b in list_bundles(store)), key=lambda m: m.created_at)


def by_test(store_dir: Path) -> dict[str, Manifest]:
    """The store's bundles by failing test id (one each)."""
    out = {str(m.failure.test_id): m for m in captured(store_dir)}
    assert len(out) == len(captured(store_dir))
    return out


def with_argv(store_dir: Path, manifest: Manifest, argv: tuple[str, ...]) -> Manifest:
    """A copy of the bundle whose rerun command is `argv`, written to the store."""
    store = LocalStore(store_dir)
    command = manifest.command.model_copy(update={"argv": argv})
    return load_manifest(store, write_bundle(store, manifest.model_copy(update={"command": command})))


def replay_once(store_dir: Path, manifest: Manifest) -> Outcome:
    with Replayer(
        LocalStore(store_dir), manifest, ProcessSandbox(), context=ReplayContext.from_process()
    ) as replayer:
        return replayer.run().outcome


# -- switching it on -------------------------------------------------------------------------------
FAILING = """
def test_fails():
    assert 1 == 2
"""


def test_off_unless_enabled_and_off_inside_replays(
    pytester: pytest.Pytester, store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_one=FAILING)
    plain = pytester.runpytest_subprocess(f"--flaketriage-store={store_dir}")
    assert plain.ret == 1
    assert "flaketriage:" not in plain.stdout.str()
    monkeypatch.setenv("FLAKETRIAGE_REPLAY", "1")
    replay = run(pytester, store_dir)
    assert replay.ret == 1
    assert "flaketriage:" not in replay.stdout.str()
    assert not store_dir.exists()


@pytest.mark.parametrize("how", ["ini", "env"])
def test_enabled_by_ini_or_environment(
    pytester: pytest.Pytester, store_dir: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    pytester.makepyfile(test_one=FAILING)
    if how == "ini":
        pytester.makeini("[pytest]\nflaketriage = true\n")
    else:
        monkeypatch.setenv("FLAKETRIAGE_PYTEST", "1")
    result = pytester.runpytest_subprocess(f"--flaketriage-store={store_dir}")
    result.stdout.re_match_lines([r"flaketriage: captured 1 failure\(s\): [0-9a-f]{12} \(sent: no\)"])
    assert list(by_test(store_dir)) == ["test_one.py::test_fails"]


def test_a_passing_suite_imports_nothing_heavy(pytester: pytest.Pytester, store_dir: Path) -> None:
    pytester.makepyfile(test_ok="def test_ok():\n    pass\n")
    pytester.makeconftest(
        """
import sys
def pytest_unconfigure(config):
    names = ("pydantic", "flaketriage.settings", "flaketriage.ci.pytest_bundle")
    heavy = [m for m in names if m in sys.modules]
    print("HEAVY", heavy)
"""
    )
    result = run(pytester, store_dir, "-s")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*flaketriage: captured 0 failures*", "HEAVY []"])
    assert not store_dir.exists()


# -- what a bundle holds ---------------------------------------------------------------------------
def test_bundle_holds_rerun_command_seeds_output_and_the_tests_before_it(
    pytester: pytest.Pytester, store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", "123")
    pytester.makepyfile(
        test_a="def test_one():\n    pass\n\ndef test_two():\n    open('written.txt', 'w').write('out')\n",
        test_b="""
import sys
def test_fails():
    print("to stdout")
    sys.stderr.write("to stderr\\n")
    assert [1, 2] == [1, 3]
def test_after():
    pass
""",
    )
    result = run(pytester, store_dir)
    assert result.ret == 1
    (manifest,) = captured(store_dir)
    nodeid = "test_b.py::test_fails"
    assert manifest.kind == "test"
    assert manifest.failure.test_id == nodeid
    assert manifest.failure.message == "assert [1, 2] == [1, 3]"
    argv = manifest.command.argv
    # Options first, then "--" and the node id: nothing an ini's addopts ends with can take it.
    assert argv[:3] == (sys.executable, "-m", "pytest") and argv[-2:] == ("--", nodeid)
    assert {"no:cacheprovider", "no:randomly", "-rfE", "--color=no"} <= set(argv)
    assert manifest.command.cwd == str(pytester.path)
    assert manifest.command.env["COLUMNS"] == "1000"
    assert "PYTEST_CURRENT_TEST" not in manifest.command.env
    assert manifest.seeds.python_hash_seed == "123"
    assert manifest.pytest is not None
    assert manifest.pytest.preceding == ("test_a.py::test_one", "test_a.py::test_two")
    assert manifest.pytest.node_id == nodeid
    assert manifest.pytest.rootdir == manifest.pytest.invocation_dir == str(pytester.path)
    assert "preceding_tests" not in manifest.annotations and "pytest" not in manifest.annotations
    store = LocalStore(store_dir)
    stdout = store.get_bytes(manifest.logs["stdout"].sha256).decode()
    stderr = store.get_bytes(manifest.logs["stderr"].sha256).decode()
    assert "to stdout" in stdout and "to stderr" in stderr
    assert f"FAILED {nodeid} - assert [1, 2] == [1, 3]" in stdout
    assert manifest.failure.traceback and "assert [1, 2] == [1, 3]" in manifest.failure.traceback
    files = {f.path for f in manifest.source.files}
    assert {"test_a.py", "test_b.py"} <= files
    assert "written.txt" not in files  # written by a test: an output, not source
    bundle_id = manifest.bundle_id
    result.stdout.fnmatch_lines([f"flaketriage: captured 1 failure(s): {bundle_id[:12]} (sent: no)"])


def test_pytest_randomly_seed_is_recorded_and_given_to_the_rerun(
    pytester: pytest.Pytester, store_dir: Path
) -> None:
    # A stand-in registered under pytest-randomly's plugin name, with its options.
    pytester.makepyfile(
        randomly="""
def pytest_addoption(parser):
    parser.addoption("--randomly-seed", dest="randomly_seed", type=int, default=0)
    parser.addoption("--randomly-dont-reorganize", action="store_false", dest="randomly_reorganize")
""",
        test_one=FAILING,
    )
    assert run(pytester, store_dir, "-p", "randomly", "--randomly-seed=4321").ret == 1
    (manifest,) = captured(store_dir)
    assert manifest.seeds.values == {"pytest-randomly": 4321}
    assert manifest.seeds.drawn == ()  # set on the command line: every CI run uses it
    argv = manifest.command.argv
    assert "--randomly-seed=4321" in argv and "--randomly-dont-reorganize" in argv
    assert "no:randomly" not in argv


def test_a_pytest_randomly_seed_the_session_drew_is_recorded_as_drawn(
    pytester: pytest.Pytester, store_dir: Path
) -> None:
    # As pytest-randomly does: with no seed given, it draws one at configure time.
    pytester.makepyfile(
        randomly="""
def pytest_addoption(parser):
    parser.addoption("--randomly-seed", dest="randomly_seed", default="default")
    parser.addoption("--randomly-dont-reorganize", action="store_false", dest="randomly_reorganize")

def pytest_configure(config):
    if config.option.randomly_seed in ("default", "last"):
        config.option.randomly_seed = 2468
    else:
        config.option.randomly_seed = int(config.option.randomly_seed)
""",
        test_one=FAILING,
    )
    assert run(pytester, store_dir, "-p", "randomly").ret == 1
    (manifest,) = captured(store_dir)
    assert manifest.seeds.values == {"pytest-randomly": 2468} and manifest.seeds.drawn == ("pytest-randomly",)
    assert "--randomly-seed=2468" in manifest.command.argv  # the replay reproduces under it


@pytest.mark.parametrize(
    ("args", "pinned"),
    [
        (["--randomly-seed=12"], True),
        (["-x", "--randomly-seed", "12"], True),
        (["--randomly-seed=last"], False),
        (["--randomly-seed", "default"], False),
        (["--randomly-seed"], False),
        ([], False),
    ],
)
def test_a_seed_is_pinned_only_by_a_number_in_the_options(args: list[str], pinned: bool) -> None:
    assert seed_pinned(args) is pinned


# -- captured fingerprints are the ones replays compute ---------------------------------------------
SHAPES = f"""
import pytest

def test_long_message():
    assert False, "{LONG}"

def test_very_long_message():
    raise ValueError("{"y" * 3000}")

def test_multiline():
    raise RuntimeError("first line\\nsecond line")

def test_numbers_vary():
    import random
    raise KeyError(random.random())

def test_fail_call():
    pytest.fail("plain failure")

@pytest.fixture
def broken():
    raise OSError("setup broke")

def test_setup_error(broken):
    pass

@pytest.fixture
def bad_teardown():
    yield
    raise RuntimeError("teardown broke")

def test_call_and_teardown(bad_teardown):
    assert 0, "call broke"

@pytest.mark.xfail(strict=True, reason="expected to fail")
def test_strict_xpass():
    pass
"""


@pytest.mark.usefixtures("only_our_plugin")
@pytest.mark.parametrize(("env", "flags"), [({}, ()), ({"CI": "true"}, ("-v",))])
def test_every_failure_shape_replays_as_a_reproduction(
    pytester: pytest.Pytester,
    store_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    flags: tuple[str, ...],
) -> None:
    # The session's own terminal is 80 columns (pytest cuts long summary messages there); the
    # rerun's is 1000, and on CI nothing is cut: capture and replay must agree either way.
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("COLUMNS", "80")
    pytester.makepyfile(test_shapes=SHAPES)
    assert run(pytester, store_dir, *flags).ret == 1
    bundles = by_test(store_dir)
    assert len(bundles) == 8, list(bundles)
    both = bundles["test_shapes.py::test_call_and_teardown"].failure.signature
    assert "call broke" in both and "teardown broke" in both
    # One real replay through the Replayer...
    assert replay_once(store_dir, bundles["test_shapes.py::test_long_message"]) is Outcome.REPRODUCED
    # ...and every shape at once: each bundle's rerun command with all the failing tests, in one
    # process, read per test the way the polluter search reads it.
    some = bundles["test_shapes.py::test_long_message"]
    nodeid = some.failure.test_id or ""
    target = OrderTarget(
        nodeid=nodeid, preceding=(), argv=some.command.argv, position=some.command.argv.index(nodeid)
    )
    with Replayer(
        LocalStore(store_dir), some, ProcessSandbox(), context=ReplayContext.from_process()
    ) as replayer:
        others = [t for t in bundles if t != target.nodeid]
        process = replayer.run(Variant(argv=target.argv_with(others))).process
    for test_id, manifest in bundles.items():
        assert fails_in(process, test_id, manifest.failure.fingerprint), test_id


# -- triage of captured tests ----------------------------------------------------------------------
# Decides after 2 clean replays alone and 2 with the polluters (instead of 5 and 5): the same
# logic, fewer pytest processes. The end-to-end test runs the defaults through the CLI.
FAST = VerdictPolicy(max_rate=0.2, flaky_rate_replays=0)


def _triage(store_dir: Path, manifest: Manifest, quarantine: Quarantine | None = None) -> Any:
    return triage(
        LocalStore(store_dir),
        manifest.bundle_id,
        sandbox=ProcessSandbox(),
        policy=FAST,
        sink=None,
        quarantine=quarantine,
        context=ReplayContext.from_process(),
    )


ORDER_SUITE = {
    "state": "FLAGS = {}\n",
    "test_a": """
import state
def test_clean():
    pass
def test_pollutes():
    state.FLAGS["dirty"] = True
def test_innocent():
    pass
""",
    "test_b": "\n".join(f"def test_{i}():\n    pass\n" for i in range(6)),
    "test_z": """
import state
def test_victim():
    assert not state.FLAGS, f"left behind: {state.FLAGS}"
""",
}


@pytest.mark.usefixtures("only_our_plugin")
def test_order_dependent_failure_names_its_polluter(pytester: pytest.Pytester, store_dir: Path) -> None:
    pytester.makepyfile(**ORDER_SUITE)
    assert run(pytester, store_dir).ret == 1
    (manifest,) = captured(store_dir)
    assert manifest.pytest is not None and len(manifest.pytest.preceding) == 9
    result = _triage(store_dir, manifest)
    assert result.verdict.verdict is Verdict.ORDER_DEPENDENT
    assert result.polluters == ["test_a.py::test_pollutes"]
    data = result.to_json()
    assert data["verdict"] == "order_dependent"
    assert data["polluters"] == ["test_a.py::test_pollutes"]
    assert data["passes"] == 2 and data["failures"] == 0
    search = data["polluter_search"]
    assert (search["confirmations"], search["confirm_runs"]) == (1, 1)
    assert search["oracle_calls"] <= 2 * 3.17 + 5


@pytest.mark.usefixtures("only_our_plugin")
def test_a_budget_spent_inside_the_polluter_search_names_no_polluter_and_decides_nothing(
    pytester: pytest.Pytester, store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import flaketriage.workers.triage as triage_module
    from flaketriage.workers.cost import CostMeter

    class RunsMeter(CostMeter):
        """A budget of 5 runs instead of seconds: spent after the 2 alone, the 2 in order and
        one run of the search, whatever each run cost."""

        def exhausted(self) -> bool:
            self.cost.budget_spent = self.cost.budget_spent or self.cost.runs >= 5
            return self.cost.budget_spent

    monkeypatch.setattr(triage_module, "CostMeter", RunsMeter)
    pytester.makepyfile(**ORDER_SUITE)
    assert run(pytester, store_dir).ret == 1
    (manifest,) = captured(store_dir)
    result = triage(
        LocalStore(store_dir),
        manifest.bundle_id,
        sandbox=ProcessSandbox(),
        policy=FAST,
        sink=None,
        quarantine=None,
        context=ReplayContext.from_process(),
        budget_s=1000.0,
    )
    data = result.to_json()
    assert result.polluter_search is None and result.polluters == []
    assert data["decided"] is False and data["cost"]["budget_spent"] is True
    assert data["cost"]["runs"] == 5 and data["report"]["kind"] == "none"


# An option whose value is optional, like pytest-cov's ``--cov``: at the end of ``addopts`` it takes
# whatever argument follows it as its value when that argument does not look like an option.
OPTIONAL_VALUE_OPTION = """
def pytest_addoption(parser):
    parser.addoption("--opt", nargs="?", const="all", default=None)
"""


@pytest.mark.usefixtures("only_our_plugin")
@pytest.mark.parametrize("how", ["ini", "env"])
def test_addopts_ending_in_an_optional_value_option_do_not_take_the_node_id(
    pytester: pytest.Pytester, store_dir: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    pytester.makepyfile(**ORDER_SUITE)
    pytester.makeconftest(OPTIONAL_VALUE_OPTION)
    if how == "ini":
        pytester.makeini("[pytest]\naddopts = --opt\n")
    else:
        monkeypatch.setenv("PYTEST_ADDOPTS", "--opt")
    assert run(pytester, store_dir).ret == 1
    (manifest,) = captured(store_dir)
    with Replayer(
        LocalStore(store_dir), manifest, ProcessSandbox(), context=ReplayContext.from_process()
    ) as replayer:
        alone = replayer.run()
    # The victim alone, not the whole suite that a node id taken as --opt's value would leave.
    assert alone.outcome is Outcome.PASSED
    assert "1 passed" in alone.process.stdout and "10 passed" not in alone.process.stdout
    result = _triage(store_dir, manifest)
    assert result.verdict.verdict is Verdict.ORDER_DEPENDENT
    assert result.polluters == ["test_a.py::test_pollutes"]


@pytest.mark.usefixtures("only_our_plugin")
def test_a_bundle_with_the_node_id_before_the_options_still_replays_and_is_searched(
    pytester: pytest.Pytester, store_dir: Path
) -> None:
    # Bundles captured before the rerun command put its options first name the test right after
    # ``pytest``: the polluter search finds it wherever it is.
    pytester.makepyfile(**ORDER_SUITE)
    assert run(pytester, store_dir).ret == 1
    (captured_now,) = captured(store_dir)
    argv = list(captured_now.command.argv)
    nodeid = argv.pop()
    assert argv.pop() == "--"
    manifest = with_argv(store_dir, captured_now, (*argv[:3], nodeid, *argv[3:]))
    target = OrderTarget.of(manifest)
    assert target is not None and target.position == 3
    result = _triage(store_dir, manifest)
    assert result.verdict.verdict is Verdict.ORDER_DEPENDENT
    assert result.polluters == ["test_a.py::test_pollutes"]


@pytest.mark.usefixtures("only_our_plugin")
def test_a_replay_that_pytest_refuses_says_why_in_the_finding(
    pytester: pytest.Pytester, store_dir: Path
) -> None:
    pytester.makepyfile(test_one=FAILING)
    assert run(pytester, store_dir).ret == 1
    (captured_now,) = captured(store_dir)
    # The rerun names a test its source does not have: pytest exits 4 with "ERROR: not found: ...".
    manifest = with_argv(store_dir, captured_now, (*captured_now.command.argv[:-1], "test_one.py::test_gone"))
    result = _triage(store_dir, manifest)
    (finding,) = result.findings
    assert finding.kind == "exit"
    assert finding.summary.startswith("exit:4 (pytest usage error): ERROR: not found: ")
    assert finding.summary.rstrip().endswith("test_one.py::test_gone")


@pytest.mark.usefixtures("only_our_plugin")
def test_flaky_test_is_quarantined_and_then_does_not_fail_the_build(
    pytester: pytest.Pytester, store_dir: Path
) -> None:
    # Fails on odd runs: every run outside a replay, and every other replay. Replays share no
    # state (each runs in a private copy named run-1, run-2, ...), so the copy's name counts them.
    pytester.makepyfile(
        test_flaky="""
from pathlib import Path
def test_sometimes():
    copies = [p for p in Path.cwd().parts if p.startswith("run-")]
    n = int(copies[-1][4:]) + 1 if copies else 1
    assert n % 2 == 0, f"odd run {n}"
def test_steady():
    pass
"""
    )
    assert run(pytester, store_dir).ret == 1
    (manifest,) = captured(store_dir)
    quarantine = Quarantine(store_dir / "quarantine.json")
    result = _triage(store_dir, manifest, quarantine)
    assert result.verdict.verdict is Verdict.FLAKY
    assert result.polluters == [] and result.to_json()["polluters"] == []
    assert quarantine.is_quarantined("test_flaky.py::test_sometimes")
    # Limited to the GPU model of the runner that captured it (none here): the next run is the same.
    (entry,) = quarantine.entries().values()
    assert entry.variant == {"gpu": variant_of_manifest(manifest)["gpu"]} and entry.signatures == ()
    again = run(pytester, store_dir)
    assert again.ret == 0, again.stdout.str()
    again.stdout.fnmatch_lines(
        [
            "*QUARANTINED test_flaky.py::test_sometimes - flaky: reproduced 1 of 2 replays*",
            "flaketriage: captured 1 failure(s): * (sent: no)",
            "*1 passed, 1 quarantined*",
        ]
    )
    quarantined = [m for m in captured(store_dir) if m.annotations.get("quarantined")]
    assert len(quarantined) == 1  # its outcome still lands in the store


# -- quarantine enforcement ------------------------------------------------------------------------
TWO_FAILING = """
def test_known_flaky():
    assert False, "flaky again"
def test_real_bug():
    assert False, "real"
def test_fine():
    pass
"""

ENTRY = {
    "test_id": "test_two.py::test_known_flaky",
    "reason": "flaky: reproduced 3 of 20 replays",
    "issue_url": "https://github.com/acme/app/issues/7",
    "evidence": {
        "verdict": "flaky",
        "decided": True,
        "replays": 20,
        "reproductions": 3,
        "passes": 17,
        "different": 0,
        "rate": {"estimate": 0.15, "low": 0.03, "high": 0.38},
    },
    "command": "python -m pytest test_two.py::test_known_flaky",
    "bundle_id": "e" * 64,
    "bundles": ["e" * 64],
    "occurrences": 1,
    "quarantined_at": "2024-05-01T12:00:00Z",
    "updated_at": "2024-05-01T12:00:00Z",
}


def _quarantine_doc(**entries: dict[str, Any]) -> dict[str, Any]:
    """A quarantine document: each entry under its fingerprint."""
    return {"version": 1, "entries": {fp: {**e, "fingerprint": fp} for fp, e in entries.items()}}


def test_quarantine_file_marks_the_test_and_keeps_the_others_failing(
    pytester: pytest.Pytester, store_dir: Path
) -> None:
    pytester.makepyfile(test_two=TWO_FAILING)
    store_dir.mkdir()
    (store_dir / "quarantine.json").write_text(json.dumps(_quarantine_doc(**{"ab" * 32: ENTRY})))
    result = run(pytester, store_dir, "-rfE")
    assert result.ret == 1  # test_real_bug still fails the build
    out = result.stdout.str()
    assert "FAILED test_two.py::test_real_bug" in out
    assert "FAILED test_two.py::test_known_flaky" not in out
    result.stdout.fnmatch_lines(
        [
            "*QUARANTINED test_two.py::test_known_flaky - flaky: reproduced 3 of 20 replays "
            "(https://github.com/acme/app/issues/7)*",
            "flaketriage: captured 2 failure(s): * * (sent: no)",
            "*1 failed, 1 passed, 1 quarantined*",
        ]
    )
    assert len(captured(store_dir)) == 2


class _QuarantineService:
    """``GET /v1/quarantine`` from a real HTTP server on 127.0.0.1, in a thread: `doc` with its
    ETag, 304 to a request naming it (the status of each answer in `answered`)."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.answered: list[int] = []
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = json.dumps(service.doc).encode()
                etag = f'"{len(service.doc["entries"])}"'
                status = 304 if self.headers.get("If-None-Match") == etag else 200
                status = status if self.path == "/v1/quarantine" else 404
                service.answered.append(status)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("ETag", etag)
                self.end_headers()
                if status != 304:
                    self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/quarantine"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def service() -> Iterator[_QuarantineService]:
    running = _QuarantineService(_quarantine_doc(**{"cd" * 32: ENTRY}))
    yield running
    if running.thread.is_alive():
        running.stop()


@pytest.mark.usefixtures("only_our_plugin")
def test_quarantine_from_the_service_then_from_its_cache_when_unreachable(
    pytester: pytest.Pytester, store_dir: Path, monkeypatch: pytest.MonkeyPatch, service: _QuarantineService
) -> None:
    pytester.makepyfile(test_two=TWO_FAILING)
    monkeypatch.setenv("FLAKETRIAGE_QUARANTINE_URL", service.url)
    monkeypatch.setenv("FLAKETRIAGE_QUARANTINE_FETCH_TIMEOUT_S", "2")
    entries, service.doc = service.doc, _quarantine_doc()
    assert run(pytester, store_dir).ret == 1  # nothing quarantined yet
    service.doc = entries  # quarantined between this run and the next

    first = run(pytester, store_dir)
    first.stdout.fnmatch_lines(["*QUARANTINED test_two.py::test_known_flaky*", "*1 quarantined*"])
    assert service.answered == [200, 200]
    cache = json.loads((store_dir / "quarantine-cache.json").read_text())
    assert cache["url"] == service.url and "cd" * 32 in cache["list"]["entries"]

    run(pytester, store_dir).stdout.fnmatch_lines(["*1 quarantined*"])
    assert service.answered == [200, 200, 304]  # asked again, and told the copy is current

    service.stop()
    stale = run(pytester, store_dir)
    stale.stdout.fnmatch_lines(
        [
            f"*warning: quarantine service {service.url} unreachable (*); using the cached list from *",
            "*1 failed, 1 passed, 1 quarantined*",
        ]
    )

    (store_dir / "quarantine-cache.json").unlink()
    bare = run(pytester, store_dir)
    assert bare.ret == 1
    bare.stdout.fnmatch_lines(["*unreachable (*) and no cached list; running without a quarantine list*"])
    bare.stdout.fnmatch_lines(["*2 failed, 1 passed*"])


@pytest.mark.usefixtures("only_our_plugin")
def test_the_service_list_is_fetched_at_session_start_even_when_no_test_fails(
    pytester: pytest.Pytester, store_dir: Path, monkeypatch: pytest.MonkeyPatch, service: _QuarantineService
) -> None:
    # The test itself finds the cached list: it was fetched before any test ran.
    pytester.makepyfile(test_ok="import os\ndef test_ok():\n    assert os.path.isfile(os.environ['CACHE'])\n")
    monkeypatch.setenv("CACHE", str(store_dir / "quarantine-cache.json"))
    monkeypatch.setenv("FLAKETRIAGE_QUARANTINE_URL", service.url)
    monkeypatch.setenv("FLAKETRIAGE_QUARANTINE_FETCH_TIMEOUT_S", "2")
    assert run(pytester, store_dir).ret == 0
    assert service.answered == [200]
    assert run(pytester, store_dir).ret == 0
    assert service.answered == [200, 304]  # conditional: the cached copy is still current

    service.stop()
    down = run(pytester, store_dir)
    assert down.ret == 0  # a service that does not answer never fails the run
    down.stdout.fnmatch_lines(
        ["*warning: quarantine service * unreachable (*); using the cached list from *"]
    )


# -- sending ---------------------------------------------------------------------------------------
def test_each_captured_bundle_is_handed_to_the_sender(
    pytester: pytest.Pytester, store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import flaketriage.ci.notify as notify

    handed: list[str] = []

    def fake_send(settings: Any, store: Any, bundle_ids: list[str]) -> notify.Sending:
        handed.extend(bundle_ids)
        deliveries = [notify.Delivery(b, "e" * 32, "queued", "the service is down") for b in bundle_ids]
        return notify.Sending(notify.FlushResult(), deliveries, store_dir / "outbox")

    monkeypatch.setattr(notify, "send_bundles", fake_send)
    pytester.makepyfile(test_two=TWO_FAILING)
    result = pytester.runpytest_inprocess(
        "--flaketriage", f"--flaketriage-store={store_dir}", "-p", "no:cacheprovider"
    )
    ids = sorted(m.bundle_id for m in captured(store_dir))
    assert sorted(handed) == ids and len(ids) == 2
    result.stdout.fnmatch_lines(
        [
            "flaketriage: warning: 2 event(s) queued in * (the service is down); the next run*",
            "flaketriage: captured 2 failure(s): * * (sent: queued)",
        ]
    )


def test_a_refusal_is_the_last_line_even_without_the_terminal_summary(
    pytester: pytest.Pytester, store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import flaketriage.ci.notify as notify

    def refuse(settings: Any, store: Any, bundle_ids: list[str]) -> notify.Sending:
        why = "HTTP 401; set FLAKETRIAGE_WEBHOOK_SECRET to the secret the service has"
        deliveries = [
            notify.Delivery(b, "e" * 32, "refused", why, "FLAKETRIAGE_WEBHOOK_SECRET") for b in bundle_ids
        ]
        return notify.Sending(notify.FlushResult(), deliveries, store_dir / "outbox")

    monkeypatch.setattr(notify, "send_bundles", refuse)
    pytester.makepyfile(test_two=TWO_FAILING)
    result = pytester.runpytest_inprocess(
        "--flaketriage", f"--flaketriage-store={store_dir}", "-p", "no:cacheprovider", "-q", "--no-summary"
    )
    lines = [line for line in result.stdout.lines if line.strip()]
    assert lines[-1].startswith("flaketriage: error: 2 event(s) not sent"), lines
    assert "FLAKETRIAGE_WEBHOOK_SECRET" in lines[-1]
    assert sum("flaketriage: error:" in line for line in lines) == 1


def test_summary_line_says_how_the_bundles_went() -> None:
    got = [Captured("t.py::a", "a" * 64, False), Captured("t.py::b", "b" * 64, True)]
    assert summary([], {}) == "flaketriage: captured 0 failures"
    assert summary(got, {"a" * 64: "sent", "b" * 64: "sent"}).endswith("(sent: yes)")
    assert summary(got, {}) == f"flaketriage: captured 2 failure(s): {'a' * 12} {'b' * 12} (sent: no)"
    assert summary(got, {"a" * 64: "sent", "b" * 64: "queued"}).endswith("(sent: 1 yes, 1 queued)")
    assert summary(got, {"a" * 64: "refused", "b" * 64: "refused"}).endswith("(sent: refused)")
