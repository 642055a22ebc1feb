"""Probes: parsers on recorded tool output, fake NVML and nvidia-smi, and real probes of this machine."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import socket
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from flaketriage.capture import probes
from flaketriage.capture.probes import (
    parse_cpu_model,
    parse_cuda_version,
    parse_meminfo,
    parse_nvidia_smi_csv,
    probe_environment,
    probe_hardware,
    read_nvml,
)
from flaketriage.versions import format_cuda_driver_version, format_cudnn_version

# nvidia-smi --query-gpu=<NVIDIA_SMI_FIELDS> --format=csv,noheader,nounits on a 2x H100 node whose
# second board does not report its power draw.
H100_CSV = """\
0, NVIDIA H100 80GB HBM3, GPU-6f3c9a2e-1b4d-7e8f-9a0b-c1d2e3f4a5b6, 81559, 74210, 98, 612.43, 67, 550.54.15
1, NVIDIA H100 80GB HBM3, GPU-0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d, 81559, 3, 0, [N/A], 31, 550.54.15
"""

BANNER_550 = """\
Tue Mar 12 10:41:07 2024
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 550.54.15              Driver Version: 550.54.15      CUDA Version: 12.4     |
|-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|=========================================+========================+======================|
|   0  NVIDIA H100 80GB HBM3          On  |   00000000:18:00.0 Off |                    0 |
| N/A   67C    P0            612W /  700W |   74210MiB /  81559MiB |     98%      Default |
+-----------------------------------------+------------------------+----------------------+
"""

BANNER_535 = """\
+---------------------------------------------------------------------------------------+
| NVIDIA-SMI 535.104.05             Driver Version: 535.104.05   CUDA Version: 12.2     |
+---------------------------------------------------------------------------------------+
"""

MEMINFO = """\
MemTotal:       2113437148 kB
MemFree:        1821907368 kB
MemAvailable:   2071212204 kB
Buffers:          395144 kB
Cached:         241112884 kB
SwapTotal:             0 kB
HugePages_Total:       0
Hugepagesize:       2048 kB
"""

CPUINFO_X86 = """\
processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8480+
stepping\t: 8

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
"""

CPUINFO_ARM_SERVER = """\
processor\t: 0
BogoMIPS\t: 2000.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics
CPU implementer\t: 0x41
CPU part\t: 0xd4f
"""


def test_parse_nvidia_smi_csv_on_two_h100s() -> None:
    gpus, driver = parse_nvidia_smi_csv(H100_CSV)
    assert driver == "550.54.15"
    assert [g.index for g in gpus] == [0, 1]
    first, second = gpus
    assert first.name == "NVIDIA H100 80GB HBM3"
    assert first.uuid == "GPU-6f3c9a2e-1b4d-7e8f-9a0b-c1d2e3f4a5b6"
    assert (first.memory_total_mb, first.memory_used_mb) == (81559.0, 74210.0)
    assert (first.utilization_pct, first.power_w, first.temperature_c) == (98.0, 612.43, 67.0)
    assert second.power_w is None
    assert (second.memory_used_mb, second.utilization_pct, second.temperature_c) == (3.0, 0.0, 31.0)


def test_parse_nvidia_smi_csv_skips_what_is_not_a_gpu_row() -> None:
    text = (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"
        "\n"
        "0, Tesla T4, [N/A], 15360, [N/A], [Not Supported], [Not Supported], 40, 535.104.05\n"
    )
    gpus, driver = parse_nvidia_smi_csv(text)
    assert driver == "535.104.05"
    assert len(gpus) == 1
    assert gpus[0].name == "Tesla T4"
    assert gpus[0].uuid is None
    assert (gpus[0].memory_used_mb, gpus[0].utilization_pct, gpus[0].power_w) == (None, None, None)
    assert parse_nvidia_smi_csv("") == ([], None)


@pytest.mark.parametrize(
    ("banner", "expected"),
    [(BANNER_550, "12.4"), (BANNER_535, "12.2"), ("| CUDA Version: N/A |", None), ("", None)],
)
def test_parse_cuda_version(banner: str, expected: str | None) -> None:
    assert parse_cuda_version(banner) == expected


def test_parse_meminfo() -> None:
    info = parse_meminfo(MEMINFO)
    assert info["MemTotal"] == 2113437148 / 1024
    assert info["MemAvailable"] == 2071212204 / 1024
    assert info["SwapTotal"] == 0
    assert parse_meminfo("") == {}


def test_parse_cpu_model() -> None:
    assert parse_cpu_model(CPUINFO_X86) == "Intel(R) Xeon(R) Platinum 8480+"
    assert parse_cpu_model(CPUINFO_ARM_SERVER) is None


@pytest.mark.parametrize(("raw", "expected"), [(8902, "8.9.2"), (7605, "7.6.5"), (90100, "9.1.0")])
def test_format_cudnn_version(raw: int, expected: str) -> None:
    assert format_cudnn_version(raw) == expected


@pytest.mark.parametrize(("raw", "expected"), [(12040, "12.4"), (11080, "11.8"), (12020, "12.2")])
def test_format_cuda_driver_version(raw: int, expected: str) -> None:
    assert format_cuda_driver_version(raw) == expected


class FakeNVMLError(Exception):
    pass


def _fake_nvml(**overrides: Any) -> SimpleNamespace:
    """An NVML module with two H100s; GPU 1 reports no power, GPU 2 fell off the bus."""
    calls: list[str] = []

    def handle(i: int) -> int:
        if i == 2:
            raise FakeNVMLError("GPU is lost")
        return i

    def power(h: int) -> int:
        if h == 1:
            raise FakeNVMLError("Not Supported")
        return 612_430

    fields: dict[str, Any] = {
        "calls": calls,
        "NVML_TEMPERATURE_GPU": 0,
        "nvmlInit": lambda: calls.append("init"),
        "nvmlShutdown": lambda: calls.append("shutdown"),
        "nvmlDeviceGetCount": lambda: 3,
        "nvmlDeviceGetHandleByIndex": handle,
        "nvmlDeviceGetName": lambda h: b"NVIDIA H100 80GB HBM3",
        "nvmlDeviceGetUUID": lambda h: f"GPU-{h}",
        "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(total=80 * 2**30, used=2**30),
        "nvmlDeviceGetUtilizationRates": lambda h: SimpleNamespace(gpu=97, memory=40),
        "nvmlDeviceGetPowerUsage": power,
        "nvmlDeviceGetTemperature": lambda h, sensor: 66,
        "nvmlSystemGetDriverVersion": lambda: b"550.54.15",
        "nvmlSystemGetCudaDriverVersion": lambda: 12040,
    }
    fields.update(overrides)
    return SimpleNamespace(**fields)


def test_read_nvml_keeps_what_each_gpu_can_report() -> None:
    nvml = _fake_nvml()
    found = read_nvml(nvml)
    assert found is not None
    gpus, driver, cuda = found
    assert (driver, cuda) == ("550.54.15", "12.4")
    assert [g.index for g in gpus] == [0, 1]
    assert gpus[0].name == "NVIDIA H100 80GB HBM3"
    assert gpus[0].uuid == "GPU-0"
    assert (gpus[0].memory_total_mb, gpus[0].memory_used_mb) == (81920.0, 1024.0)
    assert (gpus[0].utilization_pct, gpus[0].power_w, gpus[0].temperature_c) == (97.0, 612.43, 66.0)
    assert gpus[1].power_w is None
    assert nvml.calls == ["init", "shutdown"]


def test_read_nvml_without_a_driver_is_none() -> None:
    def no_driver() -> None:
        raise FakeNVMLError("NVML Shared Library Not Found")

    assert read_nvml(_fake_nvml(nvmlInit=no_driver)) is None


def test_probe_environment_of_this_interpreter() -> None:
    env = probe_environment()
    assert env.python == platform.python_version()
    assert env.implementation == platform.python_implementation()
    assert env.executable == sys.executable
    assert env.machine == platform.machine()
    names = [p.split("==", 1)[0].lower().replace("_", "-") for p in env.packages]
    assert names == sorted(set(names))
    assert "pydantic" in names
    assert "pytest" in names


def test_probe_hardware_of_this_machine_never_imports_torch() -> None:
    had_torch = "torch" in sys.modules
    started = time.perf_counter()
    hw = probe_hardware()
    assert time.perf_counter() - started < 2
    assert ("torch" in sys.modules) == had_torch
    assert hw.cpu_count == os.cpu_count()
    if sys.platform == "linux":
        assert hw.memory_total_mb and hw.memory_available_mb
        assert 0 < hw.memory_available_mb <= hw.memory_total_mb
        assert len(hw.load_avg) == 3
    if shutil.which("nvidia-smi") is None and probes._import_nvml() is None:
        assert hw.gpus == ()
        assert hw.driver_version is None


def _fake_nvidia_smi(bin_dir: Path, body: str) -> None:
    script = bin_dir / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)


@pytest.fixture
def no_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probes, "_import_nvml", lambda: None)


@pytest.mark.usefixtures("no_nvml")
def test_probe_hardware_through_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "csv").write_text(H100_CSV)
    (tmp_path / "banner").write_text(BANNER_550)
    _fake_nvidia_smi(
        tmp_path,
        f'case "$1" in --query-gpu=*) cat {tmp_path}/csv ;; *) cat {tmp_path}/banner ;; esac\n',
    )
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    hw = probe_hardware()
    assert [g.name for g in hw.gpus] == ["NVIDIA H100 80GB HBM3"] * 2
    assert (hw.driver_version, hw.cuda_version, hw.cudnn_version) == ("550.54.15", "12.4", None)


@pytest.mark.usefixtures("no_nvml")
@pytest.mark.parametrize("body", ["echo 'NVIDIA-SMI has failed' >&2\nexit 9\n", "exec sleep 10\n"])
def test_a_failing_or_hung_nvidia_smi_leaves_gpus_empty(
    body: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_nvidia_smi(tmp_path, body)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setattr(probes, "NVIDIA_SMI_TIMEOUT_S", 0.3)
    started = time.perf_counter()
    hw = probe_hardware()
    assert time.perf_counter() - started < 3
    assert (hw.gpus, hw.driver_version, hw.cuda_version) == ((), None, None)


def test_cuda_and_cudnn_come_from_torch_when_the_program_imported_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_torch = SimpleNamespace(
        version=SimpleNamespace(cuda="12.1"),
        backends=SimpleNamespace(cudnn=SimpleNamespace(version=lambda: 8902)),
    )
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    hw = probe_hardware()
    assert (hw.cuda_version, hw.cudnn_version) == ("12.1", "8.9.2")


def test_a_cpu_build_of_torch_reports_no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_cudnn() -> None:
        raise RuntimeError("cuDNN is not available")

    fake_torch = SimpleNamespace(
        version=SimpleNamespace(cuda=None), backends=SimpleNamespace(cudnn=SimpleNamespace(version=no_cudnn))
    )
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    monkeypatch.setattr(probes, "_import_nvml", lambda: None)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    hw = probe_hardware()
    assert (hw.cuda_version, hw.cudnn_version) == (None, None)


def test_a_deprecated_pynvml_that_warns_on_import_is_still_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pytest turns warnings into errors here, as -W error would in a user's run.
    (tmp_path / "pynvml.py").write_text(
        "import warnings\n"
        "warnings.warn('The pynvml package is deprecated', FutureWarning)\n"
        "NVML_TEMPERATURE_GPU = 0\n"
        "def nvmlInit(): pass\n"
        "def nvmlShutdown(): pass\n"
        "def nvmlDeviceGetCount(): return 1\n"
        "def nvmlDeviceGetHandleByIndex(i): return i\n"
        "def nvmlDeviceGetName(h): return 'NVIDIA H200'\n"
        "def nvmlDeviceGetUUID(h): return 'GPU-h200'\n"
        "def nvmlDeviceGetMemoryInfo(h): raise RuntimeError('Not Supported')\n"
        "def nvmlDeviceGetUtilizationRates(h): raise RuntimeError('Not Supported')\n"
        "def nvmlDeviceGetPowerUsage(h): return 250000\n"
        "def nvmlDeviceGetTemperature(h, sensor): return 40\n"
        "def nvmlSystemGetDriverVersion(): return '570.86.15'\n"
        "def nvmlSystemGetCudaDriverVersion(): return 12080\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    # Registered as absent so that the import below is undone when the test ends.
    monkeypatch.setitem(sys.modules, "pynvml", None)
    del sys.modules["pynvml"]
    hw = probe_hardware()
    assert [(g.name, g.uuid, g.memory_total_mb, g.power_w) for g in hw.gpus] == [
        ("NVIDIA H200", "GPU-h200", None, 250.0)
    ]
    assert (hw.driver_version, hw.cuda_version) == ("570.86.15", "12.8")


def test_probes_do_not_raise_when_the_system_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise OSError("refused")

    monkeypatch.setattr(os, "getloadavg", refuse)
    monkeypatch.setattr(probes, "_read", refuse)
    monkeypatch.setattr(socket, "gethostname", refuse)
    monkeypatch.setattr(importlib.metadata, "distributions", refuse)
    monkeypatch.setattr(platform, "platform", refuse)
    hw = probe_hardware()
    assert (hw.load_avg, hw.host, hw.cpu_model, hw.memory_total_mb) == ((), None, None, None)
    env = probe_environment()
    assert (env.packages, env.platform) == ((), "unknown")


def test_the_sm_count_comes_from_nvml_device_attributes() -> None:
    # pynvml's nvmlDeviceGetAttributes returns a c_nvmlDeviceAttributes with multiprocessorCount.
    nvml = _fake_nvml(nvmlDeviceGetAttributes=lambda h: SimpleNamespace(multiprocessorCount=132))
    found = read_nvml(nvml)
    assert found is not None
    assert [g.sm_count for g in found[0]] == [132, 132]


def test_a_driver_without_device_attributes_leaves_the_sm_count_unknown() -> None:
    def not_supported(h: int) -> None:
        raise FakeNVMLError("Not Supported")

    found = read_nvml(_fake_nvml(nvmlDeviceGetAttributes=not_supported))
    assert found is not None and [g.sm_count for g in found[0]] == [None, None]
    # ...and a manifest that does not know it encodes as before, so bundle ids do not change.
    assert "sm_count" not in found[0][0].model_dump(mode="json")


@pytest.mark.usefixtures("no_nvml")
def test_through_nvidia_smi_the_sm_count_comes_from_a_torch_that_initialized_cuda(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "csv").write_text(H100_CSV)
    (tmp_path / "banner").write_text(BANNER_550)
    _fake_nvidia_smi(
        tmp_path,
        f'case "$1" in --query-gpu=*) cat {tmp_path}/csv ;; *) cat {tmp_path}/banner ;; esac\n',
    )
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    cuda = SimpleNamespace(
        is_initialized=lambda: True,
        device_count=lambda: 2,
        get_device_properties=lambda i: SimpleNamespace(multi_processor_count=132),
    )
    fake_torch = SimpleNamespace(
        version=SimpleNamespace(cuda="12.4"),
        backends=SimpleNamespace(cudnn=SimpleNamespace(version=lambda: 90100)),
        cuda=cuda,
    )
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    assert [g.sm_count for g in probe_hardware().gpus] == [132, 132]
    cuda.is_initialized = lambda: False  # never initialize CUDA for a count
    assert [g.sm_count for g in probe_hardware().gpus] == [None, None]
