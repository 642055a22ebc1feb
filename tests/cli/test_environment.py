"""``flaketriage triage`` with bundle environments and other GPUs: what a person reads."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from flaketriage.bundle.io import load_manifest, write_bundle
from flaketriage.bundle.manifest import GPU, Hardware
from flaketriage.store import LocalStore


def _captured(cli, tmp_path: Path, **update: object) -> str:  # type: ignore[no-untyped-def]
    (tmp_path / "job.py").write_text("raise SystemExit('fatal: the job failed')\n")
    done = cli("capture", "--json", "--", sys.executable, "job.py")
    bundle = json.loads(done.stdout)["bundle"]
    store = LocalStore(tmp_path / ".flaketriage")
    manifest = load_manifest(store, bundle)
    return write_bundle(store, manifest.model_copy(update=update))


def test_an_environment_that_cannot_be_built_is_one_line_and_a_decided_exit(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "wheels").mkdir()
    store = LocalStore(tmp_path / ".flaketriage")
    bundle = _captured(cli, tmp_path)
    recorded = load_manifest(store, bundle).environment  # the run had a package no index here has
    bundle = _captured(
        cli,
        tmp_path,
        environment=recorded.model_copy(update={"packages": ("flaketriage-no-such-package==9.9.9",)}),
    )
    done = cli(
        "triage",
        bundle,
        "--sandbox",
        "process",
        env={
            "FLAKETRIAGE_ENVIRONMENT": "auto",  # the freeze differs from this worker's: the bundle's
            "FLAKETRIAGE_ENVIRONMENT_CACHE_DIR": str(tmp_path / "environments"),
            "PIP_NO_INDEX": "1",
            "PIP_FIND_LINKS": str(tmp_path / "wheels"),
        },
    )
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    assert line.startswith("environment: could not install the bundle's 1 pinned packages")
    assert "flaketriage-no-such-package" in line


def test_triage_on_other_gpus_prints_the_difference(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    captured = Hardware(
        gpus=(GPU(index=0, name="NVIDIA H100 80GB HBM3", memory_total_mb=81559, sm_count=132),),
        driver_version="550.54.15",
        cuda_version="12.4",
    )
    bundle = _captured(cli, tmp_path, hardware=captured)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"  # stands in for the real one: its CSV and banner, nothing else
    smi.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        '  --query-gpu=*) echo "0, NVIDIA A100-SXM4-80GB, GPU-1, 81920, 3, 0, 61.2, 31, 535.104.05" ;;\n'
        '  *) echo "| NVIDIA-SMI 535.104.05   Driver Version: 535.104.05   CUDA Version: 12.2 |" ;;\n'
        "esac\n"
    )
    smi.chmod(0o755)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FLAKETRIAGE_MAX_REPLAYS": "5"}
    done = cli("triage", bundle, "--sandbox", "process", env=env)
    assert done.returncode == 0, done.stderr
    assert "deterministic" in done.stdout
    assert "note: ran on a different GPU: model 1× NVIDIA A100-SXM4-80GB here" in done.stdout
    data = json.loads(cli("triage", bundle, "--sandbox", "process", "--json", env=env).stdout)
    assert data["hardware_difference"].startswith("ran on a different GPU:")
    assert data["environment"] == {"mode": "worker"}
    # A bundle captured on a GPU is given the runner's (here 1): each replay costs its wall time on it.
    assert data["cost"]["gpus"] == 1 and data["cost"]["gpu_s"] == data["cost"]["wall_s"] > 0
