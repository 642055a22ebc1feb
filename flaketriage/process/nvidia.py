"""A machine's NVIDIA GPUs, read through NVML (``pynvml``) or else ``nvidia-smi``.

Capture records them in a bundle (`flaketriage.capture.probes`) and a worker compares its own with a
bundle's (`flaketriage.workers.gpus`), so both read them here. Nothing raises: a reading that
fails leaves its field empty. The SM count comes from NVML's device attributes
(``multiprocessorCount``); ``nvidia-smi --query-gpu`` has no field for it, so through nvidia-smi it
stays unknown unless the program's torch can say (`torch_sm_counts`).
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from flaketriage.bundle.manifest import GPU
from flaketriage.versions import format_cuda_driver_version

NVIDIA_SMI_FIELDS = (
    "index,name,uuid,memory.total,memory.used,utilization.gpu,power.draw,temperature.gpu,driver_version"
)

NVIDIA_SMI_TIMEOUT_S = 5.0
"""nvidia-smi answers in well under a second; a hung driver must not hold anything up."""

GpuReading = tuple[list[GPU], str | None, str | None]
"""GPUs, the driver version and the CUDA version the driver supports."""

_T = TypeVar("_T")


def _attempt(fn: Callable[[], _T], default: _T) -> _T:
    try:
        return fn()
    except Exception:  # a reading that cannot answer leaves its field empty, and the others stand
        return default


def _decode(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


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


def import_nvml() -> Any:
    """The ``pynvml`` module, or None when it is not installed."""
    try:
        # The old "pynvml" distribution warns that it is deprecated when imported; under -W error
        # (or pytest's filterwarnings) that warning would be raised instead.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import pynvml
    except Exception:
        return None
    return pynvml


def read_nvml(nvml: Any) -> GpuReading | None:
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
    sms = _attempt(lambda: int(nvml.nvmlDeviceGetAttributes(handle).multiprocessorCount), None)
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
        sm_count=sms if sms else None,
    )


def run_nvidia_smi(argv: list[str], timeout_s: float = NVIDIA_SMI_TIMEOUT_S) -> str:
    """nvidia-smi's output, or ``""`` when it fails, hangs past `timeout_s` or cannot start."""
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, errors="replace", timeout=timeout_s, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout if done.returncode == 0 else ""


def read_gpus(nvml: Any, run: Callable[[list[str]], str] = run_nvidia_smi) -> GpuReading:
    """GPUs through `nvml` (the ``pynvml`` module, or None), else through ``nvidia-smi`` run by `run`."""
    found = read_nvml(nvml) if nvml is not None else None
    if found is not None:
        return found
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return [], None, None
    gpus, driver = parse_nvidia_smi_csv(
        run([smi, f"--query-gpu={NVIDIA_SMI_FIELDS}", "--format=csv,noheader,nounits"])
    )
    # The banner costs a second call; skip it when there is no GPU to speak of.
    return gpus, driver, parse_cuda_version(run([smi])) if gpus else None


def torch_sm_counts(torch: Any) -> list[int | None]:
    """Per visible device, its SM count from an already initialized torch (never initializes CUDA)."""
    if not _attempt(lambda: bool(torch.cuda.is_initialized()), False):
        return []
    count = _attempt(lambda: int(torch.cuda.device_count()), 0)
    return [
        _attempt(lambda i=i: int(torch.cuda.get_device_properties(i).multi_processor_count), None)  # type: ignore[misc]
        for i in range(count)
    ]


def with_sm_counts(gpus: list[GPU], counts: list[int | None]) -> list[GPU]:
    """`gpus` with unknown SM counts filled in from `counts`, only when both list the same number of
    devices (torch numbers what ``CUDA_VISIBLE_DEVICES`` shows, NVML every board)."""
    if len(counts) != len(gpus):
        return gpus
    return [
        gpu.model_copy(update={"sm_count": count}) if gpu.sm_count is None and count else gpu
        for gpu, count in zip(gpus, counts, strict=True)
    ]
