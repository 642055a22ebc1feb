"""Replay environments: the key, the cache (one build per key, LRU by size), real builds with uv and
pip from a local wheel directory (no network), and replays that see the bundle's pinned versions.

Builds install from a ``--find-links`` directory of wheels made here (``PIP_NO_INDEX=1``), so
nothing reaches an index; uv is given the same through pip's configuration.
"""

from __future__ import annotations

import base64
import hashlib
import os
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest

from flaketriage.bundle.freeze import installed_packages, parse_freeze
from flaketriage.bundle.io import load_manifest, write_bundle
from flaketriage.bundle.manifest import Environment, Manifest
from flaketriage.capture.record import CaptureRequest, run_and_capture
from flaketriage.capture.source import SourceLimits
from flaketriage.errors import ConfigError, ReplayEnvironmentError
from flaketriage.store import LocalStore
from flaketriage.workers.environment.build import EnvironmentBuilder, Installer, parse_pip_config
from flaketriage.workers.environment.cache import BuiltEnvironment, EnvironmentCache, EnvironmentLease
from flaketriage.workers.environment.key import EnvironmentKey, choose_mode, worker_key
from flaketriage.workers.replay import ReplayContext, Replayer
from flaketriage.workers.sandbox import BubblewrapSandbox, ProcessSandbox, Sandbox
from flaketriage.workers.triage import triage
from flaketriage.workers.verdict import Outcome, Verdict, VerdictPolicy

LIMITS = SourceLimits(max_file_bytes=1 << 20, max_total_bytes=10 << 20)


def _env(packages: tuple[str, ...], python: str = "3.11.7") -> Environment:
    return Environment(
        python=python, implementation="CPython", platform="Linux", machine="x86_64", packages=packages
    )


# -- the key -------------------------------------------------------------------------------------
def test_the_key_ignores_order_comments_spelling_and_where_local_projects_lay() -> None:
    a = EnvironmentKey.of_environment(
        _env(("Six==1.16", "requests==2.31.0", "proj @ file:///home/ci/proj", "flaketriage==0.1.0"))
    )
    b = EnvironmentKey.of_environment(
        _env(
            (
                "# pip freeze, another day",
                "-e git+https://example.com/proj.git@abc123#egg=proj",
                "requests==2.31.0  # pinned",
                "six==1.16.0",
                "--index-url https://example.com/simple",
            ),
            python="3.11.2",
        )
    )
    assert a.digest == b.digest
    assert a.requirements == ("requests==2.31", "six==1.16") == b.requirements
    assert a.local == ("proj",) == b.local  # built into no environment: imported from the workspace
    assert a.python == "3.11"


def test_the_key_changes_with_any_pin_or_the_python_minor_version() -> None:
    base = EnvironmentKey.of_environment(_env(("six==1.16.0",)))
    assert EnvironmentKey.of_environment(_env(("six==1.17.0",))).digest != base.digest
    assert EnvironmentKey.of_environment(_env(("six==1.16.0", "idna==3.7"))).digest != base.digest
    assert EnvironmentKey.of_environment(_env(("six==1.16.0",), python="3.12.1")).digest != base.digest


def test_freeze_lines_of_every_kind_read_as_requirements() -> None:
    reqs = {
        r.name: r
        for r in parse_freeze(
            [
                "# Editable install with no version control (mylib==0.2)",
                "-e /home/ci/src/mylib",
                "other==1.0 (editable)",
                "torch==2.1.0+cu121",
                "pkg @ https://example.com/pkg-1.0-py3-none-any.whl",
                "extra[x,a]==1.0 ; python_version >= '3'",
            ]
        )
    }
    assert reqs["mylib"].local and reqs["mylib"].path == "/home/ci/src/mylib"
    assert reqs["other"].local and reqs["other"].pin == "other (local)"
    assert reqs["torch"].install == "torch==2.1.0+cu121"
    assert reqs["pkg"].pin == "pkg @ https://example.com/pkg-1.0-py3-none-any.whl"
    assert reqs["extra"].pin == 'extra[a,x]==1; python_version >= "3"'  # 1.0 is 1 (PEP 440)


def test_a_freeze_line_that_is_no_requirement_is_an_environment_error() -> None:
    with pytest.raises(ReplayEnvironmentError, match="not a requirement"):
        EnvironmentKey.of_environment(_env(("this is not == a pin !",)))


def test_capture_records_local_directory_installs_as_such() -> None:
    # This checkout is installed editable: the freeze says where from, not a version to download.
    line = next(p for p in installed_packages() if p.lower().startswith("flaketriage"))
    assert line.startswith("flaketriage @ file://") or line.startswith("flaketriage==")


def test_auto_mode_uses_the_bundle_environment_only_when_the_freeze_differs(make_manifest) -> None:  # type: ignore[no-untyped-def]
    mine = worker_key()
    import platform

    same = make_manifest(
        environment=Environment(
            python=platform.python_version(),
            implementation=platform.python_implementation(),
            platform="x",
            machine="x",
            packages=installed_packages(),
        )
    )
    assert mine.requirements and choose_mode("auto", same) == "worker"
    other = make_manifest(environment=same.environment.model_copy(update={"packages": ("six==1.0.0",)}))
    assert choose_mode("auto", other) == "bundle"
    unrecorded = make_manifest(environment=same.environment.model_copy(update={"packages": ()}))
    assert choose_mode("auto", unrecorded) == "worker"
    assert choose_mode("bundle", same) == "bundle" and choose_mode("worker", other) == "worker"
    with pytest.raises(ConfigError, match="FLAKETRIAGE_ENVIRONMENT"):
        choose_mode("sometimes", same)


def test_the_workers_freeze_is_read_once_per_state_of_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flaketriage.workers.environment import key as environments

    first = worker_key(tmp_path)
    (record,) = tmp_path.glob("worker-*.json")
    environments._worker_key.cache_clear()  # as a new process would start

    def slow_scan() -> tuple[str, ...]:
        raise AssertionError("the freeze was read again although nothing was installed")

    monkeypatch.setattr(environments, "installed_packages", slow_scan)
    # Read once: a second scan raises above (a wall-clock bound here failed once under load).
    assert worker_key(tmp_path) == first
    # An environment cache that holds the worker's freeze still lists and evicts environments only.
    cache = EnvironmentCache(tmp_path, max_bytes=1, builder=FakeBuilder())
    cache.acquire(_key(1)).release()
    cache.acquire(_key(2)).release()  # evicts key 1, and only key 1
    assert record.exists() and [e.digest for e in cache.entries()] == [_key(2).digest]


def test_pip_configuration_reads_files_then_environment_variables() -> None:
    config = parse_pip_config(
        "global.extra-index-url='file:///a/simple file:///b/simple'\n"
        "global.find-links='/opt/wheels'\n"
        ":env:.find-links='/tmp/wheels'\n"
        ":env:.no-index='1'\n"
    )
    assert config["extra-index-url"] == ["file:///a/simple", "file:///b/simple"]
    assert config["find-links"] == ["/tmp/wheels"]
    assert config["no-index"] == ["1"]


# -- the cache: locks and LRU, with a builder that only writes files -----------------------------
class FakeBuilder(EnvironmentBuilder):
    def __init__(self, size: int = 1000, delay_s: float = 0.0) -> None:
        super().__init__({})
        self.size = size
        self.delay_s = delay_s
        self.builds: list[str] = []
        self.lock = threading.Lock()

    def build(self, key: EnvironmentKey, dest: Path) -> str:
        with self.lock:
            self.builds.append(key.digest)
        time.sleep(self.delay_s)
        (dest / "bin").mkdir(parents=True)
        (dest / "payload").write_bytes(b"x" * self.size)
        return "3.11.7"


def _key(n: int) -> EnvironmentKey:
    return EnvironmentKey.of_environment(_env((f"pkg{n}==1.0",)))


class MeetingCache(EnvironmentCache):
    """Holds each caller's first look at the cache until every caller has looked: all of them then
    hold the shared lock and have found nothing, the interleaving in which two builders meet."""

    def __init__(self, root: Path, builder: EnvironmentBuilder, meeting: threading.Barrier) -> None:
        super().__init__(root, max_bytes=1 << 20, builder=builder)
        self.meeting: threading.Barrier | None = meeting

    def _complete(self, key: EnvironmentKey) -> BuiltEnvironment | None:
        found = super()._complete(key)
        if self.meeting is not None:
            meeting, self.meeting = self.meeting, None
            meeting.wait(timeout=10)
        return found


def test_two_concurrent_builders_of_one_key_build_it_once(tmp_path: Path) -> None:
    # Both find the key missing while both hold the shared lock. The one that does not build must
    # get the environment when the build ends, not when the builder's lease is released (the leases
    # here are held until both acquisitions returned).
    builder = FakeBuilder(delay_s=0.2)
    meeting = threading.Barrier(2)
    leases: list[EnvironmentLease] = []

    def acquire() -> None:
        # Each with its own cache object and lock file descriptor, as two worker processes have.
        leases.append(MeetingCache(tmp_path / "cache", builder, meeting).acquire(_key(1)))

    threads = [threading.Thread(target=acquire) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads), "an acquisition waited for the other's lease"
    assert builder.builds == [_key(1).digest]
    assert sorted(lease.built for lease in leases) == [False, True]  # one built, the other waited
    assert leases[0].environment.root == leases[1].environment.root
    for lease in leases:
        lease.release()


def test_least_recently_used_environments_go_first_when_the_cache_is_over_its_size(tmp_path: Path) -> None:
    cache = EnvironmentCache(tmp_path / "cache", max_bytes=2500, builder=FakeBuilder(size=1000))
    for n in (1, 2):
        cache.acquire(_key(n)).release()
    time.sleep(0.02)
    cache.acquire(_key(1)).release()  # used again: key 2 is now the least recently used
    time.sleep(0.02)
    cache.acquire(_key(3)).release()
    left = {e.digest for e in cache.entries()}
    assert left == {_key(1).digest, _key(3).digest}
    assert not (tmp_path / "cache" / _key(2).digest).exists()


def test_an_environment_in_use_is_never_evicted(tmp_path: Path) -> None:
    cache = EnvironmentCache(tmp_path / "cache", max_bytes=1500, builder=FakeBuilder(size=1000))
    with cache.acquire(_key(1)):
        cache.acquire(_key(2)).release()  # over the bound, but both were in use when it was checked
        time.sleep(0.02)
        cache.acquire(_key(3)).release()  # key 1 is the least recently used, but still in use
        assert {e.digest for e in cache.entries()} == {_key(1).digest, _key(3).digest}
        assert (tmp_path / "cache" / _key(1).digest / "payload").exists()


def test_a_build_that_died_is_cleared_and_built_again(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    (root / _key(1).digest / "half").mkdir(parents=True)  # no record: it never finished
    builder = FakeBuilder()
    lease = EnvironmentCache(root, max_bytes=1 << 20, builder=builder).acquire(_key(1))
    assert lease.built and builder.builds == [_key(1).digest]
    assert not (root / _key(1).digest / "half").exists()
    lease.release()


def test_a_cache_hit_costs_no_build(tmp_path: Path) -> None:
    builder = FakeBuilder()
    cache = EnvironmentCache(tmp_path / "cache", max_bytes=1 << 20, builder=builder)
    cache.acquire(_key(1)).release()
    started = time.perf_counter()
    lease = cache.acquire(_key(1))
    assert time.perf_counter() - started < 0.05
    assert not lease.built and len(builder.builds) == 1
    lease.release()


# -- real builds from a local wheel directory ----------------------------------------------------
def _wheel(directory: Path, name: str, version: str, body: str) -> Path:
    """A minimal pure-Python wheel of one module ``name`` (``__version__`` = `version`)."""
    dist = f"{name}-{version}"
    files = {
        f"{name}.py": f"__version__ = {version!r}\n{body}",
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    path = directory / f"{dist}-py3-none-any.whl"
    record = []
    with zipfile.ZipFile(path, "w") as z:
        for member, text in files.items():
            data = text.encode()
            z.writestr(member, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{member},sha256={digest},{len(data)}")
        z.writestr(f"{dist}.dist-info/RECORD", "\n".join([*record, f"{dist}.dist-info/RECORD,,"]) + "\n")
    return path


@pytest.fixture
def wheels(tmp_path: Path) -> Path:
    directory = tmp_path / "wheels"
    directory.mkdir()
    # The worker has six 1.17 (or none); the bundle ran with 1.16.0, which only this directory has.
    _wheel(directory, "six", "1.16.0", "")
    return directory


def _builder_env(wheels: Path) -> dict[str, str]:
    return {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)}


def _bundle(tmp_path: Path, job: str, packages: tuple[str, ...], **env: str) -> tuple[LocalStore, Manifest]:
    root = tmp_path / "proj"
    root.mkdir(exist_ok=True)
    (root / "job.py").write_text(job)
    store = LocalStore(tmp_path / "store")
    done = run_and_capture(
        store, CaptureRequest(argv=[sys.executable, "job.py"], cwd=root, limits=LIMITS, echo=False)
    )
    assert done.bundle_id, done.process.stderr
    manifest = load_manifest(store, done.bundle_id)
    recorded = manifest.environment.model_copy(update={"packages": packages, **env})
    manifest = manifest.model_copy(update={"environment": recorded})
    return store, load_manifest(store, write_bundle(store, manifest))


def _context(tmp_path: Path, wheels: Path, installer: Installer = "auto", **kw: object) -> ReplayContext:
    builder = EnvironmentBuilder(_builder_env(wheels), installer=installer, timeout_s=300)
    cache = EnvironmentCache(tmp_path / "environments", max_bytes=1 << 30, builder=builder)
    return ReplayContext.from_process(environment_mode="bundle", environment_cache=cache)


SHOW_SIX = (
    "import sys, six\n"
    "print('six', six.__version__, 'python', sys.executable)\n"
    "raise SystemExit('fatal: the job failed')\n"
)


@pytest.mark.parametrize("installer", ["uv", "pip"])
@pytest.mark.parametrize("sandbox", [ProcessSandbox(), BubblewrapSandbox()], ids=["process", "bwrap"])
def test_a_replay_imports_the_version_the_bundle_pinned(
    tmp_path: Path, wheels: Path, installer: Installer, sandbox: Sandbox
) -> None:
    store, manifest = _bundle(tmp_path, SHOW_SIX, ("six==1.16.0", "flaketriage==0.1.0"))
    context = _context(tmp_path, wheels, installer)
    with Replayer(store, manifest, sandbox, context=context) as replayer:
        result = replayer.run()
        summary = replayer.environment_summary()
    assert result.outcome is Outcome.REPRODUCED, result.process.stderr
    six, version, _, python = result.process.stdout.split()
    assert (six, version) == ("six", "1.16.0")
    assert python.startswith(str(tmp_path / "environments"))  # the bundle's interpreter, not ours
    assert summary["mode"] == "bundle" and summary["built"] is True and summary["packages"] == 1


def test_the_second_replayer_of_a_bundle_starts_in_well_under_a_second(tmp_path: Path, wheels: Path) -> None:
    store, manifest = _bundle(tmp_path, SHOW_SIX, ("six==1.16.0",))
    context = _context(tmp_path, wheels)
    with Replayer(store, manifest, ProcessSandbox(), context=context) as first:
        assert first.environment_summary()["built"] is True
    started = time.perf_counter()
    with Replayer(store, manifest, ProcessSandbox(), context=context) as second:
        ready = time.perf_counter() - started
        result = second.run()
        assert second.environment_summary()["built"] is False
    assert ready < 1.0, f"a warm Replayer took {ready:.2f} s to start"
    assert "six 1.16.0" in result.process.stdout


def test_a_local_project_is_imported_from_the_replays_workspace(tmp_path: Path, wheels: Path) -> None:
    root = tmp_path / "proj"
    (root / "src" / "mylib").mkdir(parents=True)
    (root / "pyproject.toml").write_text('[project]\nname = "my-lib"\nversion = "0.3"\n')
    (root / "src" / "mylib" / "__init__.py").write_text("WHERE = __file__\n")
    job = (
        "import importlib.metadata, mylib, six\n"
        "print(mylib.WHERE, importlib.metadata.version('my-lib'), six.__version__)\n"
        "raise SystemExit('fatal: the job failed')\n"
    )
    store, manifest = _bundle(tmp_path, job, ("my_lib @ file:///ci/checkout", "six==1.16.0"))
    with Replayer(store, manifest, ProcessSandbox(), context=_context(tmp_path, wheels)) as replayer:
        result = replayer.run()
    # (The capture, in this worker's interpreter, could not import mylib: a different failure.)
    assert result.outcome is Outcome.DIFFERENT, result.process.stderr
    where, version, six = result.process.stdout.split()
    assert "flaketriage-replay-" in where and where.endswith("src/mylib/__init__.py")  # the copy
    assert (version, six) == ("0.3", "1.16.0")


def _triage(store: LocalStore, manifest: Manifest, context: ReplayContext):  # type: ignore[no-untyped-def]
    return triage(
        store,
        manifest.bundle_id,
        sandbox=ProcessSandbox(),
        policy=VerdictPolicy(),
        sink=None,
        quarantine=None,
        context=context,
    )


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_a_package_that_cannot_be_installed_is_an_environment_verdict(
    tmp_path: Path, wheels: Path, installer: Installer
) -> None:
    store, manifest = _bundle(tmp_path, SHOW_SIX, ("six==1.16.0", "flaketriage-no-such-package==9.9.9"))
    started = time.perf_counter()
    result = _triage(store, manifest, _context(tmp_path, wheels, installer))
    assert time.perf_counter() - started < 60
    assert result.verdict.verdict is Verdict.ENVIRONMENT and result.verdict.decided
    assert (result.verdict.replays, result.verdict.environment) == (1, 1)  # more would not help
    (finding,) = result.findings
    assert finding.kind == "environment"
    assert "could not install the bundle's 2 pinned packages" in finding.summary
    assert "flaketriage-no-such-package" in finding.summary
    assert result.environment is not None and result.environment["mode"] == "bundle"
    assert not list((tmp_path / "environments").glob("*.json"))  # nothing half-built is kept


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_a_source_distribution_never_runs_its_build_on_the_worker(
    tmp_path: Path, wheels: Path, installer: Installer
) -> None:
    import io
    import tarfile

    # An in-tree build backend that needs nothing installed: a build would import it at once.
    marker = tmp_path / "backend-ran"
    files = {
        "evil-1.0/pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\n'
        'backend-path = ["."]\n',
        "evil-1.0/backend.py": f"open({str(marker)!r}, 'w').write('ran')\n",
        "evil-1.0/PKG-INFO": "Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n",
    }
    with tarfile.open(wheels / "evil-1.0.tar.gz", "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    store, manifest = _bundle(tmp_path, SHOW_SIX, ("evil==1.0", "six==1.16.0"))
    with Replayer(
        store, manifest, ProcessSandbox(), context=_context(tmp_path, wheels, installer)
    ) as replayer:
        result = replayer.run()
    assert result.outcome is Outcome.ENVIRONMENT
    assert result.reason is not None and "only wheels are installed" in result.reason
    assert not marker.exists()


def test_a_package_named_by_url_is_never_fetched(tmp_path: Path, wheels: Path) -> None:
    pin = "six @ https://flaketriage.invalid/six-1.16.0-py2.py3-none-any.whl"
    store, manifest = _bundle(tmp_path, SHOW_SIX, (pin,))
    with Replayer(store, manifest, ProcessSandbox(), context=_context(tmp_path, wheels)) as replayer:
        result = replayer.run()
    assert result.outcome is Outcome.ENVIRONMENT
    assert result.reason is not None and "by URL" in result.reason and "flaketriage.invalid" in result.reason


def test_a_python_version_the_runner_lacks_is_an_environment_verdict(tmp_path: Path, wheels: Path) -> None:
    store, manifest = _bundle(tmp_path, SHOW_SIX, ("six==1.16.0",), python="3.4.10")
    result = _triage(store, manifest, _context(tmp_path, wheels))
    assert result.verdict.verdict is Verdict.ENVIRONMENT
    (finding,) = result.findings
    assert "this runner has no CPython 3.4" in finding.summary
    assert "python3.4" in finding.summary and "FLAKETRIAGE_ENVIRONMENT=worker" in finding.summary


def test_a_missing_local_project_is_an_environment_outcome(tmp_path: Path, wheels: Path) -> None:
    store, manifest = _bundle(tmp_path, SHOW_SIX, ("elsewhere @ file:///ci/elsewhere", "six==1.16.0"))
    with Replayer(store, manifest, ProcessSandbox(), context=_context(tmp_path, wheels)) as replayer:
        result = replayer.run()
    assert result.outcome is Outcome.ENVIRONMENT
    assert result.reason is not None and "no project called elsewhere" in result.reason


def test_worker_mode_replays_in_the_workers_own_interpreter(tmp_path: Path, wheels: Path) -> None:
    store, manifest = _bundle(tmp_path, SHOW_SIX, ("six==1.16.0",))
    context = ReplayContext.from_process()  # worker mode, as before environments existed
    with Replayer(store, manifest, ProcessSandbox(), context=context) as replayer:
        result = replayer.run()
    assert f"python {sys.executable}" in result.process.stdout
    assert not (tmp_path / "environments").exists()
