"""Environment and hardware probes: what software and machine a failing run had.

Each probe is cheap and never raises: a probe that cannot answer leaves its field empty. torch is
never imported here (it costs over a second); its CUDA/cuDNN versions are read only when the
program already imported it.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from flaketriage.manifest import GPU, Environment, Hardware
from flaketriage.versions import format_cuda_driver_version, format_cudnn_version

NVIDIA_SMI_FIELDS = (
    "index,name,uuid,memory.total,memory.used,utilization.gpu,power.draw,temperature.gpu,driver_version"
)

NVIDIA_SMI_TIMEOUT_S = 5.0
"""nvidia-smi answers in well under a second; a hung driver must not hold up the capture."""

_T = TypeVar("_T")


def probe_environment() -> Environment:
    """The interpreter, platform and every installed distribution (``name==version``, sorted)."""
    return Environment(
        python=platform.python_version(),
        implementation=platform.python_implementation(),
        executable=sys.executable or None,
        platform=_attempt(platform.platform, None) or "unknown",
        machine=platform.machine() or "unknown",
        packages=_attempt(installed_packages, ()),
    )


def installed_packages() -> tuple[str, ...]:
    """``name==version`` for each distribution, once per name, sorted by normalized name.

    A name found twice on ``sys.path`` keeps its first version: that is the one ``import`` loads.
    """
    seen: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        with contextlib.suppress(Exception):  # one broken METADATA must not lose the others
            name = dist.metadata["Name"]
            if name:
                seen.setdefault(_normalize(name), f"{name}=={dist.version}")
    return tuple(seen[key] for key in sorted(seen))


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503


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


def _number(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def _text(cell: str) -> str | None:
    return None if not cell or cell.startswith("[") or cell == "N/A" else cell


def parse_nvidia_smi_csv(text: str) -> tuple[list[GPU], str | None]:
    """GPUs and the driver version from ``nvidia-smi --query-gpu=... --format=csv,noheader,nounits``."""
    gpus: list[GPU] = []
    driver: str | None = None
    for line in text.strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 9 or not cells[0].isdigit():
            continue
        gpus.append(
            GPU(
                index=int(cells[0]),
                name=cells[1],
                uuid=_text(cells[2]),
                memory_total_mb=_number(cells[3]),
                memory_used_mb=_number(cells[4]),
                utilization_pct=_number(cells[5]),
                power_w=_number(cells[6]),
                temperature_c=_number(cells[7]),
            )
        )
        driver = driver or _text(cells[8])
    return gpus, driver


def parse_cuda_version(nvidia_smi_banner: str) -> str | None:
    """The ``CUDA Version: 12.4`` of plain ``nvidia-smi`` output."""
    found = re.search(r"CUDA Version:\s*([0-9]+(?:\.[0-9]+)*)", nvidia_smi_banner)
    return found.group(1) if found else None


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def _run(argv: list[str]) -> str:
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=NVIDIA_SMI_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout if done.returncode == 0 else ""


def _attempt(fn: Callable[[], _T], default: _T) -> _T:
    try:
        return fn()
    except Exception:  # a probe that cannot answer leaves its field empty, and the others stand
        return default


def _decode(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _import_nvml() -> Any:
    try:
        # The old "pynvml" distribution warns that it is deprecated when imported; under -W error
        # (or pytest's filterwarnings) that warning would be raised instead.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import pynvml
    except Exception:
        return None
    return pynvml


def read_nvml(nvml: Any) -> tuple[list[GPU], str | None, str | None] | None:
    """GPUs, driver version and CUDA driver version through an NVML module; None when NVML fails."""
    try:
        nvml.nvmlInit()
    except Exception:  # no driver: NVML raises its own error types
        return None
    try:
        gpus = [gpu for i in range(_attempt(nvml.nvmlDeviceGetCount, 0)) if (gpu := _nvml_gpu(nvml, i))]
        driver = _decode(_attempt(nvml.nvmlSystemGetDriverVersion, None))
        cuda = _attempt(nvml.nvmlSystemGetCudaDriverVersion, None)
        return gpus, driver, format_cuda_driver_version(int(cuda)) if cuda else None
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def _nvml_gpu(nvml: Any, index: int) -> GPU | None:
    handle = _attempt(lambda: nvml.nvmlDeviceGetHandleByIndex(index), None)
    if handle is None:
        return None  # a GPU that fell off the bus; the others are still worth recording
    mem = _attempt(lambda: nvml.nvmlDeviceGetMemoryInfo(handle), None)
    power_mw = _attempt(lambda: nvml.nvmlDeviceGetPowerUsage(handle), None)
    return GPU(
        index=index,
        name=_decode(_attempt(lambda: nvml.nvmlDeviceGetName(handle), None)) or "unknown",
        uuid=_decode(_attempt(lambda: nvml.nvmlDeviceGetUUID(handle), None)),
        memory_total_mb=mem.total / 2**20 if mem is not None else None,
        memory_used_mb=mem.used / 2**20 if mem is not None else None,
        utilization_pct=_attempt(lambda: float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu), None),
        power_w=power_mw / 1000 if power_mw is not None else None,
        temperature_c=_attempt(
            lambda: float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)), None
        ),
    )


def _gpus() -> tuple[list[GPU], str | None, str | None]:
    nvml = _import_nvml()
    found = read_nvml(nvml) if nvml is not None else None
    if found is not None:
        return found
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return [], None, None
    gpus, driver = parse_nvidia_smi_csv(
        _run([smi, f"--query-gpu={NVIDIA_SMI_FIELDS}", "--format=csv,noheader,nounits"])
    )
    # The banner costs a second call; skip it when there is no GPU to speak of.
    return gpus, driver, parse_cuda_version(_run([smi])) if gpus else None


def _torch_versions() -> tuple[str | None, str | None]:
    torch = sys.modules.get("torch")
    if torch is None:
        return None, None
    cuda = _attempt(lambda: _decode(torch.version.cuda), None)
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
