"""Minimization on real programs: knobs, noise-aware candidates, the minimal bundle."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from flaketriage.bundle.io import load_manifest
from flaketriage.capture.record import CaptureRequest, run_and_capture
from flaketriage.capture.source import SourceLimits
from flaketriage.errors import MinimizeError
from flaketriage.store import LocalStore, Store
from flaketriage.workers.minimize.minimizer import BundleMinimizer, MinimizeResult, find_knobs
from flaketriage.workers.minimize.reducer import SubsetReducer
from flaketriage.workers.replay import ReplayContext, Replayer, Variant
from flaketriage.workers.sandbox import ProcessSandbox
from flaketriage.workers.verdict import Outcome

LIMITS = SourceLimits(max_file_bytes=1 << 20, max_total_bytes=10 << 20)


def test_find_knobs() -> None:
    argv = [
        "python",
        "train.py",
        "--steps",
        "1000",
        "--epochs=5",
        "--seed",
        "42",
        "--lr",
        "0.1",
        "--port=8080",
        "--batch-size",
        "1",
        "-n",
        "7",
        "--name",
        "run12",
    ]
    knobs = {k.flag: (k.value, k.inline) for k in find_knobs(argv)}
    assert knobs == {"--steps": (1000, False), "--epochs": (5, True), "-n": (7, False)}
    steps = next(k for k in find_knobs(argv) if k.flag == "--epochs")
    assert steps.apply(argv, 2)[4] == "--epochs=2"


def _capture(root: Path, script: str, rows: int, tries: int = 30) -> tuple[LocalStore, str]:
    (root / "job.py").write_text(script)
    (root / "rows.jsonl").write_text("".join(f'{{"id": {i}}}\n' for i in range(rows)))
    store = LocalStore(root.parent / "store")
    request = CaptureRequest(
        argv=[sys.executable, "job.py"], cwd=root, limits=LIMITS, data=[Path("rows.jsonl")], echo=False
    )
    for _ in range(tries):
        result = run_and_capture(store, request)
        if result.bundle_id:
            return store, result.bundle_id
    raise AssertionError("never failed")


NOISY = """
import json, random
ids = {json.loads(line)["id"] for line in open("rows.jsonl")}
if 37 in ids and 81 in ids and random.random() < 0.7:
    raise RuntimeError("rows 37 and 81 conflict")
"""


def test_noisy_failure_is_minimized_without_losing_a_culprit(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    root.mkdir()
    store, bundle = _capture(root, NOISY, rows=120)
    manifest = load_manifest(store, bundle)
    with Replayer(store, manifest, ProcessSandbox(), context=ReplayContext.from_process()) as replayer:
        # A search question passes after a few clean runs, a confirmation only after enough that
        # the failure, at the lowest rate 14 reproductions in 20 replays allow, would have shown:
        # more for a smaller accepted error.
        default = BundleMinimizer(store, replayer, bundle, 14, 20).noise
        minimizer = BundleMinimizer(store, replayer, bundle, 14, 20, error=0.001)
        assert 1 < default.search_runs < default.confirm_runs(2) < minimizer.noise.confirm_runs(2)
        result = minimizer.run()
    assert result.data == {"rows.jsonl": (2, 120)}
    minimal = load_manifest(store, result.bundle_id)
    assert minimal.parent == bundle and minimal.minimization is not None
    kept = store.get_bytes(minimal.data[0].blob.sha256).decode().splitlines()  # type: ignore[union-attr]
    assert kept == ['{"id": 37}', '{"id": 81}']
    assert result.replays >= result.oracle_calls


def test_minimizing_a_failure_that_never_reproduced_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    root.mkdir()
    store, bundle = _capture(root, "raise SystemExit(1)\n", rows=3)
    with (
        Replayer(
            store, load_manifest(store, bundle), ProcessSandbox(), context=ReplayContext.from_process()
        ) as replayer,
        pytest.raises(MinimizeError, match="never reproduced"),
    ):
        BundleMinimizer(store, replayer, bundle, 0, 20)


def _capture_data(root: Path, script: str, data: str) -> tuple[LocalStore, str]:
    (root / "job.py").write_text(script)
    store = LocalStore(root.parent / "store")
    request = CaptureRequest(
        argv=[sys.executable, "job.py"], cwd=root, limits=LIMITS, data=[Path(data)], echo=False
    )
    result = run_and_capture(store, request)
    assert result.bundle_id, result.process.stderr
    return store, result.bundle_id


def _minimize(store: LocalStore, bundle: str) -> tuple[dict[str, tuple[int, int]], str]:
    with Replayer(
        store, load_manifest(store, bundle), ProcessSandbox(), context=ReplayContext.from_process()
    ) as replayer:
        result = BundleMinimizer(store, replayer, bundle, 5, 5).run()
    return result.data, result.bundle_id


def test_npy_rows_are_minimized_along_the_first_axis(tmp_path: Path) -> None:
    import numpy as np

    root = tmp_path / "proj"
    root.mkdir()
    features = np.ones((64, 3), dtype=np.float32)
    features[41, 2] = np.nan
    np.save(root / "features.npy", features)
    script = (
        "import numpy as np\nx = np.load('features.npy')\nassert np.isfinite(x).all(), 'non-finite feature'\n"
    )
    store, bundle = _capture_data(root, script, "features.npy")
    data, minimal = _minimize(store, bundle)
    assert data == {"features.npy": (1, 64)}
    out = tmp_path / "min.npy"
    store.get_file(load_manifest(store, minimal).data[0].blob.sha256, out)  # type: ignore[union-attr]
    kept = np.load(out)
    assert kept.shape == (1, 3) and kept.dtype == np.float32 and np.isnan(kept[0, 2])


def test_directory_entries_are_minimized(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    (root / "shards").mkdir(parents=True)
    for i in range(30):
        (root / "shards" / f"part-{i:03d}.txt").write_text("corrupt" if i == 17 else f"ok {i}")
    script = (
        "import os\n"
        "for name in sorted(os.listdir('shards')):\n"
        "    if open(os.path.join('shards', name)).read() == 'corrupt':\n"
        "        raise ValueError('corrupt shard')\n"
    )
    store, bundle = _capture_data(root, script, "shards")
    data, minimal = _minimize(store, bundle)
    assert data == {"shards": (1, 30)}
    assert [f.path for f in load_manifest(store, minimal).data[0].files] == ["part-017.txt"]


class _Rows:
    """A replayer stand-in over `n` data rows: a candidate reproduces when it keeps every culprit
    and the next of `misses` (a scripted run of the failure not showing) is False."""

    def __init__(self, n: int, culprits: set[int], misses: Sequence[bool] = ()) -> None:
        self.manifest = SimpleNamespace(
            data=[SimpleNamespace(path="rows.csv", reducible=True, items=n)],
            command=SimpleNamespace(argv=("python", "job.py")),
        )
        self.culprits = culprits
        self.misses = list(misses)
        self.runs = 0

    def run(self, variant: Variant | None = None) -> SimpleNamespace:
        self.runs += 1
        holds = variant is None or variant.data is None or self.culprits <= set(variant.data["rows.csv"])
        shows = self.misses.pop(0) if holds and self.misses else True
        return SimpleNamespace(outcome=Outcome.REPRODUCED if holds and shows else Outcome.PASSED)


class _Kept(BundleMinimizer):
    """The real `run`, keeping the minimal rows instead of writing a bundle."""

    kept: list[int] | None = None

    def _write(
        self, subsets: dict[str, list[int]], argv: list[str], args: dict[str, tuple[str, str]]
    ) -> MinimizeResult:
        self.kept = list(subsets["rows.csv"])
        return MinimizeResult(bundle_id="kept", oracle_calls=self.oracle_calls, replays=self.replays)


def _reducer_alone(n: int, culprits: set[int]) -> int:
    reducer = SubsetReducer(lambda kept: culprits <= set(kept))
    reducer.reduce(range(n))
    return reducer.calls


@pytest.mark.parametrize(("culprits", "extra"), [({4321}, 0), ({17, 8000}, 2), ({5, 999, 5000, 9998}, 6)])
def test_a_deterministic_failure_costs_the_reducers_runs_and_a_few_checks(
    culprits: set[int], extra: int
) -> None:
    # 5 of 5 replays reproduced: the search trusts single runs, no whole-bundle top-up, and the
    # minimal bundle is not replayed again (the search's last run was exactly it). What is left
    # is two runs of each removal the search only inferred: none for one culprit, k - 1 for k.
    rows = _Rows(10_000, culprits)
    minimizer = _Kept(cast(Store, None), cast(Any, rows), "b", 5, 5)
    result = minimizer.run()
    assert minimizer.kept == sorted(culprits)
    assert rows.runs == result.replays == _reducer_alone(10_000, culprits) + extra


def test_a_flake_that_passed_as_deterministic_is_searched_again_once_a_check_catches_it() -> None:
    # One culprit; the first question (rows 0..4999, which hold it) misses, so the search keeps
    # row 5000 too. The check of [4321] alone reproduces: proof of flakiness, and the answer is
    # searched again with the careful budget, ending with the culprit alone.
    rows = _Rows(10_000, {4321}, misses=[False])
    minimizer = _Kept(cast(Store, None), cast(Any, rows), "b", 5, 5)
    minimizer.run()
    assert minimizer.kept == [4321]
    assert not minimizer.noise.trusted
