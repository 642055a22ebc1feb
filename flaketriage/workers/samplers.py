"""Host and GPU metrics sampled at a fixed interval while a telemetry run replays a failure.

`Sampler` is a thread that takes one sample every ``interval_s`` (on a fixed schedule, so a slow
sample does not stretch the series): the host's CPU use, load and memory through psutil when it is
installed (``pip install 'flaketriage[gpu]'``), else from ``/proc``; and every GPU through NVML
(``nvidia-ml-py``) when it is installed and finds a driver: utilization, memory, temperature,
power, SM and memory clocks, ECC error counts and XID errors (critical XID events, collected from
an NVML event set between samples). A reading a device does not support is left out, never
guessed. `summarize` reduces a series to the numbers a report shows; `summary_lines` writes them.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from flaketriage.process.nvidia import import_nvml

_T = TypeVar("_T")
Sample = dict[str, Any]


def _attempt(fn: Callable[..., _T], *args: Any) -> _T | None:
    try:
        return fn(*args)
    except Exception:  # NVML raises its own errors (NotSupported, GpuIsLost); psutil its own
        return None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


# --- the host ------------------------------------------------------------------------------------


class HostProbe:
    """CPU use (percent of all cores since the last sample), load averages and memory."""

    def __init__(self, *, use_psutil: bool = True, proc: str = "/proc") -> None:
        psutil: Any = None
        if use_psutil:
            with contextlib.suppress(ImportError):
                psutil = importlib.import_module("psutil")
        self.psutil = psutil
        self.proc = proc
        self.source = "psutil" if psutil is not None else "proc"
        self._last_cpu: tuple[float, float] | None = None
        self.sample()  # primes the CPU counters: the first real sample measures from here

    def sample(self) -> Sample:
        out: Sample = {}
        with contextlib.suppress(OSError, AttributeError):
            out["load1"], out["load5"], out["load15"] = (round(x, 2) for x in os.getloadavg())
        if self.psutil is not None:
            cpu = _attempt(lambda: float(self.psutil.cpu_percent(interval=None)))
            memory = _attempt(self.psutil.virtual_memory)
            if cpu is not None:
                out["cpu_pct"] = round(cpu, 1)
            if memory is not None:
                out["mem_used_mb"] = round((memory.total - memory.available) / 2**20, 1)
                out["mem_available_mb"] = round(memory.available / 2**20, 1)
            return out
        cpu = self._proc_cpu_pct()
        if cpu is not None:
            out["cpu_pct"] = cpu
        meminfo = self._proc_meminfo()
        if "MemTotal" in meminfo and "MemAvailable" in meminfo:
            out["mem_used_mb"] = round((meminfo["MemTotal"] - meminfo["MemAvailable"]) / 1024, 1)
            out["mem_available_mb"] = round(meminfo["MemAvailable"] / 1024, 1)
        return out

    def _proc_cpu_pct(self) -> float | None:
        try:
            with open(f"{self.proc}/stat", encoding="ascii") as fh:
                fields = fh.readline().split()
        except OSError:
            return None
        if not fields or fields[0] != "cpu":
            return None
        ticks = [float(x) for x in fields[1:9]]
        total, idle = sum(ticks), ticks[3] + ticks[4]  # idle + iowait
        last = self._last_cpu
        if last is not None and total <= last[0]:
            return None  # no clock tick since (they come 100 times a second): measure over longer
        self._last_cpu = (total, idle)
        if last is None:
            return None
        return round(100.0 * (1.0 - (idle - last[1]) / (total - last[0])), 1)

    def _proc_meminfo(self) -> dict[str, float]:
        out: dict[str, float] = {}
        try:
            with open(f"{self.proc}/meminfo", encoding="ascii") as fh:
                for line in fh:
                    name, _, rest = line.partition(":")
                    parts = rest.split()
                    if parts and parts[0].isdigit():
                        out[name.strip()] = float(parts[0])  # KiB
        except OSError:
            pass
        return out


# --- the GPUs ------------------------------------------------------------------------------------


class NvmlProbe:
    """Every GPU's readings through NVML; `open` returns None without a driver or without NVML."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        count = _attempt(nvml.nvmlDeviceGetCount) or 0
        handles = [_attempt(nvml.nvmlDeviceGetHandleByIndex, i) for i in range(count)]
        self.handles = [h for h in handles if h is not None]
        self.devices: list[dict[str, Any]] = [
            {
                "index": i,
                "name": _text(_attempt(nvml.nvmlDeviceGetName, h)) or "unknown",
                "uuid": _text(_attempt(nvml.nvmlDeviceGetUUID, h)),
            }
            for i, h in enumerate(self.handles)
        ]
        self.driver = _text(_attempt(nvml.nvmlSystemGetDriverVersion))
        self.events = _attempt(nvml.nvmlEventSetCreate)
        if self.events is not None:
            for handle in self.handles:
                # Not every board reports XIDs as events (consumer cards, some drivers): those are
                # then simply never seen, as nvidia-smi would not see them either.
                _attempt(
                    nvml.nvmlDeviceRegisterEvents, handle, nvml.nvmlEventTypeXidCriticalError, self.events
                )

    @classmethod
    def open(cls, nvml: Any = None) -> NvmlProbe | None:
        nvml = nvml if nvml is not None else import_nvml()
        if nvml is None:
            return None
        try:
            nvml.nvmlInit()
        except Exception:  # no driver, no device
            return None
        return cls(nvml)

    def close(self) -> None:
        if self.events is not None:
            _attempt(self.nvml.nvmlEventSetFree, self.events)
        _attempt(self.nvml.nvmlShutdown)

    def sample(self) -> list[Sample]:
        xids = self._xids()
        return [self._device(i, h, xids.get(i, [])) for i, h in enumerate(self.handles)]

    def _device(self, index: int, handle: Any, xids: list[int]) -> Sample:
        nvml = self.nvml
        out: Sample = {"index": index}
        rates = _attempt(nvml.nvmlDeviceGetUtilizationRates, handle)
        if rates is not None:
            out["utilization_pct"], out["memory_utilization_pct"] = float(rates.gpu), float(rates.memory)
        memory = _attempt(nvml.nvmlDeviceGetMemoryInfo, handle)
        if memory is not None:
            out["memory_used_mb"] = round(memory.used / 2**20, 1)
            out["memory_total_mb"] = round(memory.total / 2**20, 1)
        readings: dict[str, Callable[[], float]] = {
            "temperature_c": lambda: float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
            "power_w": lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
            "sm_clock_mhz": lambda: float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
            "memory_clock_mhz": lambda: float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM)),
            "ecc_corrected": lambda: float(
                nvml.nvmlDeviceGetTotalEccErrors(
                    handle, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_VOLATILE_ECC
                )
            ),
            "ecc_uncorrected": lambda: float(
                nvml.nvmlDeviceGetTotalEccErrors(
                    handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
                )
            ),
        }
        for name, read in readings.items():
            value = _attempt(read)
            if value is not None:
                out[name] = round(value, 1)
        if xids:
            out["xids"] = xids
        return out

    def _xids(self) -> dict[int, list[int]]:
        """XID events since the last sample, by device index (the set is drained without waiting)."""
        found: dict[int, list[int]] = {}
        if self.events is None:
            return found
        for _ in range(1000):  # a storm of events must not stall the sampler
            event = _attempt(self.nvml.nvmlEventSetWait_v2, self.events, 0)
            if event is None:
                break  # NVMLError_Timeout: nothing pending
            # Handles are ctypes pointers, equal only to themselves: the UUID says which board.
            uuid = _text(_attempt(self.nvml.nvmlDeviceGetUUID, event.device))
            index = next(
                (int(d["index"]) for d in self.devices if uuid is not None and d["uuid"] == uuid), -1
            )
            found.setdefault(index, []).append(int(event.eventData))
        return found


# --- the sampler thread --------------------------------------------------------------------------


class Sampler:
    """Samples the host (and GPUs, with `gpus`) every `interval_s` in a thread, from `start` to `stop`.

    Each sample is ``{"t": seconds since start, <host readings>, "gpus": [<per device>]}``.
    """

    def __init__(
        self,
        interval_s: float,
        host: HostProbe | None = None,
        gpus: NvmlProbe | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"a sampling interval must be above 0 seconds; got {interval_s!r}")
        self.interval_s = interval_s
        self.host = host if host is not None else HostProbe()
        self.gpus = gpus
        self.clock = clock
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="flaketriage-sampler", daemon=True)
        self._started = 0.0

    def __enter__(self) -> Sampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._started = self.clock()
        self._thread.start()

    def stop(self) -> list[Sample]:
        """Stop (after one last sample) and return the series."""
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join()
        return self.samples

    def _loop(self) -> None:
        due = self._started
        while True:
            self.samples.append(self._take())
            due += self.interval_s
            if self._stop.wait(max(0.0, due - self.clock())):
                self.samples.append(self._take())
                return

    def _take(self) -> Sample:
        sample: Sample = {"t": round(self.clock() - self._started, 3), **self.host.sample()}
        if self.gpus is not None:
            sample["gpus"] = self.gpus.sample()
        return sample


# --- what a series says --------------------------------------------------------------------------


def _stats(values: Sequence[float]) -> dict[str, float]:
    return {
        "min": round(min(values), 2),
        "mean": round(sum(values) / len(values), 2),
        "max": round(max(values), 2),
    }


def summarize(
    samples: Sequence[Mapping[str, Any]],
    *,
    interval_s: float,
    host_source: str,
    devices: Sequence[Mapping[str, Any]] = (),
    driver: str | None = None,
) -> dict[str, Any]:
    """Min, mean and max of every reading over the series; ECC counts as the increase over the run
    (they count since the driver loaded), XIDs as the list seen."""
    summary: dict[str, Any] = {
        "samples": len(samples),
        "interval_s": interval_s,
        "duration_s": round(float(samples[-1]["t"]) if samples else 0.0, 3),
        "host_source": host_source,
        "host": {},
        "gpus": [],
        "driver": driver,
    }
    for name in ("cpu_pct", "load1", "mem_used_mb", "mem_available_mb"):
        values = [float(s[name]) for s in samples if name in s]
        if values:
            summary["host"][name] = _stats(values)
    for device in devices:
        index = device["index"]
        readings = [g for s in samples for g in s.get("gpus", ()) if g.get("index") == index]
        entry: dict[str, Any] = dict(device)
        for name in (
            "utilization_pct",
            "memory_utilization_pct",
            "memory_used_mb",
            "temperature_c",
            "power_w",
            "sm_clock_mhz",
            "memory_clock_mhz",
        ):
            values = [float(g[name]) for g in readings if name in g]
            if values:
                entry[name] = _stats(values)
        for name in ("ecc_corrected", "ecc_uncorrected"):
            values = [float(g[name]) for g in readings if name in g]
            if values:
                entry[name] = round(values[-1] - values[0], 1)
        entry["xids"] = [x for g in readings for x in g.get("xids", ())]
        summary["gpus"].append(entry)
    return summary


def summary_lines(telemetry: Mapping[str, Any]) -> list[str]:
    """A telemetry run as plain lines: what was sampled, the host, each GPU, and its objects."""
    summary = telemetry.get("summary") or {}
    gpus = summary.get("gpus") or []
    lines = [
        f"{summary.get('samples', 0)} samples every {summary.get('interval_s', 0):g} s over "
        f"{summary.get('duration_s', 0):.1f} s (host through {summary.get('host_source', '?')}; "
        + (f"{len(gpus)} GPU(s) through NVML)" if gpus else "no GPU seen through NVML)")
    ]
    host = summary.get("host") or {}
    parts = []
    if "cpu_pct" in host:
        parts.append(f"CPU mean {host['cpu_pct']['mean']:.0f}%, peak {host['cpu_pct']['max']:.0f}%")
    if "load1" in host:
        parts.append(f"load peak {host['load1']['max']:.2f}")
    if "mem_available_mb" in host:
        parts.append(f"memory available at least {host['mem_available_mb']['min']:.0f} MiB")
    if parts:
        lines.append("Host: " + "; ".join(parts))
    for gpu in gpus:
        lines.append(_gpu_line(gpu))
    series = telemetry.get("series")
    if series:
        lines.append(f"Time series: store object {series['object']} (JSON Lines, one sample a line)")
    profile = telemetry.get("profile")
    if profile:
        lines.append(f"Profile ({profile['tool']}, {profile['format']}): store object {profile['object']}")
    elif telemetry.get("profile_note"):
        lines.append(f"Profile: none ({telemetry['profile_note']})")
    return lines


def _gpu_line(gpu: Mapping[str, Any]) -> str:
    parts = []
    for name, label, unit in (
        ("utilization_pct", "utilization", "%"),
        ("memory_used_mb", "memory used", " MiB"),
        ("temperature_c", "temperature", " °C"),
        ("power_w", "power", " W"),
    ):
        if name in gpu:
            parts.append(f"{label} mean {gpu[name]['mean']:.0f}{unit}, peak {gpu[name]['max']:.0f}{unit}")
    for name, label in (("sm_clock_mhz", "SM clock"), ("memory_clock_mhz", "memory clock")):
        if name in gpu:
            parts.append(f"{label} {gpu[name]['min']:.0f}–{gpu[name]['max']:.0f} MHz")
    if "ecc_corrected" in gpu or "ecc_uncorrected" in gpu:
        parts.append(
            f"new ECC errors {gpu.get('ecc_corrected', 0):.0f} corrected, "
            f"{gpu.get('ecc_uncorrected', 0):.0f} uncorrected"
        )
    xids = gpu.get("xids") or []
    parts.append(f"XID errors {', '.join(str(x) for x in xids)}" if xids else "no XID errors")
    uuid = f", {gpu['uuid']}" if gpu.get("uuid") else ""
    name = f"GPU {gpu.get('index')} ({gpu.get('name', 'unknown')}{uuid})"
    return f"{name}: " + "; ".join(parts)
