"""Capture through the real CLI: exit codes, failure criteria, seeds, redaction."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from flaketriage.bundle.io import load_manifest
from flaketriage.bundle.redaction import MASK
from flaketriage.store import LocalStore


def _run(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("FLAKETRIAGE_") and k != "PYTHONHASHSEED"}
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "flaketriage", "capture", "--json", *args],
        cwd=tmp_path,
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _result(proc: subprocess.CompletedProcess[str]) -> dict[str, object]:
    data: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return data


def _manifest(tmp_path: Path, bundle: object):  # type: ignore[no-untyped-def]
    return load_manifest(LocalStore(tmp_path / ".flaketriage"), str(bundle))


def test_passing_command_leaves_no_bundle(tmp_path: Path) -> None:
    proc = _run(tmp_path, "--", sys.executable, "-c", "print('all good')")
    assert proc.returncode == 0
    assert proc.stdout.startswith("all good")
    assert _result(proc) == {"bundle": None, "exit_code": 0, "fingerprint": None, "error": None}


def test_exit_code_passes_through_and_output_streams(tmp_path: Path) -> None:
    proc = _run(
        tmp_path,
        "--",
        sys.executable,
        "-c",
        "import sys; print('out'); sys.stderr.write('err\\n'); sys.exit(7)",
    )
    assert proc.returncode == 7
    assert proc.stdout.startswith("out\n") and "err" in proc.stderr
    result = _result(proc)
    assert result["exit_code"] == 7 and result["bundle"]
    m = _manifest(tmp_path, result["bundle"])
    assert m.failure.kind == "exit" and m.failure.exit_code == 7
    assert m.failure.fingerprint == result["fingerprint"]


def test_python_exception_is_recorded(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text("def step(x):\n    return {}[x]\n\nstep('missing')\n")
    result = _result(_run(tmp_path, "--", sys.executable, "job.py"))
    m = _manifest(tmp_path, result["bundle"])
    assert m.failure.kind == "exception"
    assert m.failure.exception_type == "KeyError"
    assert m.failure.traceback and "job.py" in m.failure.traceback
    assert "job.py:step" in m.failure.signature
    assert m.environment.python and any(p.startswith("pydantic==") for p in m.environment.packages)
    assert m.hardware.cpu_count and m.hardware.memory_total_mb
    assert m.command.argv == (sys.executable, "job.py")


def test_signal_death(tmp_path: Path) -> None:
    proc = _run(
        tmp_path, "--", sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    )
    assert proc.returncode == 137
    m = _manifest(tmp_path, _result(proc)["bundle"])
    assert m.failure.kind == "signal" and m.failure.signal == "SIGKILL"


def test_fail_pattern_on_a_zero_exit(tmp_path: Path) -> None:
    code = "print('epoch 3: WARNING gradient overflow detected'); print('done')"
    proc = _run(tmp_path, "--fail-pattern", "gradient overflow", "--", sys.executable, "-c", code)
    assert proc.returncode == 1
    m = _manifest(tmp_path, _result(proc)["bundle"])
    assert m.failure.kind == "pattern"
    assert m.criteria.fail_patterns == ("gradient overflow",)


def test_metric_divergence_without_a_crash(tmp_path: Path) -> None:
    code = "for s, l in enumerate([2.0, 1.5, 80.0, 1e9]): print(f'step={s} loss={l}')"
    proc = _run(tmp_path, "--metric", "loss", "--above", "100", "--", sys.executable, "-c", code)
    assert proc.returncode == 1
    m = _manifest(tmp_path, _result(proc)["bundle"])
    assert m.failure.kind == "metric"
    ok = _run(tmp_path, "--metric", "loss", "--above", "1e10", "--", sys.executable, "-c", code)
    assert ok.returncode == 0 and _result(ok)["bundle"] is None


def test_metric_from_a_json_lines_file(tmp_path: Path) -> None:
    code = (
        "import json\n"
        "with open('metrics.jsonl', 'w') as f:\n"
        "    for acc in (0.5, 0.7, 0.2):\n"
        "        f.write(json.dumps({'accuracy': acc}) + '\\n')\n"
    )
    proc = _run(
        tmp_path,
        "--metric",
        "accuracy",
        "--below",
        "0.4",
        "--metrics-file",
        "metrics.jsonl",
        "--",
        sys.executable,
        "-c",
        code,
    )
    assert proc.returncode == 1
    assert _manifest(tmp_path, _result(proc)["bundle"]).failure.kind == "metric"


def test_hash_seed_is_chosen_recorded_and_used(tmp_path: Path) -> None:
    code = "import os, sys; print('seed', os.environ['PYTHONHASHSEED']); sys.exit(1)"
    proc = _run(tmp_path, "--", sys.executable, "-c", code)
    m = _manifest(tmp_path, _result(proc)["bundle"])
    assert m.seeds.python_hash_seed_chosen
    assert f"seed {m.seeds.python_hash_seed}" in proc.stdout
    own = _run(
        tmp_path,
        "--seed-env",
        "TRAIN_SEED",
        "--",
        sys.executable,
        "-c",
        code,
        env={"PYTHONHASHSEED": "123", "TRAIN_SEED": "77"},
    )
    m2 = _manifest(tmp_path, _result(own)["bundle"])
    assert m2.seeds.python_hash_seed == "123" and not m2.seeds.python_hash_seed_chosen
    assert m2.seeds.env == {"TRAIN_SEED": "77"}


def test_secrets_are_masked_in_env_logs_and_argv(tmp_path: Path) -> None:
    token = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
    code = "import os; print('using', os.environ['GITHUB_TOKEN']); raise SystemExit(3)"
    proc = _run(
        tmp_path,
        "--",
        sys.executable,
        "-c",
        code,
        "--password=hunter2hunter2",
        env={"GITHUB_TOKEN": token, "DB_PASSWORD": "s3cr3t-pass"},
    )
    assert token in proc.stdout  # the user's own terminal still sees everything
    bundle = str(_result(proc)["bundle"])
    m = _manifest(tmp_path, bundle)
    assert m.command.env["GITHUB_TOKEN"] == MASK and m.command.env["DB_PASSWORD"] == MASK
    assert "PATH" in m.command.env and MASK not in m.command.env["PATH"]
    store = LocalStore(tmp_path / ".flaketriage")
    for key in list(store.keys()):  # every blob, decompressed: manifest, logs, sources
        data = store.get_bytes(key)
        assert token.encode() not in data and b"hunter2hunter2" not in data, key
    stdout = store.get_bytes(m.logs["stdout"].sha256).decode()
    assert MASK in stdout


def test_timeout_is_a_failure_kind(tmp_path: Path) -> None:
    proc = _run(tmp_path, "--timeout", "1", "--", sys.executable, "-c", "import time; time.sleep(30)")
    assert proc.returncode != 0
    assert _manifest(tmp_path, _result(proc)["bundle"]).failure.kind == "timeout"


def test_record_failure_from_inside_a_process(tmp_path: Path) -> None:
    from flaketriage.capture.record import record_failure
    from flaketriage.failure.fingerprint import fingerprint_failure

    stderr = (
        "Traceback (most recent call last):\n"
        f'  File "{tmp_path}/train.py", line 9, in <module>\n'
        "    step()\n"
        "FloatingPointError: loss is nan at step 12\n"
    )
    info = fingerprint_failure(exit_code=1, stdout="", stderr=stderr, roots=[str(tmp_path)])
    assert info is not None
    store = LocalStore(tmp_path / "store")
    (tmp_path / "train.py").write_text("step()\n")
    bundle = record_failure(
        store,
        info,
        argv=[sys.executable, "train.py"],
        cwd=tmp_path,
        seed_values={"torch": 7, "numpy": 11},
        attachments={"guard_stats.json": b'{"loss": [1.0, "nan"]}'},
        checkpoint=b"state-dict-bytes",
        annotations={"step": 12},
    )
    m = load_manifest(store, bundle)
    assert m.kind == "training" and m.failure.exception_type == "FloatingPointError"
    assert m.seeds.values == {"torch": 7, "numpy": 11}
    assert store.get_bytes(m.attachments["guard_stats.json"].sha256).startswith(b'{"loss"')
    assert m.checkpoint is not None and store.get_bytes(m.checkpoint.sha256) == b"state-dict-bytes"
    assert m.annotations["step"] == 12
    assert [f.path for f in m.source.files] == ["train.py"]
