"""Every flaky verdict leaves a mark: a bundle captured as a whole pytest command quarantines the
tests it failed (from pytest's summary and its JUnit XML report), which the plugin then skips; a
flaky failure with no test identity is reported as an issue.

The runs are real: the CLI captures a real ``python -m pytest`` of a small project, the plugin
enforces the quarantine in another real pytest process. The verdict itself is given (the triage's
replays are `tests/workers/test_triage.py`'s), except in the one end-to-end test at the bottom.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from flaketriage.bundle.io import load_manifest
from flaketriage.bundle.manifest import Command, Manifest
from flaketriage.bundle.variant import variant_of_manifest
from flaketriage.capture.record import CaptureRequest, run_and_capture
from flaketriage.capture.source import SourceLimits
from flaketriage.errors import CaptureError
from flaketriage.failure.runner_results import (
    JUNIT_ATTACHMENT,
    failed_tests,
    is_test_runner,
    junit_argument,
    junit_failures,
    read_junit_file,
)
from flaketriage.orchestrator import github_hooks
from flaketriage.orchestrator.cases import quarantine_document
from flaketriage.orchestrator.intake import Intake
from flaketriage.orchestrator.sightings import StorePolicy
from flaketriage.quarantine import MAX_TESTS, QuarantineDocument
from flaketriage.records import Case, Database
from flaketriage.settings import load_settings
from flaketriage.store import LocalStore
from flaketriage.work.dispatch import Dispatcher, MemorySender
from flaketriage.work.messages import Step
from flaketriage.workers.pipeline import Pipeline
from flaketriage.workers.quarantine.file import Quarantine, failed_tests_of
from flaketriage.workers.quarantine.records import RecordsQuarantine
from flaketriage.workers.replay import ReplayContext
from flaketriage.workers.report import MarkdownIssueSink, MemoryIssueSink, ReportRef
from flaketriage.workers.report.render import render_comment
from flaketriage.workers.runtime import WorkerEnv
from flaketriage.workers.sandbox import ProcessSandbox
from flaketriage.workers.triage import TriageResult, report
from flaketriage.workers.verdict import RateInterval, Verdict, VerdictResult

SUITE = """
import pytest

def test_passes():
    pass

def test_flaky_function():
    assert False, "unlucky draw"

class TestModel:
    def test_flaky_method(self):
        raise KeyError("cache")

@pytest.mark.parametrize("n", [1, 2])
def test_param(n):
    assert n == 1
"""
FAILING = {
    "tests/test_suite.py::test_flaky_function",
    "tests/test_suite.py::TestModel::test_flaky_method",
    "tests/test_suite.py::test_param[2]",
}
FLAKY = VerdictResult(
    verdict=Verdict.FLAKY,
    decided=True,
    replays=20,
    reproductions=9,
    passes=11,
    different=0,
    rate=RateInterval(estimate=0.45, low=0.23, high=0.68),
)
# Only flaketriage's plugin, by its entry point: the others installed here cost seconds a process.
QUIET_PLUGINS = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


class Project:
    """A git project under `root`, its store in ``.flaketriage``, and the real CLI to capture in it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.store_dir = root / ".flaketriage"
        root.mkdir()
        (root / ".gitignore").write_text(".flaketriage/\n__pycache__/\n*.xml\n")
        self.write("tests/test_suite.py", SUITE)
        git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
        subprocess.run([*git, "init", "-q"], cwd=root, check=True)
        subprocess.run([*git, "add", "-A"], cwd=root, check=True)
        subprocess.run([*git, "commit", "-qm", "init"], cwd=root, check=True)

    def write(self, name: str, text: str) -> Path:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("FLAKETRIAGE_", "PYTEST_"))}
        return {**env, "FLAKETRIAGE_STORE": str(self.store_dir), **QUIET_PLUGINS, **extra}

    def capture(self, *argv: str, cwd: Path | None = None) -> tuple[Manifest, str]:
        """Capture `argv` (a failing run) with ``flaketriage capture``: its manifest and stderr."""
        proc = subprocess.run(
            [sys.executable, "-m", "flaketriage", "capture", "--json", "--", *argv],
            cwd=cwd or self.root,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        assert out["bundle"], proc.stderr
        return load_manifest(self.store, out["bundle"]), proc.stderr

    @property
    def store(self) -> LocalStore:
        return LocalStore(self.store_dir)

    @property
    def quarantine(self) -> Quarantine:
        return Quarantine(self.store_dir / "quarantine.json")

    def report_flaky(self, manifest: Manifest, sink: MarkdownIssueSink | None = None) -> None:
        result = TriageResult(bundle_id=manifest.bundle_id, verdict=FLAKY)
        ref = report(self.store, manifest, result, sink, self.quarantine)
        assert ref is not None and ref.kind == "quarantine"

    def enforce(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        """The suite again (`env` added), with the plugin enforcing the store's quarantine list."""
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "flaketriage", "-p", "no:cacheprovider", "--flaketriage",
             f"--flaketriage-store={self.store_dir}", *args],
            cwd=self.root,
            env=self.env(**env),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )  # fmt: skip


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Project]:
    yield Project(tmp_path / "project")


def _only_entry(project: Project) -> object:
    entries = project.quarantine.entries()
    assert len(entries) == 1, entries
    return next(iter(entries.values()))


# -- the captured run's failing tests are quarantined, and CI skips them -----------------------------
def test_a_flaky_whole_pytest_run_quarantines_every_test_it_failed(project: Project) -> None:
    manifest, _ = project.capture(sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "tests/")
    assert manifest.failure.kind == "test"
    project.report_flaky(manifest)
    entry = project.quarantine.get(manifest.failure.fingerprint)
    assert entry is not None and set(entry.tests) == FAILING
    assert entry.test_id in FAILING
    assert "quarantines the 3 test(s) the captured run failed" in entry.reason
    enforced = project.enforce("tests/")
    assert enforced.returncode == 0, enforced.stdout
    assert "2 passed, 3 quarantined" in enforced.stdout
    for test in FAILING:
        assert f"QUARANTINED {test}" in enforced.stdout


def test_a_run_that_prints_no_summary_is_read_from_its_junit_report(project: Project) -> None:
    argv = ("pytest", "-q", "--tb=no", "-rN", "-p", "no:cacheprovider", "--junitxml=reports/junit.xml")
    manifest, _ = project.capture(*argv, "tests/")
    assert manifest.failure.kind == "exit"  # nothing in the output names a test
    assert JUNIT_ATTACHMENT in manifest.attachments
    project.report_flaky(manifest)
    entry = project.quarantine.get(manifest.failure.fingerprint)
    assert entry is not None and set(entry.tests) == FAILING
    enforced = project.enforce("tests/")
    assert enforced.returncode == 0 and "3 quarantined" in enforced.stdout, enforced.stdout


def test_the_service_records_the_tests_too(project: Project, tmp_path: Path) -> None:
    manifest, _ = project.capture("pytest", "-p", "no:cacheprovider", "--junit-xml", "junit.xml", "tests/")
    database = Database(f"sqlite:///{tmp_path / 'service.db'}")
    database.upgrade()
    try:
        result = TriageResult(bundle_id=manifest.bundle_id, verdict=FLAKY)
        ref = report(project.store, manifest, result, None, RecordsQuarantine(database))
        assert ref is not None and ref.kind == "quarantine"
        document = quarantine_document(database)  # what GET /v1/quarantine serves
    finally:
        database.dispose()
    # Limited to the capturing machine's GPU model (FLAKETRIAGE_QUARANTINE_VARIANT_KEYS): its runs match.
    found = document.find(
        {"tests/test_suite.py::TestModel::test_flaky_method"}, variant=variant_of_manifest(manifest)
    )
    assert found is not None and set(found.tests) == FAILING
    assert QuarantineDocument.from_json(document.to_json()) == document


def test_thousands_of_failing_tests_are_bounded_and_the_entry_says_so(project: Project) -> None:
    project.write(
        "tests/test_many.py",
        "import pytest\n\n@pytest.mark.parametrize('n', range(2000))\ndef test_many(n):\n    assert n < 0\n",
    )
    manifest, _ = project.capture("pytest", "-q", "-p", "no:cacheprovider", "tests/test_many.py")
    project.report_flaky(manifest)
    entry = project.quarantine.get(manifest.failure.fingerprint)
    assert entry is not None and len(entry.tests) == MAX_TESTS
    assert f"{2000 - MAX_TESTS} more failed and are not quarantined: at most {MAX_TESTS}" in entry.reason


def test_a_test_id_once_quarantined_stays_when_the_failure_recurs(project: Project) -> None:
    manifest, _ = project.capture("pytest", "-p", "no:cacheprovider", "tests/")
    project.report_flaky(manifest)
    project.report_flaky(manifest)
    entry = project.quarantine.get(manifest.failure.fingerprint)
    assert entry is not None and entry.occurrences == 2 and set(entry.tests) == FAILING


# -- careless and hostile JUnit reports at capture ----------------------------------------------------
def test_a_report_outside_the_workspace_is_not_captured(project: Project) -> None:
    manifest, stderr = project.capture(
        "pytest", "-p", "no:cacheprovider", "--junitxml=../outside.xml", "tests/"
    )
    assert (project.root.parent / "outside.xml").is_file()  # pytest wrote it; the capture left it
    assert JUNIT_ATTACHMENT not in manifest.attachments
    assert "is outside the workspace" in stderr and "Traceback" not in stderr
    project.report_flaky(manifest)  # the summary still names the tests
    entry = project.quarantine.get(manifest.failure.fingerprint)
    assert entry is not None and set(entry.tests) == FAILING


def test_a_symlinked_report_is_not_followed(project: Project) -> None:
    elsewhere = project.root / "elsewhere.xml"
    elsewhere.write_text("<testsuites/>")
    (project.root / "report.xml").symlink_to(elsewhere)
    manifest, stderr = project.capture("pytest", "-p", "no:cacheprovider", "--junitxml=report.xml", "tests/")
    assert JUNIT_ATTACHMENT not in manifest.attachments
    assert "it is a symbolic link" in stderr and "Traceback" not in stderr


def test_a_report_the_run_never_wrote_is_a_warning(project: Project) -> None:
    project.write("tests/conftest.py", "import os\n\ndef pytest_sessionstart(session):\n    os._exit(3)\n")
    manifest, stderr = project.capture("pytest", "-p", "no:cacheprovider", "--junitxml=never.xml", "tests/")
    assert manifest.failure.exit_code == 3 and JUNIT_ATTACHMENT not in manifest.attachments
    assert "never.xml" in stderr and "cannot be read" in stderr and "Traceback" not in stderr


def test_read_junit_file_refuses_big_and_special_files(tmp_path: Path) -> None:
    (tmp_path / "big.xml").write_bytes(b"<testsuites>" + b" " * 100 + b"</testsuites>")
    with pytest.raises(CaptureError, match="larger than 50 bytes"):
        read_junit_file(tmp_path, "big.xml", tmp_path, max_bytes=50)
    os.mkfifo(tmp_path / "fifo.xml")  # opened without blocking, then refused
    with pytest.raises(CaptureError, match="not a regular file"):
        read_junit_file(tmp_path, "fifo.xml", tmp_path)
    assert read_junit_file(tmp_path, str(tmp_path / "big.xml"), tmp_path).startswith(b"<testsuites>")


# -- reading a report: malformed and hostile XML -------------------------------------------------------
BILLION_LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
<!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">]>
<testsuites><testcase classname="t" name="&lol3;"><failure/></testcase></testsuites>"""
EXTERNAL = b"""<?xml version="1.0"?>
<!DOCTYPE r [<!ENTITY x SYSTEM "file:///etc/passwd">]>
<testsuites><testcase classname="t" name="&x;"><failure/></testcase></testsuites>"""


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (BILLION_LAUGHS, "declares a document type"),
        (EXTERNAL, "declares a document type"),
        (b"<testsuites><testcase name='a'>", "not well-formed"),
        (b"\x00\xff not xml", "not well-formed"),
        (b"", "not well-formed"),
    ],
)
def test_a_hostile_or_broken_report_is_one_clear_error(data: bytes, why: str) -> None:
    with pytest.raises(CaptureError, match=why):
        junit_failures(data)


def test_a_broken_report_attached_to_a_bundle_still_quarantines_by_the_summary(project: Project) -> None:
    manifest, _ = project.capture("pytest", "-p", "no:cacheprovider", "--junitxml=junit.xml", "tests/")
    broken = manifest.model_copy(
        update={"attachments": {JUNIT_ATTACHMENT: project.store.put_bytes(EXTERNAL)}}
    )
    tests = failed_tests_of(project.store, broken)
    assert tests is not None and set(tests.ids) == FAILING
    assert tests.notes and "declares a document type" in tests.notes[0]


def test_junit_testcases_become_node_ids() -> None:
    report = b"""<testsuites><testsuite>
    <testcase classname="tests.test_a" name="test_fn"><failure message="x"/></testcase>
    <testcase classname="tests.test_a.TestOuter.TestInner" name="test_m[1-a.b]"><error/></testcase>
    <testcase classname="pkg.mod" name="test_x" file="pkg/mod.py"><failure/></testcase>
    <testcase classname="tests.test_a" name="test_ok"/>
    <testcase classname="tests.test_a" name="test_skip"><skipped/></testcase>
    </testsuite></testsuites>"""
    assert junit_failures(report) == [
        "tests/test_a.py::test_fn",
        "tests/test_a.py::TestOuter::TestInner::test_m[1-a.b]",
        "pkg/mod.py::test_x",
    ]


def test_junit_ids_of_unittest_classes_and_other_module_names() -> None:
    # mccabe's test_mccabe.py holds a unittest class RegressionTests: the module is the part named
    # like a test module, whatever the class after it is called; a module collected under other
    # python_files names has none, and its Test* parts are the classes.
    report = b"""<testsuites><testsuite>
    <testcase classname="test_mccabe.RegressionTests" name="test_max_complexity_is_always_an_int">
      <failure/></testcase>
    <testcase classname="tests.check_io.TestRead" name="test_x"><failure/></testcase>
    <testcase classname="" name="tests.test_broken"><error/></testcase>
    <testcase classname="" name="test_top"><error/></testcase>
    </testsuite></testsuites>"""
    assert junit_failures(report) == [
        "test_mccabe.py::RegressionTests::test_max_complexity_is_always_an_int",
        "tests/check_io.py::TestRead::test_x",
        "tests/test_broken.py",
        "test_top.py",
    ]


def test_a_captured_runs_junit_ids_are_ci_historys_ids() -> None:
    # The two readers of pytest's JUnit XML (a captured run's failed tests; CI history) name every
    # test alike, on reports the real pytest wrote.
    from flaketriage.results.junit import read_junit

    fixtures = Path(__file__).parents[1] / "results" / "fixtures"
    for name in ("pytest.xml", "pytest-xunit1.xml", "pytest-reruns.xml"):
        data = (fixtures / name).read_bytes()
        failing = {t.test_id for t in read_junit(data) if t.outcome in ("failed", "error")}
        failing |= {
            t.test_id
            for t in read_junit(data)
            if any(a.outcome in ("failed", "error") for a in t.attempts[:-1])
        }
        found = set(junit_failures(data))
        assert found and found <= failing, (name, found - failing)


def test_junit_ids_are_made_relative_to_where_pytest_ran() -> None:
    stdout = "rootdir: /w/repo\nconfigfile: pytest.ini\n"  # pytest 8 prints configfile on its own line
    report = b'<testsuites><testcase classname="sub.tests.test_a" name="t"><failure/></testcase></testsuites>'
    assert failed_tests(stdout, "", report, cwd="/w/repo/sub").ids == ("tests/test_a.py::t",)
    assert failed_tests("rootdir: /w/repo, configfile: x.ini", "", report, cwd="/w/repo/sub").ids == (
        "tests/test_a.py::t",
    )
    assert failed_tests("", "", report, cwd="/w/repo/sub").ids == ("sub/tests/test_a.py::t",)


@pytest.mark.parametrize(
    ("argv", "runner", "junit"),
    [
        (["python", "-m", "pytest", "--junitxml=r.xml", "tests/"], True, "r.xml"),
        (["/usr/bin/python3.12", "-m", "pytest", "--junit-xml", "out/r.xml"], True, "out/r.xml"),
        (["py.test", "--junitxml", "a.xml", "--junitxml=b.xml"], True, "b.xml"),
        (["/venv/bin/pytest", "-q", "--", "--junitxml=r.xml"], True, None),
        (["pytest", "--junitxml"], True, None),
        (["python", "train.py", "--junitxml=r.xml"], False, None),
        (["make", "test"], False, None),
        ([], False, None),
    ],
)
def test_which_commands_are_test_runners(argv: list[str], runner: bool, junit: str | None) -> None:
    assert is_test_runner(argv) is runner
    assert junit_argument(argv) == junit


# -- a flaky failure with no test identity is still reported ----------------------------------------------
def test_a_flaky_failure_with_no_test_identity_is_reported_as_an_issue(
    tmp_path: Path, make_manifest: Callable[..., Manifest]
) -> None:
    manifest = make_manifest()  # python train.py: no test, nothing the plugin can skip
    sink = MarkdownIssueSink(tmp_path / "issues")
    quarantine = Quarantine(tmp_path / "quarantine.json")
    result = TriageResult(bundle_id=manifest.bundle_id, verdict=FLAKY)
    ref = report(LocalStore(tmp_path / "store"), manifest, result, sink, quarantine)
    assert ref is not None and ref.kind == "quarantine"
    issue = sink.path_for(manifest.failure.fingerprint)
    assert issue.is_file() and "flaky" in issue.read_text()
    entry = quarantine.get(manifest.failure.fingerprint)
    assert entry is not None and entry.test_id is None and entry.issue_url == str(issue)
    # With no quarantine list the issue is the report: never nothing.
    alone = report(LocalStore(tmp_path / "store"), manifest, result, sink, None)
    assert alone is not None and alone.kind == "markdown" and alone.location == str(issue)


# -- the whole loop: capture, triage (real replays), quarantine, enforcement ------------------------------
FLIPS = """
import os

def test_flips():
    # Fails 35% of the time: replays run in a sandbox that can write only its workspace, so no
    # counter outside it can alternate them.
    assert not os.environ.get("ALWAYS_FAIL") and os.urandom(1)[0] >= 90, "unlucky draw"

def test_steady():
    pass
"""


@pytest.mark.slow
def test_capture_and_triage_of_a_flaky_pytest_run_quarantine_its_test(tmp_path: Path) -> None:
    project = Project(tmp_path / "flips")
    project.write("tests/test_suite.py", FLIPS)
    # With max_flaky_rate 0.9, "deterministic" needs 29 reproductions in a row (0.35**29 ≈ 6e-14),
    # and "not reproduced" 59 passes in a row (0.65**59 ≈ 1e-11).
    env = project.env(FLAKETRIAGE_MAX_FLAKY_RATE="0.9", FLAKETRIAGE_FLAKY_RATE_REPLAYS="0")
    argv = [sys.executable, "-m", "flaketriage", "capture", "--json", "--", "pytest", "tests/"]
    for _ in range(60):  # until a run fails (0.65**60 ≈ 6e-12 that none does)
        cap = subprocess.run(argv, cwd=project.root, env=env, capture_output=True, text=True, timeout=300)
        bundle = json.loads(cap.stdout.strip().splitlines()[-1])["bundle"]
        if bundle:
            break
    assert bundle, cap.stderr
    triage = subprocess.run(
        [sys.executable, "-m", "flaketriage", "triage", bundle, "--json", "--sandbox", "process"],
        cwd=project.root, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    out = json.loads(triage.stdout.strip().splitlines()[-1])
    assert out["verdict"] == "flaky", (out, triage.stderr)
    entries = json.loads(Path(out["report"]["location"]).read_text())["entries"]
    assert [e["tests"] for e in entries.values()] == [["tests/test_suite.py::test_flips"]]
    enforced = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "flaketriage", "-p", "no:cacheprovider", "--flaketriage",
         f"--flaketriage-store={project.store_dir}", "-q", "tests/"],
        cwd=project.root, env={**env, "ALWAYS_FAIL": "1"}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert enforced.returncode == 0 and "1 passed, 1 quarantined" in enforced.stdout, enforced.stdout


# -- the service: a check run naming the bundle, the pipeline's verdict, GET /v1/quarantine -------------
SOMETIMES = """
import os

def test_sometimes():
    # Fails 35% of the time (see the CLI test above for the odds), or always under ALWAYS_FAIL.
    assert not os.environ.get("ALWAYS_FAIL") and os.urandom(1)[0] >= 90, "unlucky draw"

class TestOther:
    def test_passes(self):
        pass
"""


@pytest.mark.slow
def test_a_check_run_naming_a_flaky_pytest_run_quarantines_its_test_in_the_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This process captures and replays: in the environment the CLI tests give their subprocesses.
    for name in [n for n in os.environ if n.startswith(("FLAKETRIAGE_", "PYTEST_"))]:
        monkeypatch.delenv(name)
    for name, value in Project(tmp_path / "unused").env().items():
        monkeypatch.setenv(name, value)
    project = Project(tmp_path / "service-project")
    project.write("tests/test_suite.py", SOMETIMES)
    store = project.store
    request = CaptureRequest(
        argv=["pytest", "-q", "--tb=no", "-rN", "-p", "no:cacheprovider", "--junitxml=junit.xml", "tests/"],
        cwd=project.root,
        limits=SourceLimits(1 << 20, 1 << 24),
        echo=False,
    )
    captured = next(r for r in (run_and_capture(store, request) for _ in range(60)) if r.bundle_id)
    assert captured.bundle_id is not None and captured.failure is not None
    assert captured.failure.kind == "exit"  # only the JUnit report names the test
    database = Database(f"sqlite:///{tmp_path / 'service.db'}")
    database.upgrade()
    sender = MemorySender()
    dispatcher = Dispatcher(database, sender, sweep_after_s=60)
    settings = load_settings(store=str(project.store_dir), replay_batch=4, max_flaky_rate=0.9)
    env = WorkerEnv(
        settings=settings,
        database=database,
        dispatcher=dispatcher,
        sandbox=ProcessSandbox(),
        sink=MemoryIssueSink(),
        commenter=None,
        context=ReplayContext.from_process(),
    )
    try:
        payload = {
            "action": "completed",
            "check_run": {
                "id": 77,
                "name": "tests",
                "head_sha": "ce587453ced02b1526dfb4cb910479d431683101",
                "conclusion": "failure",
                "html_url": "https://github.com/acme/app/runs/77",
                "output": {"summary": f"1 failed\nflaketriage-bundle: {captured.bundle_id}\n"},
            },
            "repository": {"full_name": "acme/app"},
        }
        parsed = github_hooks.parse("check_run", payload, StorePolicy([store.url]))
        intake = Intake(database, dispatcher, retriage_after_s=3600, storm_window_s=0)
        recorded = intake.record("github", "delivery-77", "check_run", parsed.sightings)
        pipeline = Pipeline(env)
        for _ in range(2000):  # every task the pipeline sends, in order, until none is left
            batch = sender.take()
            if not batch:
                break
            for name, order, _queue in batch:
                step = name.split(".", 1)[1]
                if step == Step.REPLAY:
                    pipeline.replay(order.work_id, int(order.replay or 0))
                else:
                    getattr(pipeline, step)(order.work_id)
        with database.session() as session:
            verdicts = sorted((c.verdict or "-", c.report_kind or "-") for c in session.scalars(select(Case)))
        document = quarantine_document(database)
    finally:
        env.close()
        database.dispose()
    assert len(recorded.cases) == 2  # the check's own case, and the bundle's
    assert verdicts == [("-", "-"), ("flaky", "quarantine")]  # the check's case has no verdict
    variant = variant_of_manifest(load_manifest(store, captured.bundle_id))
    entry = document.find({"tests/test_suite.py::test_sometimes"}, variant=variant)
    assert entry is not None and entry.tests == ("tests/test_suite.py::test_sometimes",)
    project.store_dir.joinpath("quarantine.json").write_bytes(document.to_json())  # what CI fetches
    enforced = project.enforce("-q", "tests/", ALWAYS_FAIL="1")
    assert enforced.returncode == 0 and "1 passed, 1 quarantined" in enforced.stdout, enforced.stdout


def test_the_reply_never_says_a_run_with_no_test_is_skipped_by_ci(
    tmp_path: Path, make_manifest: Callable[..., Manifest]
) -> None:
    quarantined = ReportRef(kind="quarantine", location=str(tmp_path / "q.json"), created=True)
    result = TriageResult(bundle_id="2" * 64, verdict=FLAKY, report=quarantined)
    script = render_comment(result, make_manifest())  # python train.py
    assert "**Marked flaky**" in script and "nothing in CI skips it" in script
    assert "no longer fails builds" not in script
    whole_run = make_manifest(command=Command(argv=("pytest", "--junitxml=r.xml"), cwd="/w"))
    assert "**Quarantined**: it no longer fails builds" in render_comment(result, whole_run)
