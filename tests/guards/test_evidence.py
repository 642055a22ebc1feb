"""A trip captures a bundle the core loop replays to the same failure."""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
import torch

from flaketriage.bundle.io import load_manifest
from flaketriage.failure.tracebacks import parse_python_traceback
from flaketriage.guards import CaptureOptions, DatasetFile, NumericFault
from flaketriage.store import LocalStore

if TYPE_CHECKING:
    from conftest import Loop  # tests/ci/guards/conftest.py

Loops = Callable[..., "Loop"]


def test_a_trip_captures_a_bundle_with_its_evidence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, loop: Loops
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("# the training script\n")
    rows = np.arange(64 * 8, dtype=np.float32).reshape(64, 8)
    (tmp_path / "data").mkdir()
    np.save(tmp_path / "data" / "train.npy", rows)
    store = LocalStore(tmp_path / "store")
    run = loop(
        capture=CaptureOptions(
            store=store, checkpoint=True, data=DatasetFile("data/train.npy"), seeds={"numpy": 7}
        )
    )
    run.poison[2] = math.nan
    with pytest.raises(NumericFault) as caught:
        run.run(5)
    fault = caught.value
    assert fault.bundle_id is not None and fault.bundle_id == run.guard.bundle_id
    m = load_manifest(store, fault.bundle_id)
    assert m.kind == "training" and m.command.argv[0] == sys.executable
    assert m.failure.exception_type == "flaketriage.errors.NumericFault"
    assert m.failure.message == str(fault)
    assert m.annotations["guard"]["step"] == 2 and m.annotations["guard"]["batch_indices"] == list(
        range(32, 48)
    )
    assert m.seeds.values == {"torch": torch.initial_seed(), "numpy": 7}
    # the data slice: the failing batch's rows, restored at the dataset's path
    (data,) = m.data
    assert (data.path, data.format, data.items, data.reducible) == ("data/train.npy", "npy", 16, True)
    assert data.blob is not None
    sliced = np.load(io.BytesIO(store.get_bytes(data.blob.sha256)))
    assert np.array_equal(sliced, rows[32:48])
    stats = json.loads(store.get_bytes(m.attachments["guard/stats.json"].sha256))
    assert stats["trips"][0]["check"] == "loss_nonfinite" and [r["step"] for r in stats["history"]] == [
        0,
        1,
        2,
    ]
    rng = json.loads(store.get_bytes(m.attachments["guard/rng_state.json"].sha256))
    assert set(rng) >= {"python", "numpy", "torch"} and rng["torch"]["initial_seed"] == torch.initial_seed()
    assert m.checkpoint is not None
    state = torch.load(io.BytesIO(store.get_bytes(m.checkpoint.sha256)), weights_only=True)
    assert state["step"] == 2 and set(state) >= {"model", "optimizer"}
    assert [f.path for f in m.source.files] == ["data/train.npy", "train.py"]


def test_the_recorded_fingerprint_is_the_one_of_the_printed_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, loop: Loops
) -> None:
    monkeypatch.chdir(tmp_path)
    store = LocalStore(tmp_path / "store")
    run = loop(capture=CaptureOptions(store=store))
    run.poison[4] = math.inf
    with pytest.raises(NumericFault) as caught:
        run.run(6)
    assert caught.value.bundle_id is not None
    recorded = load_manifest(store, caught.value.bundle_id).failure
    assert recorded.traceback is not None
    parsed = parse_python_traceback(recorded.traceback)
    printed = parse_python_traceback("".join(traceback.format_exception(caught.value)))
    assert parsed is not None and printed is not None
    assert (parsed.exception_type, parsed.message) == (printed.exception_type, printed.message)
    # what Python prints from this test down is the tail of what was recorded, frame for frame
    tail = [(f.filename, f.function) for f in parsed.frames][-len(printed.frames) :]
    assert tail == [(f.filename, f.function) for f in printed.frames]


def test_only_the_first_trip_is_captured_and_capture_errors_never_hide_the_fault(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, loop: Loops
) -> None:
    monkeypatch.chdir(tmp_path)
    run = loop(capture=CaptureOptions(store=tmp_path / "store"), policy="warn")
    run.poison[1] = math.nan
    run.run(4)
    assert len(run.guard.trips) > 1 and run.guard.bundle_id is not None
    assert len(list(LocalStore(tmp_path / "store").list_refs("bundles/"))) == 1
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    run = loop(capture=CaptureOptions(store=blocked / "store"))
    run.poison[1] = math.nan
    with pytest.raises(NumericFault) as caught:
        run.run(3)
    assert caught.value.bundle_id is None and "could not capture a bundle" in caplog.text


def test_full_dataset_with_the_batch_attached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, loop: Loops
) -> None:
    monkeypatch.chdir(tmp_path)
    lines = [json.dumps({"x": i}) + "\n" for i in range(100)]
    (tmp_path / "rows.jsonl").write_text("".join(lines))
    store = LocalStore(tmp_path / "store")
    run = loop(capture=CaptureOptions(store=store, data=DatasetFile("rows.jsonl", restore="full")))
    run.poison[3] = math.nan
    with pytest.raises(NumericFault) as caught:
        run.run(5)
    m = load_manifest(store, str(caught.value.bundle_id))
    assert [(d.path, d.items) for d in m.data] == [("rows.jsonl", 100)]
    batch = store.get_bytes(m.attachments["guard/batch.jsonl"].sha256).decode()
    assert batch == "".join(lines[48:64])


TRAIN = """
import argparse
import numpy as np
import torch
from flaketriage.guards import CaptureOptions, DatasetFile, NumericGuard

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()
torch.manual_seed(0)
data = torch.from_numpy(np.load("data/train.npy"))
x, y = data[:, :4], data[:, 4:]
model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
guard = NumericGuard(model, capture=CaptureOptions(data=DatasetFile("data/train.npy")))
for epoch in range(args.epochs):
    order = torch.randperm(len(data))
    for start in range(0, len(data), 8):
        idx = order[start : start + 8]
        loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx])
        guard.check_loss(loss, batch_indices=idx)
        loss.backward()
        guard.after_backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.01 * p.grad
                p.grad = None
        guard.after_step()
print("trained")
"""
# Plain SGD by hand rather than torch.optim: constructing a torch optimizer imports TorchDynamo
# (torch._disable_dynamo), seconds of each of the ~30 runs (the capture, 5 replays for the verdict,
# the rest for minimization) that say nothing about the guard, the capture or the replay.


@pytest.mark.slow
def test_a_training_script_that_trips_replays_deterministically_and_minimizes(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "train.py").write_text(TRAIN)
    (project / ".gitignore").write_text(".flaketriage/\n")
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(64, 5)).astype(np.float32)
    rows[37, 2] = np.nan  # one poisoned sample
    np.save(project / "data" / "train.npy", rows)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLAKETRIAGE_")}
    env["FLAKETRIAGE_STORE"] = str(project / ".flaketriage")

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv, cwd=project, env=env, capture_output=True, text=True, timeout=300, check=False
        )

    trained = run(sys.executable, "train.py")
    assert trained.returncode == 1, trained.stderr
    assert "flaketriage.errors.NumericFault: loss_nonfinite at step" in trained.stderr
    m = load_manifest(LocalStore(project / ".flaketriage"), _bundle_of(trained.stderr))
    assert m.data[0].items == 8 and m.command.argv[1:] == ("train.py",)
    triaged = run(sys.executable, "-m", "flaketriage", "triage", m.bundle_id, "--minimize", "--json")
    assert triaged.returncode == 0, triaged.stderr
    out = json.loads(triaged.stdout.strip().splitlines()[-1])
    assert (out["verdict"], out["replays"], out["failures"]) == ("deterministic", 5, 5), out
    assert out["minimal"]["data"] == {"data/train.npy": {"kept": 1, "of": 8}}
    minimal = load_manifest(LocalStore(project / ".flaketriage"), out["minimal_bundle"])
    (kept,) = minimal.data
    assert kept.blob is not None
    row = np.load(io.BytesIO(LocalStore(project / ".flaketriage").get_bytes(kept.blob.sha256)))
    assert np.isnan(row[0, 2])  # the poisoned sample, and nothing else


def _bundle_of(stderr: str) -> str:
    for line in stderr.splitlines():
        if "captured bundle" in line:
            return line.split("captured bundle ")[1].split()[0]
    raise AssertionError(f"no bundle in:\n{stderr}")


def test_importing_flaketriage_does_not_import_torch() -> None:
    code = (
        "import sys, flaketriage, flaketriage.ci, flaketriage.capture.record, flaketriage.errors, "
        "flaketriage.failure.fingerprint; assert 'torch' not in sys.modules, 'torch was imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_without_torch_the_error_names_the_extra() -> None:
    code = "import sys; sys.modules['torch'] = None; import flaketriage.guards"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 1
    assert "flaketriage.errors.MissingDependencyError" in done.stderr
    assert "pip install 'flaketriage[guards]'" in done.stderr


def test_checkpoint_is_left_out_unless_allowed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, loop: Loops
) -> None:
    monkeypatch.chdir(tmp_path)
    store = LocalStore(tmp_path / "store")
    run = loop(capture=CaptureOptions(store=store))
    run.poison[0] = math.nan
    with pytest.raises(NumericFault) as caught:
        run.run(2)
    m = load_manifest(store, str(caught.value.bundle_id))
    assert m.checkpoint is None and m.data == () and m.annotations["guard"]["checkpoint"] is False
