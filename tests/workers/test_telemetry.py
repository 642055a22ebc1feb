"""Telemetry runs: host samples for real (psutil and /proc), NVML samples through the real `pynvml`
module with its functions replaced (no GPU here), the time series and a real profile stored as
objects, the summary in the report, the CLI command and the service's scheduled run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from flaketriage.bundle.io import load_manifest
from flaketriage.capture.record import CaptureRequest, run_and_capture
from flaketriage.capture.source import SourceLimits
from flaketriage.records import Case, Work
from flaketriage.store import LocalStore
from flaketriage.workers.attribution import RunnerIdentity
from flaketriage.workers.replay import ReplayContext, Replayer
from flaketriage.workers.report.render import render_issue
from flaketriage.workers.samplers import HostProbe, NvmlProbe, Sampler, summarize, summary_lines
from flaketriage.workers.sandbox import ProcessSandbox
from flaketriage.workers.telemetry import TelemetryRun, telemetry_policy, uses_torch
from flaketriage.workers.upkeep import Upkeep
from flaketriage.workers.verdict import VerdictPolicy
from tests.workers.service_world import World, make_world

# Fails only while the flag file exists: captured failing, replayed passing (not reproduced).
ONLY_WITH_FLAG = """\
import os, sys, time
# Busy long enough for a sampling profiler to see it even on a loaded machine.
end = time.perf_counter() + 0.2
while time.perf_counter() < end:
    pass
if os.path.exists(sys.argv[1] if len(sys.argv) > 1 else "FLAG"):
    raise RuntimeError("only while the flag is up")
"""

QUICK = VerdictPolicy(min_rate=0.4, max_rate=0.5, max_replays=20, flaky_rate_replays=0)  # 6 clean replays


# -- NVML through pynvml, function by function ----------------------------------------------------
@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """Two GPUs behind the real pynvml module, its functions replaced: GPU 1 reports no ECC counts
    (NotSupported), and one XID 79 event (fell off the bus) is pending on GPU 0."""
    import pynvml

    state = SimpleNamespace(calls=0, events=[79], freed=False, shut=False)
    handles = ["handle-0", "handle-1"]

    def not_supported(*_: Any) -> Any:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def utilization(handle: str) -> Any:
        state.calls += 1
        return SimpleNamespace(gpu=50 + 10 * handles.index(handle) + state.calls % 2, memory=30)

    def ecc(handle: str, kind: int, counter: int) -> int:
        if handle == "handle-1":
            not_supported()
        return 3 + state.calls if kind == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else 0

    def wait(event_set: Any, timeout_ms: int) -> Any:
        assert timeout_ms == 0  # never blocks the sampler
        if not state.events:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        return SimpleNamespace(device="handle-0", eventData=state.events.pop(), eventType=8)

    patches = {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: setattr(state, "shut", True),
        "nvmlDeviceGetCount": lambda: 2,
        "nvmlDeviceGetHandleByIndex": lambda i: handles[i],
        "nvmlDeviceGetName": lambda h: b"NVIDIA H100 80GB HBM3",
        "nvmlDeviceGetUUID": lambda h: f"GPU-{handles.index(h)}aaa-bbbb",
        "nvmlSystemGetDriverVersion": lambda: b"550.54.15",
        "nvmlSystemGetCudaDriverVersion": lambda: 12040,
        "nvmlDeviceGetUtilizationRates": utilization,
        "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(
            total=80 * 2**30, used=(10 + state.calls) * 2**30
        ),
        "nvmlDeviceGetTemperature": lambda h, sensor: 60 + state.calls % 5,
        "nvmlDeviceGetPowerUsage": lambda h: 300_000,
        "nvmlDeviceGetClockInfo": lambda h, clock: 1980 if clock == pynvml.NVML_CLOCK_SM else 2619,
        "nvmlDeviceGetTotalEccErrors": ecc,
        "nvmlDeviceGetAttributes": not_supported,
        "nvmlEventSetCreate": lambda: "event-set",
        "nvmlDeviceRegisterEvents": lambda h, kinds, event_set: None,
        "nvmlEventSetWait_v2": wait,
        "nvmlEventSetFree": lambda event_set: setattr(state, "freed", True),
    }
    for name, fn in patches.items():
        assert hasattr(pynvml, name), f"pynvml has no {name}: the stand-in must speak the real interface"
        monkeypatch.setattr(pynvml, name, fn)
    return state


def test_nvml_samples_every_reading_a_device_supports(fake_nvml: SimpleNamespace) -> None:
    probe = NvmlProbe.open()
    assert probe is not None
    assert probe.driver == "550.54.15" and [d["uuid"] for d in probe.devices] == [
        "GPU-0aaa-bbbb",
        "GPU-1aaa-bbbb",
    ]
    first, second = probe.sample()
    assert first["xids"] == [79] and "xids" not in second
    assert {"utilization_pct", "memory_used_mb", "temperature_c", "power_w", "sm_clock_mhz"} <= set(first)
    assert first["power_w"] == 300.0 and first["sm_clock_mhz"] == 1980 and first["memory_clock_mhz"] == 2619
    assert "ecc_corrected" in first and "ecc_corrected" not in second  # NotSupported: left out
    assert "xids" not in probe.sample()[0]  # each event is reported once
    probe.close()
    assert fake_nvml.freed and fake_nvml.shut


def test_without_a_driver_there_is_no_gpu_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml

    def no_driver() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    assert NvmlProbe.open() is None


# -- the host, for real ---------------------------------------------------------------------------
@pytest.mark.parametrize("use_psutil", [True, False], ids=["psutil", "proc"])
def test_the_sampler_samples_the_host_at_a_fixed_interval(use_psutil: bool) -> None:
    host = HostProbe(use_psutil=use_psutil)
    assert host.source == ("psutil" if use_psutil else "proc")
    with Sampler(0.05, host=host) as sampler:
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # something to measure
        time.sleep(0.5)
        busy.kill()
        busy.wait()
    samples = sampler.samples
    assert 7 <= len(samples) <= 13, [s["t"] for s in samples]
    times = [s["t"] for s in samples[:-1]]  # the last is taken at stop
    # On a fixed schedule: never early, and a late sample does not push the later ones back.
    assert all(t >= 0.05 * i - 0.002 for i, t in enumerate(times)), times
    assert times[-1] < 0.05 * (len(times) - 1) + 0.1, times
    later = samples[1:]
    # /proc counts CPU time in clock ticks (100 a second): a 50 ms sample may see none, and waits.
    cpu = [s["cpu_pct"] for s in later if "cpu_pct" in s]
    assert len(cpu) >= len(later) // 2 and all(0 <= c <= 100 for c in cpu) and max(cpu) > 20
    assert all(s["mem_available_mb"] > 0 and s["mem_used_mb"] > 0 and "load1" in s for s in later)


def test_cpu_use_from_proc_is_the_busy_share_between_samples(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text("MemTotal:  4194304 kB\nMemAvailable: 1048576 kB\n")
    (tmp_path / "stat").write_text("cpu  100 0 100 700 100 0 0 0 0 0\n")
    host = HostProbe(use_psutil=False, proc=str(tmp_path))
    # 400 more ticks, of which 100 idle and 0 iowait: 75% busy.
    (tmp_path / "stat").write_text("cpu  300 0 200 800 100 0 0 0 0 0\n")
    sample = host.sample()
    assert sample["cpu_pct"] == 75.0
    assert (sample["mem_used_mb"], sample["mem_available_mb"]) == (3072.0, 1024.0)


def test_a_summary_reduces_the_series_and_says_what_it_saw(fake_nvml: SimpleNamespace) -> None:
    probe = NvmlProbe.open()
    assert probe is not None
    with Sampler(0.02, gpus=probe) as sampler:
        time.sleep(0.15)
    summary = summarize(
        sampler.samples, interval_s=0.02, host_source="psutil", devices=probe.devices, driver=probe.driver
    )
    gpu0, gpu1 = summary["gpus"]
    assert gpu0["xids"] == [79] and gpu1["xids"] == []
    assert gpu0["utilization_pct"]["min"] <= gpu0["utilization_pct"]["mean"] <= gpu0["utilization_pct"]["max"]
    assert gpu0["ecc_corrected"] > 0 and "ecc_corrected" not in gpu1
    lines = summary_lines({"summary": summary, "series": {"object": "ab" * 32}, "profile": None})
    text = "\n".join(lines)
    assert "2 GPU(s) through NVML" in text and "XID errors 79" in text and "GPU-0aaa-bbbb" in text
    assert "ab" * 32 in text
    probe.close()


# -- a telemetry run ------------------------------------------------------------------------------
@pytest.fixture
def flagged(tmp_path: Path) -> Iterator[tuple[LocalStore, str, Path]]:
    """A bundle that failed when captured and passes on every replay (its flag file is gone)."""
    store = LocalStore(tmp_path / "store")
    project = tmp_path / "project"
    project.mkdir()
    (project / "job.py").write_text(ONLY_WITH_FLAG)
    flag = tmp_path / "flag"
    flag.write_text("up")
    result = run_and_capture(
        store,
        CaptureRequest(
            argv=[sys.executable, "job.py", str(flag)],
            cwd=project,
            limits=SourceLimits(1 << 20, 1 << 24),
            echo=False,
        ),
    )
    assert result.bundle_id is not None
    flag.unlink()
    yield store, result.bundle_id, tmp_path


def _context(tmp_path: Path) -> ReplayContext:
    process = ReplayContext.from_process()
    return ReplayContext(base_env=process.base_env, temp_root=tmp_path / "replays", git=process.git)


def test_a_telemetry_run_stores_its_series_and_a_py_spy_profile(
    flagged: tuple[LocalStore, str, Path], fake_nvml: SimpleNamespace
) -> None:
    store, bundle, tmp_path = flagged
    manifest = load_manifest(store, bundle)
    with Replayer(store, manifest, ProcessSandbox(), context=_context(tmp_path)) as replayer:
        result = TelemetryRun(store, replayer, QUICK, interval_s=0.05).run()
    assert result.verdict.verdict == "not_reproduced" and result.verdict.replays == 6
    telemetry = result.telemetry
    assert telemetry is not None
    raw = store.get_bytes(telemetry["series"]["object"]).decode()
    samples = [json.loads(line) for line in raw.splitlines()]
    assert len(samples) == telemetry["summary"]["samples"] >= 3
    assert all(len(s["gpus"]) == 2 for s in samples) and samples[0]["gpus"][0]["xids"] == [79]
    profile = telemetry["profile"]
    assert profile is not None and (profile["tool"], profile["format"]) == ("py-spy", "speedscope")
    speedscope = json.loads(store.get_bytes(profile["object"]))
    assert "speedscope" in speedscope["$schema"] and speedscope["profiles"]
    frames = {frame["name"] for frame in speedscope["shared"]["frames"]}
    assert "<module>" in frames  # the replayed program itself, not only py-spy
    # The result round-trips, and the report summarizes it.
    again = type(result).from_json(json.loads(json.dumps(result.to_json())))
    assert again.telemetry == telemetry
    draft = render_issue(store, manifest, bundle, result.verdict, telemetry=telemetry)
    assert "## Telemetry run" in draft.body and "XID errors 79" in draft.body
    assert profile["object"] in draft.body and telemetry["series"]["object"] in draft.body


def test_without_py_spy_the_run_says_why_it_has_no_profile(
    flagged: tuple[LocalStore, str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, bundle, tmp_path = flagged
    without = [d for d in os.environ["PATH"].split(os.pathsep) if not (Path(d) / "py-spy").exists()]
    monkeypatch.setenv("PATH", os.pathsep.join(without))
    manifest = load_manifest(store, bundle)
    with Replayer(store, manifest, ProcessSandbox(), context=_context(tmp_path)) as replayer:
        result = TelemetryRun(store, replayer, QUICK, interval_s=0.05).run()
    assert result.telemetry is not None and result.telemetry["profile"] is None
    assert "py-spy is not installed" in result.telemetry["profile_note"]
    # No GPU and no NVML driver here: the host alone is sampled, and the summary says so.
    assert result.telemetry["summary"]["gpus"] == []
    assert "no GPU seen through NVML" in summary_lines(result.telemetry)[0]


def test_a_bundle_that_uses_torch_is_profiled_by_the_torch_profiler(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    project = tmp_path / "project"
    project.mkdir()
    flag = tmp_path / "flag"
    flag.write_text("up")
    (project / "job.py").write_text(
        "import os, sys, torch\nx = torch.ones(64, 64)\nfor _ in range(3):\n    x = x @ x / 64\n"
        "if os.path.exists(sys.argv[1]):\n    raise RuntimeError('only while the flag is up')\n"
    )
    result = run_and_capture(
        store,
        CaptureRequest(
            argv=[sys.executable, "job.py", str(flag)],
            cwd=project,
            limits=SourceLimits(1 << 20, 1 << 24),
            echo=False,
        ),
    )
    assert result.bundle_id is not None, result.process.stderr
    flag.unlink()
    manifest = load_manifest(store, result.bundle_id)
    assert uses_torch(manifest)
    policy = VerdictPolicy(max_replays=1)  # one replay (undecided): the profile is what is tested
    with Replayer(store, manifest, ProcessSandbox(), context=_context(tmp_path)) as replayer:
        telemetry = TelemetryRun(store, replayer, policy, interval_s=0.1).run().telemetry
    assert telemetry is not None
    profile = telemetry["profile"]
    assert profile is not None and (profile["tool"], profile["format"]) == ("torch.profiler", "chrome-trace")
    trace = json.loads(store.get_bytes(profile["object"]))
    names = {event.get("name", "") for event in trace["traceEvents"]}
    assert any("matmul" in name or "mm" in name for name in names), sorted(names)[:20]


def test_telemetry_looks_for_rarer_flakes_with_more_replays() -> None:
    base = VerdictPolicy()
    longer = telemetry_policy(base, 3.0)
    assert (base.not_reproduced_after, longer.not_reproduced_after) == (59, 179)
    assert longer.max_replays == 300 and longer.alpha == base.alpha and longer.max_rate == base.max_rate


# -- the CLI ---------------------------------------------------------------------------------------
def test_the_telemetry_command_runs_one_locally(flagged: tuple[LocalStore, str, Path]) -> None:
    store, bundle, tmp_path = flagged
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLAKETRIAGE_")}
    env["TMPDIR"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "flaketriage", "telemetry", bundle[:12], "--store", str(store.root),
         "--sandbox", "process", "--factor", "1", "--max-replays", "8", "--interval", "0.1", "--json"],
        capture_output=True, text=True, timeout=300, check=False, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout.splitlines()[-1])
    assert data["verdict"] == "not_reproduced" and data["replays"] == 8 and not data["decided"]
    assert data["telemetry"]["summary"]["samples"] >= 2
    assert store.has(data["telemetry"]["series"]["object"])
    assert data["telemetry"]["profile"] is not None, data["telemetry"]["profile_note"]
    assert data["telemetry"]["profile"]["tool"] == "py-spy" and store.has(
        data["telemetry"]["profile"]["object"]
    )
    text = subprocess.run(
        [sys.executable, "-m", "flaketriage", "telemetry", bundle[:12], "--store", str(store.root),
         "--sandbox", "process", "--factor", "1", "--max-replays", "3", "--interval", "0.1", "--no-profile"],
        capture_output=True, text=True, timeout=300, check=False, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert text.returncode == 0, text.stderr
    assert "not_reproduced: reproduced 0 of 3 replays" in text.stdout
    assert "samples every 0.1 s" in text.stdout and "Profile: none (not asked for)" in text.stdout


def test_a_bad_interval_is_refused_before_anything_runs(flagged: tuple[LocalStore, str, Path]) -> None:
    store, bundle, tmp_path = flagged
    done = subprocess.run(
        [sys.executable, "-m", "flaketriage", "telemetry", bundle, "--store", str(store.root),
         "--interval", "0"],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2 and "--interval" in done.stderr


# -- the service ----------------------------------------------------------------------------------
@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    made = make_world(
        tmp_path,
        [RunnerIdentity(host="worker-1")],
        min_flaky_rate=0.4,
        telemetry_replays_factor=1.0,
        telemetry_interval_s=0.05,
    )
    yield made
    made.close()


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory replays can read: the process sandbox gives each replay a private /tmp."""
    path = Path(tempfile.mkdtemp(prefix="flaketriage-test-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_the_beat_schedules_telemetry_runs_that_use_the_telemetry_module(
    world: World, shared_dir: Path
) -> None:
    flag = shared_dir / "flag"
    flag.write_text("up")
    bundle = world.capture(
        ONLY_WITH_FLAG.replace('sys.argv[1] if len(sys.argv) > 1 else "FLAG"', repr(str(flag)))
    )
    flag.unlink()
    case_id = world.announce(bundle)
    world.drive()
    assert world.case(case_id).verdict == "not_reproduced"
    upkeep = Upkeep(world.envs[0])
    assert upkeep.schedule_telemetry() == 1
    assert upkeep.schedule_telemetry() == 0  # once per case and generation

    flag.write_text("up")  # whatever hid the failure is back during the telemetry run
    world.drive()
    telemetry_work = next(w for w in world.works(case_id) if w.step == "telemetry")
    result = telemetry_work.result
    assert telemetry_work.status == "done" and result is not None
    assert result["verdict"] == "deterministic" and result["state"] == "deterministic after 5 replays"
    assert world.store.has(result["telemetry"]["series"]["object"])
    assert result["telemetry"]["profile"]["tool"] == "py-spy"
    # Reproduced: reported like a triage's verdict, the telemetry in the issue.
    case = world.case(case_id)
    assert (case.status, case.verdict) == ("reported", "deterministic")
    issue = next(iter(world.sink.issues.values()))
    assert "## Telemetry run" in issue.body and result["telemetry"]["series"]["object"] in issue.body
    # The runner that ran it is on record, with the replays it ran.
    runner = world.runners()["worker-1"]
    assert runner.replays >= result["replays"]


def test_a_telemetry_run_on_gpus_is_scheduled_on_the_gpu_queue(world: World) -> None:
    from flaketriage.bundle.manifest import GPU, Hardware

    bundle = world.capture("raise SystemExit(3)\n")
    manifest = load_manifest(world.store, bundle)
    on_gpu = manifest.model_copy(
        update={"hardware": Hardware(host="gpu-box", gpus=(GPU(index=0, name="H100"),))}
    )
    from flaketriage.bundle.io import write_bundle

    gpu_bundle = write_bundle(world.store, on_gpu)
    case_id = world.announce(gpu_bundle)
    world.sender.take()
    triage_id = world.works(case_id)[0].id
    with world.database.session() as s:
        case = s.get_one(Case, case_id)
        case.verdict, case.status = "not_reproduced", "decided"
        s.get_one(Work, triage_id).status = "done"
    assert Upkeep(world.envs[0]).schedule_telemetry() == 1
    sent = world.sender.take()
    assert [queue for _, _, queue in sent] == ["gpu"]
