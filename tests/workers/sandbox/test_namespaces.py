"""The process sandbox's namespaces when flaketriage and its interpreter live under /tmp (a checkout
or virtualenv there, as CI clones often are): the private /tmp must hide neither the probe's own
interpreter (the sandbox would wrongly decide it cannot isolate anything) nor what the replay's
reaper runs (this interpreter and flaketriage's reaper script)."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path

from flaketriage.workers.sandbox.namespaces import Namespaces, interpreter_environment

ROOT = Path(__file__).resolve().parents[3]
PROBE = (
    "import sys; from flaketriage.workers.sandbox.namespaces import Namespaces; "
    "print(sys.executable, Namespaces(network=True, files=True).usable())"
)


def test_an_interpreter_under_tmp_probes_as_this_one_does(tmp_path: Path) -> None:
    assert Path("/tmp") in tmp_path.parents
    environment = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(environment)
    # This checkout and this environment's packages, from the other interpreter.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *site.getsitepackages()])}
    done = subprocess.run(
        [str(environment / "bin" / "python"), "-c", PROBE],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    executable, usable = done.stdout.split()
    assert Path(executable).parent.parent == environment
    assert usable == str(Namespaces(network=True, files=True).usable())
    assert sys.executable != executable


RUN = """
import json, sys
from pathlib import Path
import flaketriage
from flaketriage.workers.sandbox import ProcessSandbox, SandboxSpec
from flaketriage.workers.sandbox.namespaces import Namespaces
workspace = Path(sys.argv[1])
code = "import os; open('out.txt', 'w').write('written'); print(os.path.exists(%r))" % sys.argv[2]
spec = SandboxSpec(argv=[sys.executable, "-c", code], workspace=workspace, cwd=workspace,
                   env={"PATH": "/usr/bin:/bin"}, timeout_s=60.0)
result = ProcessSandbox().run(spec)
print(json.dumps({"package": flaketriage.__file__, "exit": result.exit_code, "out": result.stdout,
                  "err": result.stderr, "isolated": Namespaces(network=True, files=True).usable()}))
"""


def test_a_replay_runs_when_flaketriage_and_its_interpreter_live_under_tmp(tmp_path: Path) -> None:
    environment = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(environment)
    checkout = tmp_path / "checkout"
    shutil.copytree(
        ROOT / "flaketriage", checkout / "flaketriage", ignore=shutil.ignore_patterns("__pycache__")
    )
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    elsewhere = tmp_path / "only-outside.txt"
    elsewhere.write_text("under the real /tmp")
    # -S: site-packages come from PYTHONPATH only, without the .pth files of this checkout's
    # editable install, which would import flaketriage from here instead of from the copy.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(checkout), *site.getsitepackages()])}
    done = subprocess.run(
        [str(environment / "bin" / "python"), "-S", "-c", RUN, str(workspace), str(elsewhere)],
        capture_output=True, text=True, env=env, timeout=120, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert Path(report["package"]).is_relative_to(checkout)
    assert (report["exit"], report["err"]) == (0, ""), report
    assert (workspace / "out.txt").read_text() == "written"
    # Isolated (this machine can make the namespaces): the private /tmp hides what lies under the real one.
    hidden = str(Namespaces(network=True, files=True).usable())
    assert (report["isolated"], report["out"].strip()) == (hidden == "True", str(hidden != "True"))


def test_the_workspace_stays_writable_when_a_readable_path_is_it_or_above_it(tmp_path: Path) -> None:
    # A local project's import root on the replay's PYTHONPATH is the workspace itself (fooof 1.0.0's
    # tests rmtree and mkdir their output folder in the checkout): bound read-only over the workspace's
    # writable bind, every write there failed with EROFS, read as a sandbox limit.
    assert Namespaces(network=True, files=True).usable(), "this machine makes mount namespaces (tests/run.sh)"
    workspace = tmp_path / "run-1"
    (workspace / "pkg").mkdir(parents=True)
    code = "import os; os.mkdir('pkg/out'); open('pkg/out/f', 'w').write('ok')"
    for readable in ([workspace], [workspace / "pkg"], [tmp_path]):
        shutil.rmtree(workspace / "pkg" / "out", ignore_errors=True)
        done = subprocess.run(
            [sys.executable, "-S", "-c", code],
            cwd=workspace, capture_output=True, text=True, timeout=60, check=False,
            # This interpreter too, as every run is given it: a checkout (and its venv) under /tmp is
            # hidden by the private /tmp otherwise.
            preexec_fn=Namespaces(network=True, files=True).preexec(
                workspace, workspace, [*readable, interpreter_environment()]
            ),
        )  # fmt: skip
        assert done.returncode == 0, (readable, done.stderr)
        assert (workspace / "pkg" / "out" / "f").read_text() == "ok"


def test_a_temp_directory_the_run_recorded_is_the_private_tmp(tmp_path: Path) -> None:
    # A pytester session's TMPDIR lies under the real /tmp, a CI runner's under its work folder: behind
    # the private /tmp one is gone and the other read-only, so `tempfile` (and pytest's tmp_path) failed.
    from flaketriage.workers.sandbox import ProcessSandbox, SandboxSpec

    assert Namespaces(network=True, files=True).usable(), "this machine makes mount namespaces (tests/run.sh)"
    workspace = tmp_path / "run-1"
    workspace.mkdir()
    recorded = tmp_path / "runner-temp"
    recorded.mkdir()
    code = "import tempfile; print(tempfile.mkdtemp())"
    spec = SandboxSpec(
        argv=[sys.executable, "-S", "-c", code], workspace=workspace, cwd=workspace,
        env={"PATH": "/usr/bin:/bin", "TMPDIR": str(recorded)}, timeout_s=60.0,
    )  # fmt: skip
    result = ProcessSandbox().run(spec)
    assert (result.exit_code, result.stderr) == (0, "")
    assert Path(result.stdout.strip()).parent == Path("/tmp")
    assert list(recorded.iterdir()) == []  # nothing was written where the run recorded it
