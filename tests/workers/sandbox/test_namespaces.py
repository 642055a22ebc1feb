"""The process sandbox's namespaces, probed from an interpreter that lives under /tmp (a checkout
or virtualenv there, as CI clones often are): the private /tmp must not hide the probe's own
interpreter, or the sandbox would wrongly decide it cannot isolate anything."""

from __future__ import annotations

import os
import site
import subprocess
import sys
import venv
from pathlib import Path

from flaketriage.workers.sandbox.namespaces import Namespaces

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
