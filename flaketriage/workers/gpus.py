"""The GPUs this runner has, as a worker announces them: NVML when installed, else ``nvidia-smi``."""

from __future__ import annotations

import shutil
import subprocess


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
