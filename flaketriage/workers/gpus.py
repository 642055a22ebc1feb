"""The GPUs this runner has: as a worker announces them, and compared with a bundle's.

A bundle captured on GPUs is routed to the ``gpu`` queue; whether the runner that takes it has the
same GPUs is checked here (`gpu_difference`), and a replay on other ones says so in its result.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

from flaketriage.bundle.manifest import GPU, Hardware
from flaketriage.process.nvidia import import_nvml, read_gpus


def gpu_names() -> list[str]:
    """One name per visible GPU; empty on a machine without one (or without a driver)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return [
                str(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)))
                for i in range(pynvml.nvmlDeviceGetCount())
            ]
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # not installed, no driver, no device: ask nvidia-smi
        pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        done = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in done.stdout.splitlines() if line.startswith("GPU ")]


@dataclass(frozen=True)
class RunnerGPUs:
    """The GPUs of this runner with its driver and the highest CUDA version that driver supports."""

    gpus: tuple[GPU, ...] = ()
    driver_version: str | None = None
    cuda_version: str | None = None


def runner_gpus() -> RunnerGPUs:
    """This runner's GPUs, read as capture reads them (`flaketriage.process.nvidia`: NVML, else
    nvidia-smi)."""
    gpus, driver, cuda = read_gpus(import_nvml())
    return RunnerGPUs(tuple(gpus), driver, cuda)


MEMORY_TOLERANCE = 0.02
"""Memory totals within 2% are the same board: NVML counts bytes, nvidia-smi rounded MiB, and
drivers reserve slightly different amounts."""


def gpu_difference(bundle: Hardware, runner: RunnerGPUs) -> str | None:
    """How this runner's GPUs differ from those a bundle was captured on, as one line for a report
    (``ran on a different GPU: ...``), or None when they match (or the bundle recorded none).

    A replay compared this way is routed by requirement: model, count, memory, SM count (when both
    sides know it), driver version, and whether the driver supports the CUDA version the run used.
    """
    if not bundle.gpus:
        return None
    theirs, mine = bundle.gpus, runner.gpus
    differences: list[str] = []
    if not mine:
        differences.append("this runner has no GPU")
    else:
        if len(mine) != len(theirs):
            differences.append(f"{len(mine)} GPU(s) here, {len(theirs)} when captured")
        names_theirs, names_mine = _names(theirs), _names(mine)
        if names_theirs != names_mine:
            differences.append(f"model {names_mine} here, {names_theirs} when captured")
        else:
            differences += _board_differences(theirs[0], mine[0])
        if bundle.driver_version and runner.driver_version and bundle.driver_version != runner.driver_version:
            differences.append(f"driver {runner.driver_version} here, {bundle.driver_version} when captured")
        if bundle.cuda_version and runner.cuda_version and _older(runner.cuda_version, bundle.cuda_version):
            here, there = runner.cuda_version, bundle.cuda_version
            differences.append(f"the driver here supports CUDA up to {here}, the run used {there}")
    return "ran on a different GPU: " + "; ".join(differences) if differences else None


def _names(gpus: tuple[GPU, ...]) -> str:
    counts: dict[str, int] = {}
    for gpu in gpus:
        counts[gpu.name] = counts.get(gpu.name, 0) + 1
    return ", ".join(f"{n}× {name}" for name, n in sorted(counts.items()))


def _board_differences(theirs: GPU, mine: GPU) -> list[str]:
    out: list[str] = []
    a, b = theirs.memory_total_mb, mine.memory_total_mb
    if a and b and abs(a - b) > MEMORY_TOLERANCE * max(a, b):
        out.append(f"{b:.0f} MiB of memory here, {a:.0f} MiB when captured")
    if theirs.sm_count and mine.sm_count and theirs.sm_count != mine.sm_count:
        out.append(f"{mine.sm_count} SMs here, {theirs.sm_count} when captured")
    return out


def _older(version: str, than: str) -> bool:
    def parts(text: str) -> tuple[int, ...]:
        return tuple(int(p) for p in re.findall(r"\d+", text)[:3])

    return parts(version) < parts(than)
