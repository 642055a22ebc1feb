"""`bundle list / show / verify / export` on real captures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def _capture(cli, tmp_path: Path, code: str) -> str:  # type: ignore[no-untyped-def]
    proc = cli("capture", "--json", "--", sys.executable, "-c", code)
    bundle: str = json.loads(proc.stdout.strip().splitlines()[-1])["bundle"]
    return bundle


def test_list_newest_first_with_command_and_fingerprint(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    first = _capture(cli, tmp_path, "raise ValueError('first')")
    second = _capture(cli, tmp_path, "raise KeyError('second')")
    listed = json.loads(cli("bundle", "list", "--json").stdout)
    assert [b["id"] for b in listed] == [second, first]
    assert listed[0]["failure"].startswith("KeyError") and listed[1]["failure"].startswith("ValueError")
    assert listed[0]["command"].startswith(sys.executable)
    assert len(listed[0]["fingerprint"]) == 64
    table = cli("bundle", "list").stdout
    assert second[:12] in table and first[:12] in table
    assert table.index(second[:12]) < table.index(first[:12])


def test_show_is_readable(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bundle = _capture(cli, tmp_path, "def f():\n    1/0\nf()")
    shown = cli("bundle", "show", bundle[:10])
    assert shown.returncode == 0
    for text in (
        "ZeroDivisionError: division by zero",
        "fingerprint",
        "PYTHONHASHSEED=",
        "traceback",
        bundle,
    ):
        assert text in shown.stdout, text
    manifest = json.loads(cli("bundle", "show", bundle, "--json").stdout)
    assert manifest["failure"]["exception_type"] == "ZeroDivisionError"


def test_verify_ok(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bundle = _capture(cli, tmp_path, "raise SystemExit(3)")
    proc = cli("bundle", "verify", bundle)
    assert proc.returncode == 0 and proc.stdout.startswith(f"ok: bundle {bundle[:12]}")


def test_export_runs_without_flaketriage(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "prog.py").write_text(
        "import os\nprint('seed', os.environ['PYTHONHASHSEED'])\nraise SystemExit(4)\n"
    )
    proc = cli("capture", "--json", "--", sys.executable, "prog.py")
    bundle = json.loads(proc.stdout.strip().splitlines()[-1])["bundle"]
    seed = proc.stdout.split("seed ")[1].split()[0]
    dest = tmp_path / "repro"
    assert cli("bundle", "export", bundle, str(dest)).returncode == 0
    for name in (
        "run.sh",
        "requirements.txt",
        "Dockerfile",
        "README.md",
        "logs/stdout.txt",
        "workspace/prog.py",
    ):
        assert (dest / name).exists(), name
    run = subprocess.run(
        ["bash", str(dest / "run.sh")], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}
    )
    assert run.returncode == 4
    assert run.stdout.strip() == f"seed {seed}"
    assert "pydantic==" in (dest / "requirements.txt").read_text()


def test_the_commands_default_thread_count_is_the_transfers() -> None:
    from flaketriage.bundle.transfer import DEFAULT_THREADS
    from flaketriage.cli import bundles

    assert bundles.DEFAULT_THREADS == DEFAULT_THREADS


def test_starting_the_command_line_loads_only_what_every_command_needs() -> None:
    import subprocess
    import sys

    heavy = (
        "flaketriage.bundle.io", "flaketriage.bundle.transfer", "flaketriage.ci", "flaketriage.quarantine",
        "flaketriage.results", "flaketriage.store.gc", "flaketriage.events",
    )  # fmt: skip
    probe = f"import sys, flaketriage.cli; print(sorted(m for m in sys.modules if m.startswith({heavy!r})))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout
