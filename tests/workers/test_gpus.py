"""The runner's GPUs compared with a bundle's: routing requirements and what a report says.

No GPU exists on the machines these tests run on: the runner's GPUs are read from a stand-in
``nvidia-smi`` on PATH that prints what the real one prints for ``--query-gpu`` and its banner, or
from a fake NVML module with pynvml's function names.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from flaketriage.bundle.manifest import GPU, Hardware
from flaketriage.workers import gpus as gpus_module
from flaketriage.workers.gpus import RunnerGPUs, gpu_difference, runner_gpus

H100 = GPU(index=0, name="NVIDIA H100 80GB HBM3", memory_total_mb=81559, sm_count=132)
A100 = GPU(index=0, name="NVIDIA A100-SXM4-80GB", memory_total_mb=81920, sm_count=108)
CAPTURED = Hardware(gpus=(H100,), driver_version="550.54.15", cuda_version="12.4")

A100_CSV = "0, NVIDIA A100-SXM4-80GB, GPU-1, 81920, 3, 0, 61.2, 31, 535.104.05\n"
BANNER_535 = "| NVIDIA-SMI 535.104.05   Driver Version: 535.104.05   CUDA Version: 12.2 |\n"


def test_the_same_gpus_are_no_difference() -> None:
    same = RunnerGPUs((H100.model_copy(update={"memory_total_mb": 81559.4}),), "550.54.15", "12.4")
    assert gpu_difference(CAPTURED, same) is None
    assert gpu_difference(Hardware(), RunnerGPUs()) is None  # a CPU bundle asks for nothing


def test_another_model_and_an_older_driver_are_named() -> None:
    note = gpu_difference(CAPTURED, RunnerGPUs((A100,), "535.104.05", "12.2"))
    assert note is not None and note.startswith("ran on a different GPU: ")
    assert "model 1× NVIDIA A100-SXM4-80GB here, 1× NVIDIA H100 80GB HBM3 when captured" in note
    assert "driver 535.104.05 here, 550.54.15 when captured" in note
    assert "supports CUDA up to 12.2, the run used 12.4" in note


def test_a_cut_down_board_of_the_same_name_shows_in_sms_and_memory() -> None:
    smaller = H100.model_copy(update={"memory_total_mb": 40960.0, "sm_count": 114})
    note = gpu_difference(CAPTURED, RunnerGPUs((smaller,), "550.54.15", "12.4"))
    assert note == (
        "ran on a different GPU: 40960 MiB of memory here, 81559 MiB when captured; "
        "114 SMs here, 132 when captured"
    )


def test_fewer_gpus_or_none_at_all() -> None:
    two = CAPTURED.model_copy(update={"gpus": (H100, H100.model_copy(update={"index": 1}))})
    note = gpu_difference(two, RunnerGPUs((H100,), "550.54.15", "12.4"))
    assert note is not None and "1 GPU(s) here, 2 when captured" in note
    assert gpu_difference(CAPTURED, RunnerGPUs()) == "ran on a different GPU: this runner has no GPU"


def test_the_runner_reads_its_gpus_through_nvidia_smi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gpus_module, "import_nvml", lambda: None)
    smi = tmp_path / "nvidia-smi"
    (tmp_path / "csv").write_text(A100_CSV)
    (tmp_path / "banner").write_text(BANNER_535)
    smi.write_text(
        f'#!/bin/sh\ncase "$1" in --query-gpu=*) cat {tmp_path}/csv ;; *) cat {tmp_path}/banner ;; esac\n'
    )
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    runner = runner_gpus()
    assert [g.name for g in runner.gpus] == ["NVIDIA A100-SXM4-80GB"]
    assert (runner.driver_version, runner.cuda_version) == ("535.104.05", "12.2")
    assert runner.gpus[0].sm_count is None  # nvidia-smi has no field for it
    note = gpu_difference(CAPTURED, runner)
    assert note is not None and "NVIDIA A100-SXM4-80GB here" in note and "SMs" not in note


def test_the_runner_reads_its_sm_count_through_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = SimpleNamespace(
        NVML_TEMPERATURE_GPU=0,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: "NVIDIA H100 80GB HBM3",
        nvmlDeviceGetUUID=lambda h: "GPU-0",
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=81559 * 2**20, used=0),
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=0),
        nvmlDeviceGetPowerUsage=lambda h: 70_000,
        nvmlDeviceGetTemperature=lambda h, sensor: 30,
        nvmlDeviceGetAttributes=lambda h: SimpleNamespace(multiprocessorCount=132),
        nvmlSystemGetDriverVersion=lambda: "550.54.15",
        nvmlSystemGetCudaDriverVersion=lambda: 12040,
    )
    monkeypatch.setattr(gpus_module, "import_nvml", lambda: nvml)
    runner = runner_gpus()
    assert runner.gpus[0].sm_count == 132 and runner.cuda_version == "12.4"
    assert gpu_difference(CAPTURED, runner) is None


def test_a_triage_on_other_gpus_says_so(tmp_path: Path) -> None:
    from flaketriage.bundle.io import load_manifest, write_bundle
    from flaketriage.capture.record import CaptureRequest, run_and_capture
    from flaketriage.capture.source import SourceLimits
    from flaketriage.store import LocalStore
    from flaketriage.workers.replay import ReplayContext
    from flaketriage.workers.sandbox import ProcessSandbox
    from flaketriage.workers.triage import TriageResult, triage
    from flaketriage.workers.verdict import VerdictPolicy

    root = tmp_path / "proj"
    root.mkdir()
    (root / "job.py").write_text("raise SystemExit('fatal: boom')\n")
    store = LocalStore(tmp_path / "store")
    limits = SourceLimits(max_file_bytes=1 << 20, max_total_bytes=1 << 20)
    done = run_and_capture(
        store, CaptureRequest(argv=[sys.executable, "job.py"], cwd=root, limits=limits, echo=False)
    )
    assert done.bundle_id
    manifest = load_manifest(store, done.bundle_id)
    bundle = write_bundle(store, manifest.model_copy(update={"hardware": CAPTURED}))
    context = ReplayContext.from_process()
    context = type(context)(**{**context.__dict__, "gpus": lambda: RunnerGPUs((A100,), "535.104.05", "12.2")})
    result = triage(
        store,
        bundle,
        sandbox=ProcessSandbox(),
        policy=VerdictPolicy(),
        sink=None,
        quarantine=None,
        context=context,
    )
    assert result.hardware_difference is not None
    assert result.hardware_difference.startswith("ran on a different GPU: model 1× NVIDIA A100")
    assert TriageResult.from_json(result.to_json()).hardware_difference == result.hardware_difference
