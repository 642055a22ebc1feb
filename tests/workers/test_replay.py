"""Replays of real captured programs: environment, determinism hooks, isolation between runs."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from flaketriage.bundle.io import load_manifest
from flaketriage.bundle.manifest import Manifest
from flaketriage.capture.record import CaptureRequest, run_and_capture
from flaketriage.capture.source import SourceLimits
from flaketriage.process.git import Git
from flaketriage.store import LocalStore
from flaketriage.workers.replay import SITECUSTOMIZE_DIR, ReplayContext, Replayer
from flaketriage.workers.sandbox import BubblewrapSandbox, ProcessSandbox, Sandbox
from flaketriage.workers.verdict import Outcome

LIMITS = SourceLimits(max_file_bytes=1 << 20, max_total_bytes=10 << 20)

FAKE_TORCH = """
calls = []
def use_deterministic_algorithms(mode, warn_only=False):
    calls.append(("use_deterministic_algorithms", mode, warn_only))
class _Cudnn:
    deterministic = False
    benchmark = True
class backends:
    cudnn = _Cudnn()
"""


def _capture(root: Path, argv: list[str], env: dict[str, str] | None = None) -> tuple[LocalStore, Manifest]:
    store = LocalStore(root.parent / "store")
    request = CaptureRequest(argv=argv, cwd=root, limits=LIMITS, echo=False, env=env)
    result = run_and_capture(store, request)
    assert result.bundle_id, result.process.stderr
    return store, load_manifest(store, result.bundle_id)


@pytest.fixture(params=["process", "bwrap"])
def sandbox(request: pytest.FixtureRequest) -> Sandbox:
    return ProcessSandbox() if request.param == "process" else BubblewrapSandbox()


def test_replay_gets_recorded_seeds_and_deterministic_settings(tmp_path: Path, sandbox: Sandbox) -> None:
    root = tmp_path / "proj"
    (root / "torch").mkdir(parents=True)
    (root / "torch" / "__init__.py").write_text(FAKE_TORCH)
    (root / "job.py").write_text(
        "import os, sys\n"
        "import torch\n"
        "print('seed', os.environ['PYTHONHASHSEED'], 'cublas', os.environ.get('CUBLAS_WORKSPACE_CONFIG'))\n"
        "print('torch', torch.calls, torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)\n"
        "sys.stderr.write('fatal: job failed\\n')\n"
        "sys.exit(9)\n"
    )
    store, manifest = _capture(root, [sys.executable, "job.py"])
    with Replayer(store, manifest, sandbox, context=ReplayContext.from_process()) as replayer:
        result = replayer.run()
    assert result.failure is not None
    assert result.outcome is Outcome.REPRODUCED, (manifest.failure.signature, result.failure.signature)
    lines = result.process.stdout.splitlines()
    assert lines[0] == f"seed {manifest.seeds.python_hash_seed} cublas :4096:8"
    assert lines[1] == "torch [('use_deterministic_algorithms', True, True)] True False"


REAL_TORCH_JOB = """
import sys
import torch
print(torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
print("torch._dynamo" in sys.modules)
from torch._inductor import config
print(config.deterministic)
"""


def test_a_real_torch_is_made_deterministic_without_loading_dynamo_until_the_program_does() -> None:
    """torch.use_deterministic_algorithms imports Inductor's config, and with it TorchDynamo
    (seconds): the replay sets the eager switch at once and Inductor's when the program loads it."""
    pytest.importorskip("torch")

    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(SITECUSTOMIZE_DIR)}
    done = subprocess.run(
        [sys.executable, "-c", REAL_TORCH_JOB], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["True True", "False", "True"]


def test_each_replay_starts_from_a_clean_copy(tmp_path: Path, sandbox: Sandbox) -> None:
    root = tmp_path / "proj"
    root.mkdir()
    (root / "job.py").write_text(
        "with open('state.txt', 'a') as f: f.write('x')\n"
        "n = len(open('state.txt').read())\n"
        "raise RuntimeError('boom') if n == 1 else SystemExit(f'state leaked: {n}')\n"
    )
    store, manifest = _capture(root, [sys.executable, "job.py"])
    (root / "state.txt").unlink()
    with Replayer(store, manifest, sandbox, context=ReplayContext.from_process()) as replayer:
        outcomes = [replayer.run().outcome for _ in range(3)]
    assert outcomes == [Outcome.REPRODUCED] * 3


def test_paths_into_the_original_workspace_are_moved(tmp_path: Path, sandbox: Sandbox) -> None:
    root = tmp_path / "proj"
    root.mkdir()
    (root / "job.py").write_text(
        "import os, sys\n"
        "here = os.path.dirname(os.path.abspath(sys.argv[0]))\n"
        "print(here == os.getcwd(), os.environ['DATA_DIR'] == os.getcwd())\n"
        "print(os.path.exists(" + repr(str(root / "only-original.txt")) + "))\n"
        "raise SystemExit(2)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "DATA_DIR": str(root)}
    store, manifest = _capture(root, [sys.executable, str(root / "job.py")], env=env)
    (root / "only-original.txt").write_text("not part of the bundle")
    with Replayer(store, manifest, sandbox, context=ReplayContext.from_process()) as replayer:
        result = replayer.run()
    lines = result.process.stdout.splitlines()
    assert lines[0] == "True True", result.process.stderr
    # bubblewrap hides the original workspace; the process sandbox (root here) gives the run a
    # private /tmp, which hides this one, under pytest's temporary directory, too
    assert lines[1] == "False"


def test_masked_secrets_are_refilled_from_this_machine(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    root.mkdir()
    (root / "job.py").write_text("import os; print(os.environ.get('API_TOKEN')); raise SystemExit(1)\n")
    store, manifest = _capture(
        root, [sys.executable, "job.py"], env={"PATH": "/usr/bin", "API_TOKEN": "tok-123456"}
    )
    assert manifest.command.env["API_TOKEN"] != "tok-123456"
    base = ReplayContext(base_env={"API_TOKEN": "runner-token-abc"}, temp_root=tmp_path / "tmp", git=Git())
    with Replayer(store, manifest, ProcessSandbox(), context=base) as replayer:
        assert replayer.run().process.stdout.strip() == "runner-token-abc"
    empty = ReplayContext(base_env={}, temp_root=tmp_path / "tmp", git=Git())
    with Replayer(store, manifest, ProcessSandbox(), context=empty) as replayer:
        assert replayer.run().process.stdout.strip() == "None"


@pytest.mark.parametrize("where", ["inside-project", "elsewhere-in-tmp"])
def test_interpreters_in_hidden_places_stay_usable(tmp_path: Path, where: str) -> None:
    import subprocess

    root = tmp_path / "proj"
    root.mkdir()
    env_dir = root / ".venv" if where == "inside-project" else tmp_path / "elsewhere" / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    python = str(env_dir / "bin" / "python")
    (root / "job.py").write_text("import sys; print(sys.prefix); raise SystemExit(3)\n")
    (root / ".gitignore").write_text(".venv/\n")
    store, manifest = _capture(root, [python, "job.py"], env={"PATH": f"{env_dir / 'bin'}:/usr/bin:/bin"})
    with Replayer(store, manifest, BubblewrapSandbox(), context=ReplayContext.from_process()) as replayer:
        result = replayer.run()
    assert result.outcome is Outcome.REPRODUCED, result.process.stderr
    assert result.process.stdout.strip() == str(env_dir)


def test_absolute_paths_into_the_original_workspace_see_the_copy(tmp_path: Path) -> None:
    """bubblewrap shows the copy at the original path: hard-coded paths and editable installs work."""
    root = tmp_path / "proj"
    root.mkdir()
    (root / "config.txt").write_text("captured")
    (root / "job.py").write_text(f"print(open({str(root / 'config.txt')!r}).read()); raise SystemExit(6)\n")
    store, manifest = _capture(root, [sys.executable, "job.py"])
    (root / "config.txt").write_text("changed after the capture")
    with Replayer(store, manifest, BubblewrapSandbox(), context=ReplayContext.from_process()) as replayer:
        result = replayer.run()
    assert result.outcome is Outcome.REPRODUCED, result.process.stderr
    assert result.process.stdout.strip() == "captured"
    assert (root / "config.txt").read_text() == "changed after the capture"


def test_the_replay_timeout_setting_applies_when_the_capture_recorded_none(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    root.mkdir()
    (root / "job.py").write_text("import sys; sys.exit(3)\n")
    store, manifest = _capture(root, [sys.executable, "job.py"])
    assert manifest.command.timeout_s is not None  # a capture records its own limit
    unlimited = manifest.model_copy(
        update={"command": manifest.command.model_copy(update={"timeout_s": None})}
    )
    context = ReplayContext.from_process()
    with Replayer(store, unlimited, ProcessSandbox(), context=context, default_timeout_s=7.0) as replayer:
        assert replayer.timeout_s == 7.0
    with Replayer(store, manifest, ProcessSandbox(), context=context, default_timeout_s=7.0) as replayer:
        assert replayer.timeout_s == manifest.command.timeout_s
    with Replayer(store, unlimited, ProcessSandbox(), context=context, timeout_s=2.0) as replayer:
        assert replayer.timeout_s == 2.0


def test_a_bundle_captured_before_a_bare_asserts_type_was_read_still_reproduces(tmp_path: Path) -> None:
    # Earlier releases read pytest's "FAILED t - assert 1 == 2" as untyped: their bundles carry
    # that signature, and a replay read the new way (AssertionError) must still match it.
    root = tmp_path / "proj"
    root.mkdir()
    (root / "test_total.py").write_text("def test_total():\n    assert 16.99 == 17.0\n")
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:randomly",
        "-p",
        "no:cacheprovider",
        "test_total.py",
    ]
    store, manifest = _capture(root, argv)
    failure = manifest.failure
    assert failure.exception_type == "AssertionError" and "|AssertionError|" in failure.signature
    earlier = failure.signature.replace("|AssertionError|", "||")
    old = manifest.model_copy(
        update={
            "failure": failure.model_copy(
                update={
                    "exception_type": None,
                    "signature": earlier,
                    "fingerprint": hashlib.sha256(earlier.encode()).hexdigest(),
                }
            )
        }
    )
    with Replayer(store, old, ProcessSandbox(), context=ReplayContext.from_process()) as replayer:
        result = replayer.run()
    assert result.outcome is Outcome.REPRODUCED, result.failure
    assert result.failure is not None and result.failure.fingerprint == old.failure.fingerprint
