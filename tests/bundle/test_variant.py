"""The variant a bundle was captured on: the strings `current_variant` gives on that machine."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

import pytest

from flaketriage.bundle.io import load_manifest
from flaketriage.bundle.manifest import GPU, Hardware, Manifest
from flaketriage.bundle.variant import variant_of_manifest
from flaketriage.capture.record import CaptureRequest, run_and_capture
from flaketriage.capture.source import SourceLimits
from flaketriage.ci.quarantine_list import run_variant
from flaketriage.process.nvidia import import_nvml, read_gpus
from flaketriage.settings import Settings
from flaketriage.store import LocalStore
from flaketriage.variant import current_variant, gpu_model_of, os_of_platform


def _capture(tmp_path: Path, env: dict[str, str]) -> Manifest:
    store = LocalStore(tmp_path / "store")
    (tmp_path / "project").mkdir(exist_ok=True)
    request = CaptureRequest(
        argv=[sys.executable, "-c", "raise SystemExit(3)"],
        cwd=tmp_path / "project",
        limits=SourceLimits.from_settings(Settings()),
        echo=False,
        env=env,
    )
    result = run_and_capture(store, request)
    assert result.bundle_id is not None
    return load_manifest(store, result.bundle_id)


def _plain_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("FLAKETRIAGE_")}


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Manifest:
    return _capture(tmp_path_factory.mktemp("variant"), _plain_env())


def test_a_bundle_captured_here_names_the_variant_this_machine_runs(captured: Manifest) -> None:
    here = run_variant(_plain_env())
    assert variant_of_manifest(captured) == here
    gpus, _, _ = read_gpus(import_nvml())
    assert here == current_variant({}, gpu_model_of(g.name for g in gpus))
    assert set(here) == {"os", "python", "gpu"}


def test_what_the_runner_states_for_itself_is_recorded_and_read_back(tmp_path: Path) -> None:
    env = {**_plain_env(), "FLAKETRIAGE_GPU": "NVIDIA A100-SXM4-80GB", "FLAKETRIAGE_VARIANT": "shard=2"}
    manifest = _capture(tmp_path, env)
    assert variant_of_manifest(manifest) == run_variant(env)
    assert variant_of_manifest(manifest)["gpu"] == "NVIDIA A100-SXM4-80GB"
    assert variant_of_manifest(manifest)["shard"] == "2"


def _with(
    manifest: Manifest, *, hardware: Hardware | None = None, env: dict[str, str] | None = None
) -> Manifest:
    update: dict[str, object] = {}
    if hardware is not None:
        update["hardware"] = hardware
    if env is not None:
        update["command"] = manifest.command.model_copy(update={"env": env})
    return manifest.model_copy(update=update)


def test_the_gpu_is_the_model_none_when_the_probe_found_none_and_unknown_when_never_probed(
    captured: Manifest,
) -> None:
    a100 = GPU(index=0, name="NVIDIA A100-SXM4-80GB")
    two = Hardware(cpu_count=8, gpus=(a100, a100.model_copy(update={"index": 1})))
    mixed = Hardware(cpu_count=8, gpus=(a100, GPU(index=1, name="NVIDIA H100 80GB HBM3")))
    env: dict[str, str] = {}
    assert variant_of_manifest(_with(captured, hardware=two, env=env))["gpu"] == "NVIDIA A100-SXM4-80GB"
    assert variant_of_manifest(_with(captured, hardware=mixed, env=env))["gpu"] == (
        "NVIDIA A100-SXM4-80GB + NVIDIA H100 80GB HBM3"
    )
    assert variant_of_manifest(_with(captured, hardware=Hardware(cpu_count=8), env=env))["gpu"] == "none"
    assert "gpu" not in variant_of_manifest(_with(captured, hardware=Hardware(), env=env))


def test_a_bad_recorded_variant_is_left_out(captured: Manifest) -> None:
    manifest = _with(captured, env={"FLAKETRIAGE_VARIANT": "not a pair", "FLAKETRIAGE_GPU": ""})
    assert variant_of_manifest(manifest) == {
        "gpu": "none",
        "os": current_variant({})["os"],
        "python": current_variant({})["python"],
    }


@pytest.mark.parametrize(
    ("text", "os_name"),
    [
        ("Linux-6.8.0-45-generic-x86_64-with-glibc2.39", "linux"),
        ("macOS-14.4.1-arm64-arm-64bit", "macos"),
        ("Darwin-19.6.0-x86_64-i386-64bit", "macos"),
        ("Windows-11-10.0.22631-SP0", "windows"),
        ("CYGWIN_NT-10.0-19045-3.5.3-1.x86_64-x86_64-64bit-WindowsPE", "windows"),
        ("FreeBSD-14.0-RELEASE-amd64-64bit-ELF", "freebsd"),
        ("unknown", None),
        ("", None),
    ],
)
def test_the_os_of_a_platform_string_is_the_one_sys_platform_gives_there(
    text: str, os_name: str | None
) -> None:
    assert os_of_platform(text) == os_name


def test_the_os_of_this_platform_is_this_machines() -> None:
    assert os_of_platform(platform.platform()) == current_variant({})["os"]
