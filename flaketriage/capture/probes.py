"""Environment and hardware probes: what software and machine a failing run had.

Each probe is cheap and never raises: a probe that cannot answer leaves its field empty. torch is
never imported here (it costs over a second); its CUDA/cuDNN versions are read only when the
program already imported it.
"""

from __future__ import annotations

import os
import platform
import socket
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from flaketriage.bundle.freeze import installed_packages
from flaketriage.bundle.manifest import GPU, Environment, Hardware
from flaketriage.process.nvidia import (
    NVIDIA_SMI_FIELDS,
    GpuReading,
    import_nvml,
    parse_cuda_version,
    parse_nvidia_smi_csv,
    read_gpus,
    read_nvml,
    run_nvidia_smi,
    torch_sm_counts,
    with_sm_counts,
)
from flaketriage.versions import format_cudnn_version

__all__ = [
    "NVIDIA_SMI_FIELDS",
    "installed_packages",
    "parse_cpu_model",
    "parse_cuda_version",
    "parse_meminfo",
    "parse_nvidia_smi_csv",
    "probe_environment",
    "probe_hardware",
    "read_nvml",
]

NVIDIA_SMI_TIMEOUT_S = 5.0
"""nvidia-smi answers in well under a second; a hung driver must not hold up the capture."""

_T = TypeVar("_T")


def probe_environment() -> Environment:
    """The interpreter, platform and every installed distribution (`installed_packages`)."""
    return Environment(
        python=platform.python_version(),
        implementation=platform.python_implementation(),
        executable=sys.executable or None,
        platform=_attempt(platform.platform, None) or "unknown",
        machine=platform.machine() or "unknown",
        packages=_attempt(installed_packages, ()),
    )


def parse_meminfo(text: str) -> dict[str, float]:
    """``/proc/meminfo`` as MiB per field."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            kib = int(parts[0])
            out[name.strip()] = kib / 1024
    return out


def parse_cpu_model(text: str) -> str | None:
    """The first ``model name`` of ``/proc/cpuinfo``."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "cpu model") and value.strip():
            return value.strip()
    return None


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def _run(argv: list[str]) -> str:
    return run_nvidia_smi(argv, NVIDIA_SMI_TIMEOUT_S)


def _attempt(fn: Callable[[], _T], default: _T) -> _T:
    try:
        return fn()
    except Exception:  # a probe that cannot answer leaves its field empty, and the others stand
        return default


def _import_nvml() -> Any:
    return import_nvml()


def _gpus() -> GpuReading:
    return read_gpus(_import_nvml(), _run)


def _torch_versions() -> tuple[str | None, str | None]:
    torch = sys.modules.get("torch")
    if torch is None:
        return None, None
    cuda = _attempt(lambda: str(torch.version.cuda) if torch.version.cuda else None, None)
    cudnn = _attempt(lambda: torch.backends.cudnn.version(), None)
    return cuda, format_cudnn_version(int(cudnn)) if cudnn else None


def _memory_mb() -> tuple[float | None, float | None]:
    meminfo = parse_meminfo(_read("/proc/meminfo"))
    if meminfo:
        return meminfo.get("MemTotal"), meminfo.get("MemAvailable")
    # No /proc (macOS): the total is still known to sysconf, what is available is not.
    total = _attempt(lambda: os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20, None)
    return total, None


def probe_hardware() -> Hardware:
    """Host, CPU, memory, load and GPUs (through NVML, else nvidia-smi, else none)."""
    no_memory: tuple[float | None, float | None] = (None, None)
    total, available = _attempt(_memory_mb, no_memory)
    no_gpus: tuple[list[GPU], str | None, str | None] = ([], None, None)
    gpus, driver, smi_cuda = _attempt(_gpus, no_gpus)
    torch_cuda, cudnn = _torch_versions()
    torch = sys.modules.get("torch")
    if torch is not None and any(g.sm_count is None for g in gpus):
        gpus = _attempt(lambda: with_sm_counts(gpus, torch_sm_counts(torch)), gpus)
    return Hardware(
        host=_attempt(socket.gethostname, None) or None,
        cpu_model=_attempt(lambda: parse_cpu_model(_read("/proc/cpuinfo")) or platform.processor(), None)
        or None,
        cpu_count=os.cpu_count(),
        memory_total_mb=total,
        memory_available_mb=available,
        load_avg=_attempt(lambda: tuple(round(x, 2) for x in os.getloadavg()), ()),
        gpus=tuple(gpus),
        driver_version=driver,
        # What torch was built against is what the run used; the driver's CUDA is only the ceiling.
        cuda_version=torch_cuda or smi_cuda,
        cudnn_version=cudnn,
    )
