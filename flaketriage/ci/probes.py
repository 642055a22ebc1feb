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
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

from flaketriage.manifest import GPU, Environment, Hardware

NVIDIA_SMI_FIELDS = (
    "index,name,uuid,memory.total,memory.used,utilization.gpu,power.draw,temperature.gpu,driver_version"
)


def probe_environment() -> Environment:
    """The interpreter, platform and every installed distribution (``name==version``, sorted)."""
    packages: set[str] = set()
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"] if dist.metadata else None
        if name:
            packages.add(f"{name}=={dist.version}")
    return Environment(
        python=platform.python_version(),
        implementation=platform.python_implementation(),
        executable=sys.executable,
        platform=platform.platform(),
        machine=platform.machine(),
        packages=tuple(sorted(packages, key=str.lower)),
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


def _number(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


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
                uuid=cells[2] or None,
                memory_total_mb=_number(cells[3]),
                memory_used_mb=_number(cells[4]),
                utilization_pct=_number(cells[5]),
                power_w=_number(cells[6]),
                temperature_c=_number(cells[7]),
            )
        )
        driver = driver or cells[8] or None
    return gpus, driver


def parse_cuda_version(nvidia_smi_banner: str) -> str | None:
    """The ``CUDA Version: 12.4`` of plain ``nvidia-smi`` output."""
    marker = "CUDA Version:"
    if marker not in nvidia_smi_banner:
        return None
    return nvidia_smi_banner.split(marker, 1)[1].split()[0].strip("| ") or None


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def _run(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout if done.returncode == 0 else ""


def _nvml_gpus() -> tuple[list[GPU], str | None, str | None] | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver: NVML raises its own error types
        return None
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            util = _nvml(partial(lambda h: pynvml.nvmlDeviceGetUtilizationRates(h).gpu, handle))
            power = _nvml(partial(lambda h: pynvml.nvmlDeviceGetPowerUsage(h) / 1000, handle))
            temp = _nvml(partial(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU))
            name = pynvml.nvmlDeviceGetName(handle)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            gpus.append(
                GPU(
                    index=i,
                    name=name.decode() if isinstance(name, bytes) else str(name),
                    uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                    memory_total_mb=mem.total / 2**20,
                    memory_used_mb=mem.used / 2**20,
                    utilization_pct=util,
                    power_w=power,
                    temperature_c=temp,
                )
            )
        driver = _nvml(pynvml.nvmlSystemGetDriverVersion)
        cuda = _nvml(pynvml.nvmlSystemGetCudaDriverVersion)
        cuda_text = f"{int(cuda) // 1000}.{int(cuda) % 1000 // 10}" if cuda else None
        return gpus, (driver.decode() if isinstance(driver, bytes) else driver), cuda_text
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _nvml(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception:  # a field a GPU does not support must not lose the others
        return None


def probe_hardware() -> Hardware:
    """Host, CPU, memory, load and GPUs (through NVML, else nvidia-smi, else none)."""
    meminfo = parse_meminfo(_read("/proc/meminfo"))
    try:
        load = tuple(round(x, 2) for x in os.getloadavg())
    except OSError:
        load = ()
    gpus: list[GPU] = []
    driver = cuda = None
    nvml = _nvml_gpus()
    if nvml is not None:
        gpus, driver, cuda = nvml
    elif shutil.which("nvidia-smi"):
        gpus, driver = parse_nvidia_smi_csv(
            _run(["nvidia-smi", f"--query-gpu={NVIDIA_SMI_FIELDS}", "--format=csv,noheader,nounits"])
        )
        cuda = parse_cuda_version(_run(["nvidia-smi"]))
    cudnn = None
    torch = sys.modules.get("torch")
    if torch is not None:
        with contextlib.suppress(Exception):
            cuda = torch.version.cuda or cuda
            version = torch.backends.cudnn.version()
            cudnn = str(version) if version else None
    return Hardware(
        host=socket.gethostname(),
        cpu_model=parse_cpu_model(_read("/proc/cpuinfo")) or platform.processor() or None,
        cpu_count=os.cpu_count(),
        memory_total_mb=meminfo.get("MemTotal"),
        memory_available_mb=meminfo.get("MemAvailable"),
        load_avg=load,
        gpus=tuple(gpus),
        driver_version=driver,
        cuda_version=cuda,
        cudnn_version=cudnn,
    )
